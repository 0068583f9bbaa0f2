"""Round trips and server CPU per checkpoint on PostgreSQL, one writer alone.

A checkpoint on PostgreSQL should cost one round trip (one statement, one implicit
transaction). This probe counts what the client sends per checkpoint - every psycopg
``execute``/``executemany``, every transaction block (a BEGIN and a COMMIT: two more round
trips) and every statement sent straight through libpq - and the CPU the server's backends
spent (``/proc/<pid>/stat`` of the connections this process opened, found by their
``application_name``), for:

- ``state``: ``Session.checkpoint`` of the state benchmark's workload (two new ~500 B
  messages per step, the whole list handed over);
- ``saver``: the LangGraph saver's ``put`` on stashpoint's PostgreSQL store (the ``langgraph``
  benchmark's direct puts), when LangGraph is installed;
- ``postgres-saver``: LangGraph's own ``PostgresSaver.put`` of the same state, as the peer.

    python bench/probe_pg_round_trips.py [N]     # N checkpoints per variant (default 300)

The server is ``STASHPOINT_BENCH_POSTGRES_URL`` (default: the tests' one); a fresh schema per
variant, dropped afterwards. The server must run on this machine (its backends' CPU is read
from /proc).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import pg_base, pg_schema
from workload import conversation

WARM = 20


@contextmanager
def counting() -> Iterator[Counter[str]]:
    """Count the client's round trips while the block runs (``Connection.execute`` runs a
    cursor's, counted there)."""
    import psycopg

    from stashpoint.stores.postgres import PostgresStore

    counts: Counter[str] = Counter()
    saved = (
        psycopg.Cursor.execute,
        psycopg.Cursor.executemany,
        psycopg.Connection.transaction,
        PostgresStore._libpq_call,
    )
    c_exec, c_many, tx, libpq = saved

    def cursor_execute(self: Any, *a: Any, **k: Any) -> Any:
        counts["execute"] += 1
        return c_exec(self, *a, **k)

    def cursor_many(self: Any, query: Any, params: Any, *a: Any, **k: Any) -> Any:
        params = list(params)
        counts["executemany (pipelined)"] += 1
        return c_many(self, query, params, *a, **k)

    def transaction(self: Any, *a: Any, **k: Any) -> Any:
        counts["BEGIN + COMMIT"] += 2
        return tx(self, *a, **k)

    def libpq_call(self: Any, *a: Any, **k: Any) -> Any:
        counts["libpq statement"] += 1
        return libpq(self, *a, **k)

    psycopg.Cursor.execute = cursor_execute  # type: ignore[method-assign]
    psycopg.Cursor.executemany = cursor_many  # type: ignore[method-assign]
    psycopg.Connection.transaction = transaction  # type: ignore[method-assign]
    PostgresStore._libpq_call = libpq_call  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        (
            psycopg.Cursor.execute,
            psycopg.Cursor.executemany,
            psycopg.Connection.transaction,
            PostgresStore._libpq_call,
        ) = saved


def _backend_cpu(app: str) -> float:
    """CPU seconds (user + system) of the server backends named ``app``."""
    import psycopg

    with psycopg.connect(pg_base(), autocommit=True) as conn:
        pids = [
            int(r[0])
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)
            )
        ]
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def measure(n: int, app: str, step: Callable[[int], Any]) -> dict[str, float]:
    for i in range(WARM):
        step(i)
    cpu0 = _backend_cpu(app)
    with counting() as counts:
        for i in range(WARM, WARM + n):
            step(i)
    out = {k: v / n for k, v in counts.items()}
    out["round trips"] = sum(out.values())
    out["server CPU ms"] = (_backend_cpu(app) - cpu0) / n * 1e3
    return out


def state_variant(n: int) -> dict[str, float]:
    import stashpoint

    conv = conversation(WARM + n)
    app = f"probe-{uuid.uuid4().hex[:8]}"
    with pg_schema(pg_base(), "rt") as url, stashpoint.open(f"{url}&application_name={app}") as s:
        run = s.session("conv")
        msgs: list[Any] = []

        def step(i: int) -> None:
            msgs.extend(conv[i])
            run.checkpoint({"messages": msgs})

        return measure(n, app, step)


def saver_variant(n: int) -> dict[str, float] | None:
    try:
        import bench_langgraph
    except ImportError:
        return None
    import stashpoint

    conv = conversation(WARM + n)
    app = f"probe-{uuid.uuid4().hex[:8]}"
    with pg_schema(pg_base(), "rtlg") as url:
        saver = bench_langgraph.StashpointSaver(stashpoint.open(f"{url}&application_name={app}"))
        cpu0 = 0.0
        try:
            bench_langgraph._puts(saver, conv[:WARM], None)
            cpu0 = _backend_cpu(app)
            with counting() as counts:
                bench_langgraph._puts(saver, conv[WARM:], None)
            out = {k: v / n for k, v in counts.items()}
            out["round trips"] = sum(out.values())
            out["server CPU ms"] = (_backend_cpu(app) - cpu0) / n * 1e3
            return out
        finally:
            saver.close()


def postgres_saver_variant(n: int) -> dict[str, float] | None:
    try:
        from langgraph.checkpoint.postgres import PostgresSaver

        from bench_scale import lg_put_args
    except ImportError:
        return None
    conv = conversation(WARM + n)
    app = f"probe-{uuid.uuid4().hex[:8]}"
    with (
        pg_schema(pg_base(), "rtpg") as url,
        PostgresSaver.from_conn_string(f"{url}&application_name={app}") as saver,
    ):
        saver.setup()
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        version: Any = None

        def step(i: int) -> None:
            nonlocal config, version
            version = saver.get_next_version(version, None)
            config = saver.put(config, *lg_put_args(i, version, conv[i][0]))

        return measure(n, app, step)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    variants = {
        "state": state_variant,
        "saver": saver_variant,
        "postgres-saver": postgres_saver_variant,
    }
    for name, fn in variants.items():
        got = fn(n)
        if got is None:
            print(f"{name}: skipped (LangGraph not installed)")
            continue
        parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(got.items()))
        print(f"{name}: per checkpoint: {parts}")


if __name__ == "__main__":
    main()
