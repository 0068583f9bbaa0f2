"""What each durability level costs per state checkpoint, on SQLite and PostgreSQL.

The workload of ``bench_state``: a conversation growing by 2 messages (~500 B each) per step,
one state checkpoint per step, one session. For each backend and level: the median and p99
latency of ``checkpoint()``, and the throughput over the whole run *including* the final
flush, so a level cannot look fast by leaving its work undone. The ratio compares each level
with ``fsync`` on the same backend (the peer of this table is our own default: SPEC sets no
bar for the levels, only that each is respected and priced).

At ``fsync``, SQLite runs ``synchronous=FULL`` (one WAL fsync per commit) and PostgreSQL
commits synchronously; ``group`` (64 checkpoints or 100 ms) and ``exit`` commit with
``synchronous=NORMAL`` / ``synchronous_commit=off`` and flush on their schedule. The bare
floor of each backend (one 1 KB row per transaction at the same setting) is printed beside
them for context.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import stashpoint
from _common import Config, Floor, median, pg_base, pg_schema, row
from workload import conversation

LEVELS = ("fsync", "group", "exit")


def _run_level(url: str, level: str, convo: list[list[dict[str, Any]]]) -> dict[str, Any]:
    store = stashpoint.open(url, durability=level)
    try:
        run = store.session("bench")
        msgs: list[dict[str, Any]] = []
        times = []
        t_start = time.perf_counter()
        for i, pair in enumerate(convo):
            msgs = [*msgs, *pair]
            t0 = time.perf_counter()
            run.checkpoint({"messages": msgs, "step": i})
            times.append(time.perf_counter() - t0)
        store.flush()  # the run is not over until everything is durable
        total = time.perf_counter() - t_start
        flushes = store.group.flushes
        assert run.state()["step"] == len(convo) - 1
    finally:
        store.close()
    return {"times": times, "total": total, "flushes": flushes}


def _p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] if len(xs) >= 100 else max(xs)


def _sqlite_floor(path: Path, synchronous: str, n: int) -> float:
    floor = Floor(path, synchronous)
    try:
        return median(floor.samples(n))
    finally:
        floor.close()


def _pg_floor(url: str, sync: bool, n: int) -> float:
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        db.execute("CREATE TABLE IF NOT EXISTS floor_t(id bigserial PRIMARY KEY, v bytea)")
        db.execute(f"SET synchronous_commit = {'on' if sync else 'off'}")
        payload = b"x" * 1024
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            db.execute("INSERT INTO floor_t(v) VALUES (%s)", (payload,))
            times.append(time.perf_counter() - t0)
    return median(times)


def _rows(
    backend: str, results: dict[str, dict[str, Any]], floors: dict[str, float]
) -> list[dict[str, Any]]:
    out = []
    base = results["fsync"]
    for level in LEVELS:
        res = results[level]
        out.append(
            row(
                f"{backend}, {level}: latency (p99 {_p99(res['times']) * 1000:.2f} ms)",
                median(res["times"]) * 1000,
                "ms",
                peer=median(base["times"]) * 1000,
                peer_name=f"{backend} fsync",
                samples=[t * 1000 for t in res["times"]],
            )
        )
    for level in LEVELS:
        res = results[level]
        per_s = len(res["times"]) / res["total"]
        out.append(
            row(
                f"{backend}, {level}: checkpoints/s incl. flush ({res['flushes']} flushes)",
                per_s,
                "/s",
                peer=len(base["times"]) / base["total"],
                peer_name=f"{backend} fsync",
            )
        )
    for name, value in floors.items():
        out.append(row(f"{backend} floor: 1 KB row per commit, {name}", value * 1000, "ms"))
    return out


def run(cfg: Config) -> dict[str, Any]:
    steps = min(cfg.steps, 1000)
    convo = conversation(steps)
    tmp = Path(tempfile.mkdtemp(prefix="sp-bench-durability-", dir=cfg.tmp))
    rows: list[dict[str, Any]] = []
    notes = [
        f"{steps} state checkpoints of a conversation growing by 2 x ~500 B messages per step; "
        "ratio = latency / the same backend at fsync; group = every 64 checkpoints or 100 ms",
        "throughput counts the final flush; a killed process loses nothing at any level, a "
        "power loss loses at most the unflushed checkpoints (whole ones, newest first)",
    ]
    try:
        sq = {level: _run_level(str(tmp / f"sqlite-{level}"), level, convo) for level in LEVELS}
        floors = {
            "synchronous=FULL": _sqlite_floor(tmp / "floor-full.db", "FULL", 300),
            "synchronous=NORMAL": _sqlite_floor(tmp / "floor-normal.db", "NORMAL", 300),
        }
        rows += _rows("SQLite", sq, floors)
        try:
            import psycopg

            psycopg.connect(pg_base(), connect_timeout=3).close()
            pg_ok = True
        except Exception as exc:  # no driver or no server: the rows are skipped, and said so
            notes.append(f"no PostgreSQL at {pg_base()} ({exc}): its rows are skipped")
            pg_ok = False
        if pg_ok:
            pg: dict[str, dict[str, Any]] = {}
            for level in LEVELS:
                with pg_schema(pg_base(), "dur") as url:
                    pg[level] = _run_level(url, level, convo)
            with pg_schema(pg_base(), "floor") as url:
                pg_floors = {
                    "synchronous_commit=on": _pg_floor(url, True, 300),
                    "synchronous_commit=off": _pg_floor(url, False, 300),
                }
            rows += _rows("PostgreSQL", pg, pg_floors)
    finally:
        if not cfg.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"name": "durability", "rows": rows, "notes": notes, "env": {"python": sys.version[:6]}}
