"""End-to-end checks every shared-store backend runs (PostgreSQL, Redis): the engine on top of
the store, not just the store's rows."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import stashpoint
from stashpoint.verify import verify_store

from .conftest import snapshot_tree


def check_rewind_round_trip(url: str, tmp_path: Path) -> None:
    """Checkpoint, change, rewind: files byte-identical, state back, store verifies."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one")
    (ws / "big.bin").write_bytes(os.urandom(2 * 1024 * 1024 + 5))  # chunks live in the store too
    one = [{"role": "user", "content": "hi"}]
    with stashpoint.open(url) as store:
        run = store.session("s", workspace=ws)
        before = snapshot_tree(ws)
        cp = run.checkpoint({"messages": one, "plan": [1, 2]})
        (ws / "a.txt").write_text("two")
        (ws / "big.bin").unlink()
        run.checkpoint({"messages": [*one, {"role": "ai", "content": "yo"}]})
        run.rewind(cp.id)
        assert snapshot_tree(ws) == before
        assert run.state() == {"messages": one, "plan": [1, 2]}
        assert verify_store(store).ok


def _writer(url: str, n: int) -> None:
    with stashpoint.open(url) as store:
        run = store.session("shared")
        for i in range(n):
            run.checkpoint({"messages": [{"pid": os.getpid(), "i": i}], "i": i})


def check_concurrent_writers(url: str, procs: int = 4, per: int = 20) -> None:
    """N processes on one session: no checkpoint lost or duplicated, one linear chain."""
    stashpoint.open(url).close()  # create the schema once, before the race
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_writer, args=(url, per)) for _ in range(procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(180)
        assert w.exitcode == 0
    with stashpoint.open(url) as store:
        history = store.session("shared").history()
    assert len(history) == procs * per
    parents = [c.parent for c in history if c.parent]
    assert len(parents) == len(set(parents)) == procs * per - 1
