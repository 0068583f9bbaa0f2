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


class _Crash(BaseException):
    pass


def check_durable_run_resumes(url: str) -> None:
    """A durable run journals into the shared store: after a crash a new process-like session
    replays recorded steps, asks for approval, and the ledger holds each effect once."""
    ran: list[str] = []

    def program(run: stashpoint.Session, crash: bool) -> object:
        @run.step(name="fetch")
        def fetch(i: int) -> int:
            ran.append(f"fetch{i}")
            if crash and i == 2:
                raise _Crash
            return i * 10

        @run.tool(name="pay", irreversible=True, approval=True)
        def pay(total: int) -> str:
            ran.append("pay")
            return f"paid {total}"

        def main() -> str:
            run.plan(["fetch", "pay"])
            with run.task("fetch"):
                total = sum(fetch(i) for i in range(3))
            with run.task("pay"):
                return str(pay(total))

        return main

    with stashpoint.open(url) as store:
        first = store.session("durable")
        try:
            first.run(program(first, True))
        except _Crash:
            pass
        second = store.session("durable")
        assert second.run(program(second, False)).status == "awaiting_approval"
        store.session("durable").approve(reason="backend check")
        third = store.session("durable")
        assert third.run(program(third, False)).value == "paid 30"
        assert ran == ["fetch0", "fetch1", "fetch2", "fetch2", "pay"]
        assert [t.status for t in third.tasks()] == ["completed", "completed"]
        assert [e.tool for e in third.effects()] == ["pay"]
        assert verify_store(store).ok
