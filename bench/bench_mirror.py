"""What the plain-file store and mirrored writes cost per state checkpoint.

The workload of ``bench_state``: a conversation growing by 2 messages (~500 B each) per step,
one state checkpoint per step, every store at its default durability (fsync per checkpoint).
Rows: the default SQLite store (the reference), the ``file://`` store, and SQLite mirrored to
another SQLite store, to a ``file://`` store and (when the server is there) to PostgreSQL.
No bar: SPEC sets none for these; the ratio to plain SQLite is the price of the feature.
Afterwards every mirror is compared with its primary (untimed), so a fast copy that lost
something cannot pass unnoticed.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import stashpoint
from _common import Config, median, pg_base, pg_schema, row
from stashpoint.mirror import MirroredStore, compare_stores
from workload import conversation


@contextmanager
def _pg_schema() -> Iterator[str | None]:
    """A fresh schema on the local server, or None when there is none (the row is skipped)."""
    try:
        import psycopg

        psycopg.connect(pg_base(), connect_timeout=3).close()
    except Exception:  # no driver or no server: skip that row
        yield None
        return
    with pg_schema(pg_base(), "mirror") as url:
        yield url


def _steps(store: stashpoint.Store, convo: list[list[dict[str, Any]]]) -> list[float]:
    run = store.session("bench")
    msgs: list[dict[str, Any]] = []
    times = []
    for i, pair in enumerate(convo):
        msgs = [*msgs, *pair]
        t0 = time.perf_counter()
        run.checkpoint({"messages": msgs, "step": i})
        times.append(time.perf_counter() - t0)
    return times


def run(cfg: Config) -> dict[str, Any]:
    steps = min(cfg.steps, 300)
    convo = conversation(steps)
    tmp = Path(tempfile.mkdtemp(prefix="sp-bench-mirror-", dir=cfg.tmp))
    rows: list[dict[str, Any]] = []
    notes = [f"{steps} steps, 2 messages of ~500 B each per step; fsync per checkpoint"]
    try:
        with _pg_schema() as pg:
            setups: list[tuple[str, str, str | None]] = [
                ("SQLite (default)", str(tmp / "sqlite"), None),
                ("file:// store", f"file://{tmp / 'files'}", None),
                ("SQLite mirrored to SQLite", str(tmp / "p1"), str(tmp / "m1")),
                ("SQLite mirrored to file://", str(tmp / "p2"), f"file://{tmp / 'm2'}"),
            ]
            if pg is not None:
                setups.append(("SQLite mirrored to PostgreSQL", str(tmp / "p3"), pg))
            else:
                notes.append(f"no PostgreSQL at {pg_base()}: its row is skipped")
            base: float | None = None
            for label, url, mirror in setups:
                with stashpoint.open(url, mirror=mirror) as store:
                    times = _steps(store, convo)
                    if isinstance(store, MirroredStore) and store.mirror is not None:
                        report = compare_stores(store, store.mirror)
                        if not report.ok or report.behind:
                            notes.append(f"{label}: mirror NOT in sync: {report.to_dict()}")
                ms = median(times) * 1000
                base = ms if base is None else base
                rows.append(
                    row(
                        f"checkpoint per step, {label}",
                        ms,
                        "ms",
                        peer=base,
                        peer_name="SQLite (default)",
                        samples=[t * 1000 for t in times],
                    )
                )
    finally:
        if not cfg.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"name": "mirror", "rows": rows, "notes": notes, "env": {"python": sys.version[:6]}}
