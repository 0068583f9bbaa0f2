"""One PostgreSQL writer alone: client and server CPU per checkpoint, beside LangGraph's put.

The scale race (``bench_scale.py``) is CPU-bound on this machine's 2 cores, so its throughput
follows the client + server CPU each checkpoint costs. This probe measures that split without
the race's contention: one process, the scale workload (4 files, one rewritten before each
checkpoint, one new ~500 B message), the CPU of this process (``time.process_time``) and of
its server backends (``/proc/<pid>/stat``), for

- ``default``: stashpoint's PostgreSQL store as shipped;
- ``unprepared``: the same with ``?prepare=false`` (the hot path parsed and planned each call);
- ``no-files``: the same state checkpoints without a workspace;
- ``langgraph``: LangGraph's ``PostgresSaver.put`` of the same state, as the race's peer.

    python bench/probe_cpu_split.py [N]     # N checkpoints per variant (default 2000), twice
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import pg_base, pg_schema
from bench_scale import _messages, lg_put_args, lone_worker


def _backend_cpu(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def _backends() -> list[int]:
    import psycopg

    with psycopg.connect(pg_base(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
    return [int(r[0]) for r in rows]


def _measure(n: int, step: Callable[[int], Any]) -> tuple[float, float, float]:
    """(wall, client CPU, server CPU) in ms per call of ``step(1..n)``."""
    pids = _backends()
    s0, c0, w0 = _backend_cpu(pids), time.process_time(), time.perf_counter()
    for i in range(1, n + 1):
        step(i)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return wall / n * 1e3, cpu / n * 1e3, (_backend_cpu(pids) - s0) / n * 1e3


def stashpoint_variant(
    n: int, query: str, files: bool, watch: bool = False
) -> tuple[float, float, float]:
    with lone_worker("cpu", n, query=query, files=files, watch=watch) as (run, prepare):
        return _measure(n, lambda i: run.checkpoint(prepare(i)))


def langgraph_variant(n: int) -> tuple[float, float, float]:
    from langgraph.checkpoint.postgres import PostgresSaver

    msgs = _messages(n + 1, 0)
    with pg_schema(pg_base(), "cpulg") as url, PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        version: Any = None

        def step(i: int) -> None:
            nonlocal config, version
            version = saver.get_next_version(version, None)
            config = saver.put(config, *lg_put_args(i, version, msgs[i]))

        step(0)
        return _measure(n, step)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    variants: dict[str, Callable[[], tuple[float, float, float]]] = {
        "default": lambda: stashpoint_variant(n, "", True),
        "unprepared": lambda: stashpoint_variant(n, "&prepare=false", True),
        "watch": lambda: stashpoint_variant(n, "", True, watch=True),
        "no-files": lambda: stashpoint_variant(n, "", False),
        "langgraph": lambda: langgraph_variant(n),
    }
    print(f"{n} checkpoints per variant, one process, ms per checkpoint")
    print(f"{'variant':<12} {'wall':>7} {'client':>7} {'server':>7} {'total':>7}")
    for _round in range(2):  # alternating rounds: the machine drifts
        for name, fn in variants.items():
            wall, client, server = fn()
            total = client + server
            print(f"{name:<12} {wall:7.3f} {client:7.3f} {server:7.3f} {total:7.3f}")


if __name__ == "__main__":
    main()
