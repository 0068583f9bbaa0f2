"""Engine-level conformance: what every store URL must do under the session engine.

:class:`~stashpoint.testing.conformance.MetadataStoreConformance` checks a backend's rows; this
suite checks what users see on top of them - rewind round trips with real files, integrity
(tampered, forged and replayed records caught on read), large and unicode state, history
pagination, N processes writing one session, durable runs, and leases with fencing. Subclass it
with a ``store_url`` fixture returning the URL of a fresh, empty store::

    class TestMyBackend(EngineConformance):
        @pytest.fixture
        def store_url(self, tmp_path):
            return "mybackend://..."

Set ``multiprocess = False`` for a store that lives in one process (``memory://``).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from .. import opening as _store
from ..errors import IntegrityError, LeaseHeld, LeaseLost
from ..session import Session
from ..stores.base import CheckpointRow, Commit
from ..verify import verify_store

__all__ = ["EngineConformance", "tree_of"]


def tree_of(root: Path) -> dict[str, tuple[str, int, bytes]]:
    """Everything under ``root`` but the store (a ``.stashpoint`` directory or link file):
    path -> (type, mode, content or link target)."""
    out: dict[str, tuple[str, int, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".stashpoint")
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            st = p.lstat()
            if p.is_symlink():
                out[rel] = ("l", 0, os.readlink(p).encode())
            elif p.is_dir():
                out[rel] = ("d", st.st_mode & 0o7777, b"")
            elif name != ".stashpoint":
                out[rel] = ("f", st.st_mode & 0o7777, p.read_bytes())
    return out


def _writer(url: str, n: int) -> None:
    with _store.open_store(url) as store:
        run = store.session("shared")
        for i in range(n):
            run.checkpoint({"messages": [{"pid": os.getpid(), "i": i}], "i": i})


class _Crash(BaseException):
    pass


class EngineConformance:
    multiprocess = True
    """Whether other processes can open the same URL (not ``memory://``)."""
    writers = 4
    per_writer = 20

    def test_rewind_round_trip(self, store_url: str, tmp_path: Path) -> None:
        ws = tmp_path / "ws"
        ws.mkdir()
        (ws / "a.txt").write_text("one")
        (ws / "big.bin").write_bytes(os.urandom(2 * 1024 * 1024 + 5))  # chunked
        os.symlink("a.txt", ws / "link")
        one = [{"role": "user", "content": "hi"}]
        with _store.open_store(store_url) as store:
            run = store.session("s", workspace=ws)
            before = tree_of(ws)
            cp = run.checkpoint({"messages": one, "plan": [1, 2]})
            (ws / "a.txt").write_text("two")
            (ws / "big.bin").unlink()
            run.checkpoint({"messages": [*one, {"role": "ai", "content": "yo"}]})
            run.rewind(cp.id)
            assert tree_of(ws) == before
            assert run.state() == {"messages": one, "plan": [1, 2]}
            assert verify_store(store).ok

    def test_large_and_unicode_state(self, store_url: str) -> None:
        big = "ü€😀" * 300_000  # ~3 MB of UTF-8
        state = {"日本語": big, "nested": {"ключ": ["\u0000x", "\ud7ff", 2**62]}}
        with _store.open_store(store_url) as store:
            run = store.session("ünïcode ✓")
            cp = run.checkpoint(state, message="メッセージ")
            again = _store.open_store(store_url) if self.multiprocess else store
            try:
                other = again.session("ünïcode ✓")
                assert other.state(cp.id) == state
                assert other.get(cp.id).message == "メッセージ"
            finally:
                if again is not store:
                    again.close()

    def test_history_pagination(self, store_url: str) -> None:
        with _store.open_store(store_url) as store:
            run = store.session("s")
            ids = [run.checkpoint({"i": i}).id for i in range(12)]
            assert [c.id for c in run.history()] == ids[::-1]
            assert [c.id for c in run.history(limit=5)] == ids[::-1][:5]
            rows = store.meta.list_checkpoints("s", before=ids[5], limit=3)
            assert [r.id for r in rows] == [ids[4], ids[3], ids[2]]

    def test_tampered_forged_and_replayed_records_are_caught(self, store_url: str) -> None:
        with _store.open_store(store_url) as store:
            run = store.session("a")
            first = run.checkpoint({"i": 1})
            second = run.checkpoint({"i": 2})
            row = store.meta.get_checkpoint(second.id)
            assert row is not None
            # An edited body under a new id: its digest no longer matches.
            body = row.body.replace(b'"i"', b'"j"') if b'"i"' in row.body else row.body + b" "
            bad = CheckpointRow(
                "0" * 25 + "1", row.session, row.branch, row.parent, body, row.digest
            )
            store.meta.commit(Commit(bad, None, move_head=False))
            with pytest.raises(IntegrityError):
                store.get(bad.id)
            # A record re-hashed by a forger but linked to a parent digest that is not there.
            sealed, fbody = store.hasher.seal(
                msgspec.structs.replace(
                    second,
                    id="0" * 25 + "2",
                    parent=first.id,
                    parent_digest=hashlib.sha256(b"forged").hexdigest(),
                    digest="",
                )
            )
            store.meta.commit(
                Commit(
                    CheckpointRow(sealed.id, "a", "main", first.id, fbody, sealed.digest),
                    None,
                    move_head=False,
                )
            )
            with pytest.raises(IntegrityError, match="altered"):
                store.get(sealed.id)
            # A record of session "a" replayed as session "b": the index disagrees.
            replay = CheckpointRow("0" * 25 + "3", "b", row.branch, None, row.body, row.digest)
            store.meta.commit(Commit(replay, None, move_head=False))
            with pytest.raises(IntegrityError):
                store.get(replay.id)
            assert not verify_store(store).ok

    def test_writers_in_many_processes_lose_nothing(self, store_url: str) -> None:
        if not self.multiprocess:
            pytest.skip("this store lives in one process")
        _store.open_store(store_url).close()  # create the schema once, before the race
        ctx = multiprocessing.get_context("spawn")
        procs = [
            ctx.Process(target=_writer, args=(store_url, self.per_writer))
            for _ in range(self.writers)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
            assert p.exitcode == 0
        with _store.open_store(store_url) as store:
            history = store.session("shared").history()
            assert verify_store(store).ok
        assert len(history) == len({c.id for c in history}) == self.writers * self.per_writer
        parents = [c.parent for c in history if c.parent]
        assert len(parents) == len(set(parents)) == len(history) - 1

    def test_durable_run_resumes(self, store_url: str) -> None:
        ran: list[str] = []

        def program(run: Session, crash: bool) -> Any:
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

        with _store.open_store(store_url) as store:
            first = store.session("durable")
            try:
                first.run(program(first, True))
            except _Crash:
                pass
            second = store.session("durable")
            assert second.run(program(second, False)).status == "awaiting_approval"
            store.session("durable").approve(reason="conformance")
            third = store.session("durable")
            assert third.run(program(third, False)).value == "paid 30"
            assert ran == ["fetch0", "fetch1", "fetch2", "fetch2", "pay"]
            assert [t.status for t in third.tasks()] == ["completed", "completed"]
            assert [e.tool for e in third.effects()] == ["pay"]
            assert verify_store(store).ok

    def test_lease_takeover_fences_the_stalled_worker(self, store_url: str) -> None:
        from ..lease import acquire

        with _store.open_store(store_url) as store:
            stalled = acquire(store.meta, "job", ttl=2, owner="stalled", renew=False)
            run_a = store.session("job", lease=stalled)
            first = run_a.checkpoint({"by": "a"})
            with pytest.raises(LeaseHeld):
                store.session("job").checkpoint({"by": "stray"})
            while (info := store.meta.lease_info("job")) is not None and info.expires_in > 0:
                time.sleep(0.05)
            with store.session("job", lease=10) as run_b:
                with pytest.raises(LeaseLost):
                    run_a.checkpoint({"by": "a, too late"})
                second = run_b.checkpoint({"by": "b"})
            assert second.parent == first.id
            assert [c.id for c in store.session("job").history()] == [second.id, first.id]

    def test_store_operations_for_integrations(self, store_url: str) -> None:
        """What the integrations use instead of the backend: branches, starting a branch
        (fenced like a session's head moves), verified records, pruning and a session's
        application value."""
        from ..errors import ConflictError
        from ..metakeys import LANGGRAPH_PENDING

        with _store.open_store(store_url) as store:
            run = store.session("ops")
            one = run.checkpoint({"n": 1})
            two = run.checkpoint({"n": 2})
            assert store.branches("ops") == {"main": two.id}
            store.start_branch("ops", "side", one.id)
            assert store.branches("ops") == {"main": two.id, "side": one.id}
            with pytest.raises(ConflictError):
                store.start_branch("ops", "side", two.id)  # a branch that exists
            assert [c.id for c in store.records("ops")] == store.record_ids("ops")
            assert store.record_ids("ops") == [two.id, one.id]
            assert store.prune("ops", [one.id, two.id]) == []  # both are heads
            store.session("ops", branch="side").checkpoint({"n": 3})
            assert store.prune("ops", [one.id]) == [one.id]
            assert set(store.pruned("ops")) == {one.id}
            assert store.session_value("ops", LANGGRAPH_PENDING) is None
            store.set_session_value("ops", LANGGRAPH_PENDING, '{"w": []}')
            assert store.session_value("ops", LANGGRAPH_PENDING) == '{"w": []}'
            assert store.session_value("other", LANGGRAPH_PENDING) is None
            store.set_session_value("ops", LANGGRAPH_PENDING, None)
            assert store.session_value("ops", LANGGRAPH_PENDING) is None
            assert store.swap_session_value("ops", LANGGRAPH_PENDING, None, "a") is True
            assert store.swap_session_value("ops", LANGGRAPH_PENDING, None, "b") is False
            assert store.swap_session_value("ops", LANGGRAPH_PENDING, "a", "b") is True
            assert store.session_value("ops", LANGGRAPH_PENDING) == "b"
            assert store.swap_session_value("ops", LANGGRAPH_PENDING, "b", None) is True
            assert store.session_value("ops", LANGGRAPH_PENDING) is None
            with store.lease("ops", ttl=30, owner="holder") as lease:
                with pytest.raises(LeaseHeld):  # an unfenced head move waits for the lease
                    store.start_branch("ops", "stray", two.id)
                store.start_branch("ops", "fenced", two.id, fence=lease.fence)
            assert store.branches("ops")["fenced"] == two.id
