"""Conformance suite for :class:`stashpoint.stores.base.MetadataStore` backends, in tiers.

The core tier (:class:`CoreConformance`: meta, blob rows, logs, records, refs) is for every
backend; :class:`LeaseConformance`, :class:`CollectionConformance` and
:class:`RetentionConformance` check an optional capability and run only when the backend
declares it in ``capabilities`` (:class:`~stashpoint.stores.base.Capability`), as a backend
without leases or GC still passes what it claims. Subclass :class:`MetadataStoreConformance`
(every tier) in a pytest module and provide a ``make_store`` fixture that returns a fresh,
empty store; every backend runs the same assertions::

    class TestMyStore(MetadataStoreConformance):
        @pytest.fixture
        def make_store(self, tmp_path):
            return lambda: MyStore(...)
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ..errors import ConflictError, IntegrityError, LeaseHeld, LeaseLost, PackMissing
from ..stores.base import (
    BlobInfo,
    BlobRow,
    Capability,
    CheckpointRow,
    Commit,
    Fence,
    GcEpochChanged,
    LogAppend,
    LogInfo,
    MetadataStore,
)

__all__ = [
    "BlobBackendConformance",
    "CollectionConformance",
    "CoreConformance",
    "LeaseConformance",
    "MetadataStoreConformance",
    "RetentionConformance",
]


def _row(
    ident: str, parent: str | None = None, session: str = "s", branch: str = "main"
) -> CheckpointRow:
    body = f"body-{ident}".encode()
    return CheckpointRow(ident, session, branch, parent, body, hashlib.sha256(body).hexdigest())


def _blob(data: bytes) -> BlobRow:
    return BlobRow(hashlib.sha256(data).digest(), 0, len(data), data)


_NEEDS = "_stashpoint_capability"

_C = TypeVar("_C", bound=type)


def _tier(capability: Capability) -> Callable[[_C], _C]:
    """Mark every test of a tier class with the capability it needs: on the functions, not
    the class, so that the composite suite still knows each test's tier."""

    def mark(cls: _C) -> _C:
        for name, fn in vars(cls).items():
            if name.startswith("test_"):
                setattr(fn, _NEEDS, capability)
        return cls

    return mark


class _Tier:
    """A tier's tests; those of an optional capability are skipped unless the backend
    declares it (``capabilities``)."""

    @pytest.fixture
    def ms(self, make_store: Callable[[], MetadataStore], request: Any) -> Any:
        store = make_store()
        needs: Capability | None = getattr(request.function, _NEEDS, None)
        if needs is not None and needs not in store.capabilities:
            store.close()
            pytest.skip(f"the backend does not declare {needs.value}")
        yield store
        store.close()


class CoreConformance(_Tier):
    """Meta key-value, blob rows, logs, checkpoint records, refs: every backend."""

    def test_meta_set_get_delete(self, ms: MetadataStore) -> None:
        assert ms.get_meta("k") is None
        ms.set_meta("k", "v")
        ms.set_meta("k", "w")
        assert ms.get_meta("k") == "w"
        ms.set_meta("k", None)
        assert ms.get_meta("k") is None

    def test_meta_swap_sets_only_over_the_expected_value(self, ms: MetadataStore) -> None:
        assert ms.swap_meta("k", "v", "w") is False  # nothing there to be "v"
        assert ms.get_meta("k") is None
        assert ms.swap_meta("k", None, "v") is True  # None expected: only while absent
        assert ms.swap_meta("k", None, "w") is False
        assert ms.swap_meta("k", "x", "w") is False
        assert ms.swap_meta("k", "", "w") is False  # an empty value is a value
        assert ms.swap_meta("k", "vv", "w") is False  # compared whole, not as a prefix
        assert ms.get_meta("k") == "v"
        assert ms.swap_meta("k", "v", "w") is True
        assert ms.get_meta("k") == "w"
        assert ms.swap_meta("k", "v", None) is False
        assert ms.get_meta("k") == "w"
        assert ms.swap_meta("k", "w", None) is True  # None set: deleted
        assert ms.get_meta("k") is None
        assert ms.swap_meta("k", None, None) is True  # absent, as expected, and stays so
        assert ms.swap_meta("e", None, "") is True
        assert ms.get_meta("e") == ""
        assert ms.swap_meta("e", None, "x") is False  # there, though empty
        assert ms.swap_meta("e", None, None) is False
        assert ms.swap_meta("e", "", "ünï ☃") is True
        assert ms.get_meta("e") == "ünï ☃"

    def test_meta_swaps_from_threads_lose_no_change(self, ms: MetadataStore) -> None:
        """Each thread reads, adds one and swaps, again when its swap fails: every one of
        the increments must land, as a set after a read would lose those made between."""

        def bump(times: int) -> None:
            for _ in range(times):
                while True:
                    now = ms.get_meta("n")
                    if ms.swap_meta("n", now, str(int(now or 0) + 1)):
                        break

        threads = [threading.Thread(target=bump, args=(10,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert ms.get_meta("n") == "40"

    def test_blobs_are_idempotent_and_found(self, ms: MetadataStore) -> None:
        a, b = _blob(b"a" * 100), _blob("ünïcode".encode())
        ms.put_blobs([a, b])
        ms.put_blobs([a])
        assert ms.get_blob(a.digest) == a
        assert ms.get_blob(b.digest) == b
        assert ms.get_blob(hashlib.sha256(b"x").digest()) is None
        missing = hashlib.sha256(b"missing").digest()
        assert ms.has_blobs([a.digest, missing]) == {a.digest}
        assert set(ms.iter_blob_digests()) == {a.digest, b.digest}

    def test_large_blob_round_trip(self, ms: MetadataStore) -> None:
        big = _blob(bytes(range(256)) * 8192)  # 2 MiB
        ms.put_blobs([big])
        assert ms.get_blob(big.digest) == big

    def test_many_blobs_has_in_batches(self, ms: MetadataStore) -> None:
        rows = [_blob(str(i).encode()) for i in range(1200)]
        ms.put_blobs(rows)
        assert ms.has_blobs(r.digest for r in rows) == {r.digest for r in rows}

    def test_commit_and_read_back(self, ms: MetadataStore) -> None:
        r1 = _row("01A")
        ms.commit(Commit(r1, None, blobs=[_blob(b"v")]))
        assert ms.get_checkpoint("01A") == r1
        assert ms.get_head("s", "main") == "01A"
        assert ms.branches("s") == {"main": "01A"}
        assert ms.sessions() == ["s"]
        assert ms.get_blob(_blob(b"v").digest) is not None

    def test_deferred_commits_are_atomic_visible_and_flushed(
        self, ms: MetadataStore, make_store: Callable[[], MetadataStore]
    ) -> None:
        """A commit that may return before it is on disk (a deferred durability level) keeps
        every other guarantee: visible at once, compare-and-set, readable by a second
        connection; ``flush`` then makes it durable (a backend that cannot defer ignores it)."""
        ms.commit(Commit(_row("01A"), None, blobs=[_blob(b"d")], durable=False))
        ms.commit(Commit(_row("01B", "01A"), "01A", durable=False))
        with pytest.raises(ConflictError):
            ms.commit(Commit(_row("01C", "01A"), "01A", durable=False))
        assert ms.get_checkpoint("01C") is None
        ms.set_meta("conformance:shared", "yes")
        ms.flush()
        other = make_store()
        try:
            if other.get_meta("conformance:shared") is None:
                return  # make_store opens a new, separate store (memory): nothing to share
            assert other.get_head("s", "main") == "01B"
            assert other.get_blob(_blob(b"d").digest) is not None
            other.flush()  # nothing pending there: a no-op
        finally:
            other.close()
        ms.commit(Commit(_row("01D", "01B"), "01B"))  # back to a durable commit
        assert ms.get_head("s", "main") == "01D"

    def test_head_compare_and_set(self, ms: MetadataStore) -> None:
        ms.commit(Commit(_row("01A"), None))
        ms.commit(Commit(_row("01B", "01A"), "01A"))
        with pytest.raises(ConflictError):
            ms.commit(Commit(_row("01C", "01A"), "01A"))
        assert ms.get_checkpoint("01C") is None, "a failed commit must write nothing"
        with pytest.raises(ConflictError):
            ms.set_head("s", "main", "01A", expected="01X")
        ms.set_head("s", "main", "01A", expected="01B")
        assert ms.get_head("s", "main") == "01A"
        ms.set_head("s", "other", "01B", expected=None)
        assert ms.branches("s") == {"main": "01A", "other": "01B"}

    def test_commit_without_moving_head(self, ms: MetadataStore) -> None:
        ms.commit(Commit(_row("01A"), None))
        ms.commit(Commit(_row("01B", "01A"), None, move_head=False))
        assert ms.get_head("s", "main") == "01A"
        assert ms.get_checkpoint("01B") is not None

    def test_log_append_and_tip_conflict(self, ms: MetadataStore) -> None:
        msgs = [(hashlib.sha256(bytes([i])).digest(), f"m{i}".encode()) for i in range(3)]
        new = LogInfo("s", None, 0, 0)
        ms.commit(Commit(_row("01A"), None, LogAppend("L1", 0, msgs[:2], new)))
        assert ms.log_info("L1") == LogInfo("s", None, 0, 2)
        ms.commit(Commit(_row("01B", "01A"), "01A", LogAppend("L1", 2, msgs[2:])))
        with pytest.raises(ConflictError):  # the log is at 3, not 2
            ms.commit(Commit(_row("01C", "01B"), "01B", LogAppend("L1", 2, msgs[2:])))
        assert ms.get_checkpoint("01C") is None
        rows = ms.read_messages("L1", 0, 10)
        assert [(r.idx, r.data) for r in rows] == [(0, b"m0"), (1, b"m1"), (2, b"m2")]
        assert [r.idx for r in ms.read_messages("L1", 1, 2)] == [1]
        fork = LogInfo("s", "L1", 2, 2)
        ms.commit(Commit(_row("01D", "01B"), "01B", LogAppend("L2", 2, msgs[2:], fork)))
        assert ms.log_info("L2") == LogInfo("s", "L1", 2, 3)
        assert dict(ms.iter_logs()).keys() == {"L1", "L2"}

    def test_a_checkpoint_appends_only_where_its_log_ends(self, ms: MetadataStore) -> None:
        """Whatever a backend reads to check the tip, a checkpoint that moves an existing
        head appends only at the log's end: one written there first by another branch of
        the same log, or a start past the end, is a conflict that writes nothing."""
        m = [(hashlib.sha256(bytes([i])).digest(), f"m{i}".encode()) for i in range(4)]
        ms.commit(Commit(_row("01A"), None, LogAppend("L1", 0, m[:1], LogInfo("s", None, 0, 0))))
        ms.set_head("s", "other", "01A", None)
        ms.commit(Commit(_row("01B", "01A"), "01A", LogAppend("L1", 1, m[1:2])))
        with pytest.raises(ConflictError):  # branch "other" at the same place of the log
            ms.commit(Commit(_row("01C", "01A", branch="other"), "01A", LogAppend("L1", 1, m[2:3])))
        with pytest.raises(ConflictError):  # past the end: message 2 would be missing
            ms.commit(Commit(_row("01D", "01B"), "01B", LogAppend("L1", 3, m[3:])))
        assert ms.get_checkpoint("01C") is None and ms.get_checkpoint("01D") is None
        assert ms.branches("s") == {"main": "01B", "other": "01A"}
        assert [r.data for r in ms.read_messages("L1", 0, 9)] == [b"m0", b"m1"]
        fork = LogInfo("s", "L1", 1, 1)  # a new log from message 1 of L1: starts at 1
        ms.commit(
            Commit(_row("01E", "01A", branch="other"), "01A", LogAppend("L2", 1, m[2:3], fork))
        )
        assert ms.log_info("L2") == LogInfo("s", "L1", 1, 2)

    def test_append_log_without_checkpoint(self, ms: MetadataStore) -> None:
        """The journal grows between checkpoints: appends are compare-and-set on the tip."""
        e = [(hashlib.sha256(bytes([i])).digest(), f"e{i}".encode()) for i in range(4)]
        ms.append_log(LogAppend("J1", 0, e[:1], LogInfo("s", None, 0, 0)))
        ms.append_log(LogAppend("J1", 1, e[1:3]))
        assert ms.log_info("J1") == LogInfo("s", None, 0, 3)
        with pytest.raises(ConflictError):  # a second writer at the same position
            ms.append_log(LogAppend("J1", 2, e[3:]))
        with pytest.raises(ConflictError):  # creating a log that exists
            ms.append_log(LogAppend("J1", 0, e[:1], LogInfo("s", None, 0, 0)))
        with pytest.raises(ConflictError):  # appending to a log that does not exist
            ms.append_log(LogAppend("J9", 0, e[:1]))
        assert ms.log_info("J9") is None
        assert [r.data for r in ms.read_messages("J1", 0, 9)] == [b"e0", b"e1", b"e2"]
        ms.append_log(LogAppend("J2", 2, e[3:], LogInfo("s", "J1", 2, 2)))  # a fork at 2
        assert ms.log_info("J2") == LogInfo("s", "J1", 2, 3)
        assert [r.idx for r in ms.read_messages("J2", 0, 9)] == [2]

    def test_list_newest_first_with_pagination(self, ms: MetadataStore) -> None:
        parent = None
        ids = [f"01{i:03d}" for i in range(30)]
        for ident in ids:
            ms.commit(Commit(_row(ident, parent), parent))
            parent = ident
        ms.commit(Commit(_row("01ZZZ", session="other"), None))
        listed = [r.id for r in ms.list_checkpoints("s")]
        assert listed == ids[::-1]
        page = ms.list_checkpoints("s", limit=10)
        assert [r.id for r in page] == ids[::-1][:10]
        nxt = ms.list_checkpoints("s", before=page[-1].id, limit=10)
        assert [r.id for r in nxt] == ids[::-1][10:20]
        assert ms.find_ids("01ZZ") == ["01ZZZ"]
        assert ms.find_ids("01ZZ", session="s") == []
        assert ms.find_ids("0100") == ids[:5]

    def test_readers_while_another_thread_commits(self, ms: MetadataStore) -> None:
        """One store object shared by threads (the async API's workers, a web server): its
        readers never see a half-made change or fail while a commit runs."""
        import threading
        import time

        made: list[str] = []
        errors: list[BaseException] = []
        done = threading.Event()

        def write() -> None:
            try:
                until = time.monotonic() + 0.3  # enough commits to interleave, on any backend
                i = 0
                while i < 20 or (time.monotonic() < until and i < 5000):
                    ident = f"0R{i:06d}"
                    ms.commit(Commit(_row(ident, branch=f"b{i}"), None))
                    ms.set_label(ident, "s", f"l{i}")
                    made.append(ident)
                    i += 1
            except BaseException as exc:
                errors.append(exc)
            finally:
                done.set()

        def read() -> None:
            try:
                while not done.is_set():
                    assert len(ms.list_checkpoints("s")) <= len(ms.branches("s")) + 1
                    ms.find_ids("0R")
                    ms.sessions()
                    ms.labels("s")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=write), threading.Thread(target=read)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(ms.list_checkpoints("s")) == len(ms.branches("s")) == len(made)
        assert len(ms.labels("s")) == len(made)

    def test_labels(self, ms: MetadataStore) -> None:
        ms.commit(Commit(_row("01A"), None))
        ms.set_label("01A", "s", "green")
        assert ms.labels("s") == {"01A": "green"}
        ms.set_label("01A", "s", "blue")
        assert ms.labels("s") == {"01A": "blue"}
        ms.set_label("01A", "s", None)
        assert ms.labels("s") == {}

    def test_ref_auth_is_kept_on_the_ref_row(self, ms: MetadataStore) -> None:
        """A backend that declares ``ref_auth`` returns each ref's ``auth`` string as written
        (heads by commit and by set_head, labels), and None where none was given."""
        if not ms.ref_auth:
            pytest.skip("the backend does not store ref auth strings")
        ms.commit(Commit(_row("01A"), None, head_auth="1.aa"))
        assert ms.head_rows("s") == {"main": ("01A", "1.aa")}
        ms.commit(Commit(_row("01B", "01A"), "01A", head_auth="2.bb"))
        assert ms.head_row("s", "main") == ("01B", "2.bb")
        ms.set_head("s", "main", "01A", "01B", auth="3.cc")
        ms.set_head("s", "fork", "01B", None)
        assert ms.head_rows("s") == {"main": ("01A", "3.cc"), "fork": ("01B", None)}
        ms.set_label("01A", "s", "green", "1.dd")
        assert ms.label_rows("s") == {"01A": ("green", "1.dd")}
        ms.set_label("01A", "s", "blue")
        assert ms.label_rows("s") == {"01A": ("blue", None)}
        ms.set_label("01A", "s", None)
        assert ms.label_rows("s") == {} and ms.labels("s") == {}

    def test_unicode_and_binary_bodies(self, ms: MetadataStore) -> None:
        row = CheckpointRow("01U", "séssion ☃", "brånch", None, bytes(range(256)), "d" * 64)
        ms.commit(Commit(row, None))
        assert ms.get_checkpoint("01U") == row
        assert ms.branches("séssion ☃") == {"brånch": "01U"}

    # -- retention and garbage collection -------------------------------------------------

    def test_iter_checkpoints_and_meta(self, ms: MetadataStore) -> None:
        ms.commit(Commit(_row("01A"), None))
        ms.commit(Commit(_row("01B", session="t"), None, move_head=False))  # no head yet
        assert [r.id for r in ms.iter_checkpoints()] == ["01A", "01B"]
        ms.set_meta("run:s:main", "1")
        ms.set_meta("run:s:b", "2")
        ms.set_meta("rux", "3")
        ms.set_meta("run;", "4")  # the next character after ":"
        ms.set_meta("run:\U0001f600", "5")  # past the Basic Multilingual Plane
        ms.set_meta("ru", "6")
        assert dict(ms.iter_meta("run:")) == {
            "run:s:main": "1",
            "run:s:b": "2",
            "run:\U0001f600": "5",
        }
        assert len(dict(ms.iter_meta(""))) >= 6

    def test_blob_info_and_log_sizes(self, ms: MetadataStore) -> None:
        a = _blob(b"a" * 100)
        chunks = BlobRow(hashlib.sha256(b"whole").digest(), 2, 5, a.digest)
        packed = BlobRow(hashlib.sha256(b"p").digest(), 3, 1, b"\x00" * 13 + b"PACKNAME")
        ms.put_blobs([a, chunks, packed])
        info = {i.digest: i for i in ms.iter_blob_info()}
        assert info[a.digest] == BlobInfo(a.digest, 0, 100, 100, None)
        assert info[chunks.digest] == BlobInfo(chunks.digest, 2, 5, 32, a.digest)
        assert info[packed.digest].ref == packed.data
        msgs = [(b"c" * 32, b"m0"), (b"d" * 32, b"msg1")]
        ms.append_log(LogAppend("L1", 0, msgs, LogInfo("s", None, 0, 0)))
        assert ms.log_sizes() == {"L1": (2, 32 * 2 + 2 + 4)}

    def test_delete_logs(self, ms: MetadataStore) -> None:
        e = [(hashlib.sha256(bytes([i])).digest(), f"e{i}".encode()) for i in range(3)]
        ms.append_log(LogAppend("L1", 0, e[:2], LogInfo("s", None, 0, 0)))
        ms.append_log(LogAppend("L2", 2, e[2:], LogInfo("s", "L1", 2, 2)))
        ms.delete_logs(["L2", "NOPE"])
        assert ms.log_info("L2") is None
        assert ms.read_messages("L2", 0, 9) == []
        assert dict(ms.iter_logs()).keys() == {"L1"}
        assert ms.log_info("L1") == LogInfo("s", None, 0, 2)
        ms.delete_logs(["L2"])  # idempotent
        # the id is free again: a new log of that name starts empty
        ms.append_log(LogAppend("L2", 0, e[:1], LogInfo("s", None, 0, 0)))
        assert ms.log_info("L2") == LogInfo("s", None, 0, 1)

    def test_repoint_is_compare_and_set(self, ms: MetadataStore) -> None:
        old = b"\x01" + b"\x00" * 12 + b"OLDPACK"
        new = b"\x01" + b"\x00" * 12 + b"NEWPACK"
        d = hashlib.sha256(b"packed").digest()
        ms.put_blobs([BlobRow(d, 3, 6, old)])
        assert ms.repoint_blobs([(d, b"other", new)]) == 0
        assert ms.repoint_blobs([(d, old, new)]) == 1
        assert ms.get_blob(d) == BlobRow(d, 3, 6, new)
        assert ms.repoint_blobs([(d, old, new)]) == 0
        assert ms.repoint_blobs([]) == 0

    def test_artifact_chunks_as_rows(self, ms: MetadataStore, tmp_path: Path) -> None:
        """Artifacts on a store without a blob directory: every content-defined
        chunk is a blob row of this backend; an insertion re-stores about one chunk."""
        import random

        from .._store import Store

        store = Store(ms)
        run = store.session("artifacts")
        src = tmp_path / "artifact.bin"
        data = random.Random(25).randbytes(3 << 20)
        src.write_bytes(data)
        cp1 = run.checkpoint(artifacts={"a": src})
        ref = cp1.artifacts["a"]
        assert (ref.size, ref.path) == (len(data), str(src)) and ref.chunks > 2
        before = {i.digest for i in ms.iter_blob_info()}
        src.write_bytes(data[:1000] + b"inserted" + data[1000:])
        cp2 = run.checkpoint(artifacts={"a": src})
        added = {i.digest for i in ms.iter_blob_info()} - before
        assert 2 <= len(added) <= 3  # the changed chunk(s) and the new chunk list
        assert b"".join(run.read_artifact(cp1.id, "a")) == data
        out = run.fetch_artifact(cp2.id, "a", tmp_path / "out.bin")
        assert out.read_bytes() == src.read_bytes()


@_tier(Capability.LEASES)
class LeaseConformance(_Tier):
    """Leases and fencing tokens (:class:`~stashpoint.stores.base.Leases`)."""

    def test_lease_is_exclusive_and_reentrant(self, ms: MetadataStore) -> None:
        a = ms.acquire_lease("s", "worker-a", 30)
        assert (a.session, a.owner, a.token) == ("s", "worker-a", 1)
        assert ms.acquire_lease("s", "worker-a", 30).token == 1  # extended, same token
        with pytest.raises(LeaseHeld) as held:
            ms.acquire_lease("s", "worker-b", 30)
        assert held.value.owner == "worker-a" and held.value.expires_in > 0
        assert held.value.exit_code == 3
        other = ms.acquire_lease("t", "worker-b", 30)  # leases are per session
        assert other.token == 1
        info = ms.lease_info("s")
        assert info is not None and info.owner == "worker-a" and info.expires_in > 0
        assert ms.lease_info("nobody") is None

    def test_expired_lease_is_taken_over_and_old_holder_fenced(self, ms: MetadataStore) -> None:
        old = ms.acquire_lease("s", "worker-a", 0.2)
        old_fence = Fence("s", old.token)
        ms.commit(Commit(_row("01A"), None, fence=old_fence))
        time.sleep(0.4)
        info = ms.lease_info("s")
        assert info is not None and info.expires_in < 0
        new = ms.acquire_lease("s", "worker-b", 30)
        assert new.token == old.token + 1
        new_fence = Fence("s", new.token)
        with pytest.raises(LeaseLost):
            ms.commit(Commit(_row("01B", "01A"), "01A", fence=old_fence))
        with pytest.raises(LeaseLost):
            ms.append_log(
                LogAppend("L", 0, [(b"c" * 32, b"m")], LogInfo("s", None, 0, 0), old_fence)
            )
        with pytest.raises(LeaseLost):
            ms.set_head("s", "main", "01A", "01A", fence=old_fence)
        assert not ms.renew_lease(old_fence, 30)
        ms.release_lease(old_fence)  # a stale release must not free the new holder's lease
        assert ms.get_checkpoint("01B") is None and ms.get_head("s", "main") == "01A"
        ms.commit(Commit(_row("01C", "01A"), "01A", fence=new_fence))
        assert ms.get_head("s", "main") == "01C"
        assert ms.renew_lease(new_fence, 30)
        with pytest.raises(LeaseHeld):
            ms.acquire_lease("s", "worker-a", 30)

    def test_unfenced_writes_wait_for_the_lease(self, ms: MetadataStore) -> None:
        got = ms.acquire_lease("s", "worker-a", 30)
        with pytest.raises(LeaseHeld):
            ms.commit(Commit(_row("01A"), None))
        assert ms.get_checkpoint("01A") is None
        ms.commit(Commit(_row("01A"), None, fence=Fence("s", got.token)))
        with pytest.raises(LeaseHeld):
            ms.set_head("s", "main", "01A", "01A")
        ms.commit(Commit(_row("01X", session="t"), None))  # other sessions are not affected
        ms.release_lease(Fence("s", got.token))
        ms.commit(Commit(_row("01B", "01A"), "01A"))  # released: anyone may write again
        again = ms.acquire_lease("s", "worker-b", 30)
        assert again.token == got.token + 1  # tokens never repeat, also after a release

    def test_a_released_lease_is_not_renewed(self, ms: MetadataStore) -> None:
        """A renewal still in flight when its holder released the lease (a slow network, a
        renew thread that outlived release's wait) must not bring the lease back for a ttl,
        shutting every other writer out of a session nobody works on."""
        got = ms.acquire_lease("s", "worker-a", 30)
        fence = Fence("s", got.token)
        assert ms.renew_lease(fence, 30)
        ms.release_lease(fence)
        assert not ms.renew_lease(fence, 30)
        info = ms.lease_info("s")
        assert info is not None and info.expires_in <= 0
        ms.commit(Commit(_row("01A"), None))  # anyone may write again
        assert ms.acquire_lease("s", "worker-b", 30).token == got.token + 1

    def test_a_checkpoint_on_an_existing_head_waits_for_the_lease(self, ms: MetadataStore) -> None:
        """The usual checkpoint (the head moves on from one that exists), not only a
        branch's first: refused while another worker holds the lease, nothing written."""
        ms.commit(Commit(_row("01A"), None))
        got = ms.acquire_lease("s", "worker-a", 30)
        new = LogAppend("L", 0, [(b"c" * 32, b"m")], LogInfo("s", None, 0, 0))
        with pytest.raises(LeaseHeld, match="worker-a"):
            ms.commit(Commit(_row("01B", "01A"), "01A", new))
        with pytest.raises(LeaseLost):
            ms.commit(Commit(_row("01B", "01A"), "01A", new, fence=Fence("s", got.token + 1)))
        assert ms.get_checkpoint("01B") is None and ms.get_head("s", "main") == "01A"
        assert ms.log_info("L") is None
        ms.commit(Commit(_row("01B", "01A"), "01A", new, fence=Fence("s", got.token)))
        assert ms.get_head("s", "main") == "01B"

    def test_unfenced_appends_wait_for_the_lease(self, ms: MetadataStore) -> None:
        """A durable run's journal append names its session: without the lease's token it
        is refused while another worker holds a live lease (it may have started before)."""
        ms.append_log(
            LogAppend("L1", 0, [(b"\0" * 32, b"a")], LogInfo("s", None, 0, 0), session="s")
        )
        got = ms.acquire_lease("s", "worker-b", 30)
        with pytest.raises(LeaseHeld, match="worker-b"):
            ms.append_log(LogAppend("L1", 1, [(b"\1" * 32, b"b")], session="s"))
        fence = Fence("s", got.token)
        ms.append_log(LogAppend("L1", 1, [(b"\1" * 32, b"b")], fence=fence, session="s"))
        ms.append_log(LogAppend("L2", 0, [(b"\2" * 32, b"c")], LogInfo("t", None, 0, 0)))
        assert [r.data for r in ms.read_messages("L1", 0, 5)] == [b"a", b"b"]


@_tier(Capability.COLLECTION)
class CollectionConformance(_Tier):
    """Condemned blobs, sweeps, the GC epoch (:class:`~stashpoint.stores.base.Collection`)."""

    def test_condemned_blobs_look_absent_until_revived(self, ms: MetadataStore) -> None:
        a, b = _blob(b"alpha"), _blob(b"beta")
        ms.put_blobs([a, b])
        ms.condemn([a.digest], 100.0, epoch="e1")
        assert ms.get_meta("gc_epoch") == "e1"
        assert ms.has_blobs([a.digest, b.digest]) == {b.digest}
        assert ms.get_blob(a.digest) == a, "reads of a condemned blob still work"
        assert ms.condemned() == {a.digest: 100.0}
        ms.condemn([a.digest], 200.0)
        assert ms.condemned() == {a.digest: 100.0}, "a mark keeps its first time"
        assert ms.condemned_among([a.digest, b.digest]) == {a.digest}
        ms.put_blobs([a])  # a writer stores it again: revived
        assert ms.condemned() == {}
        assert ms.has_blobs([a.digest]) == {a.digest}
        ms.condemn([a.digest, b.digest], 100.0)
        ms.commit(Commit(_row("01A"), None, blobs=[b]))  # committing a blob revives it too
        assert ms.condemned() == {a.digest: 100.0}
        assert ms.revive([a.digest, b.digest]) == {a.digest}
        assert ms.condemned() == {}

    def test_sweep_deletes_only_still_condemned_old_enough(self, ms: MetadataStore) -> None:
        a, b, c = _blob(b"a1"), _blob(b"b2"), _blob(b"c3")
        ms.put_blobs([a, b, c])
        loose = hashlib.sha256(b"loose chunk").digest()
        ms.condemn([a.digest, loose], 100.0)
        ms.condemn([b.digest], 300.0)
        ms.condemn([c.digest], 100.0)
        ms.put_blobs([c])  # revived before the sweep
        unlinked: list[bytes] = []
        got = ms.sweep_blobs(
            [a.digest, b.digest, c.digest, loose],
            before=200.0,
            unlink=unlinked.extend if ms.atomic_unlink else None,
        )
        assert set(got) == {a.digest, loose}
        assert set(unlinked) == ({a.digest, loose} if ms.atomic_unlink else set())
        assert ms.get_blob(a.digest) is None
        assert ms.get_blob(b.digest) == b, "condemned after the cut-off: kept"
        assert ms.get_blob(c.digest) == c, "revived: kept"
        assert ms.condemned() == {b.digest: 300.0}
        assert ms.sweep_blobs([a.digest], before=1e12) == [], "idempotent"
        assert ms.sweep_blobs([], before=1e12) == []

    def test_sweep_unlink_failure_deletes_nothing(self, ms: MetadataStore) -> None:
        if not ms.atomic_unlink:
            pytest.skip("this backend keeps every blob inside it")
        a = _blob(b"keep me")
        ms.put_blobs([a])
        ms.condemn([a.digest], 1.0)

        def fail(_digests: list[bytes]) -> None:
            raise OSError("EIO")

        with pytest.raises(OSError):
            ms.sweep_blobs([a.digest], before=2.0, unlink=fail)
        assert ms.get_blob(a.digest) == a
        assert ms.condemned() == {a.digest: 1.0}

    def test_many_condemned_in_batches(self, ms: MetadataStore) -> None:
        rows = [_blob(f"x{i}".encode()) for i in range(1100)]
        ms.put_blobs(rows)
        digests = [r.digest for r in rows]
        ms.condemn(digests, 5.0)
        assert ms.has_blobs(digests) == set()
        assert len(ms.condemned_among(digests)) == 1100
        assert len(ms.revive(digests[:600])) == 600
        assert len(ms.sweep_blobs(digests, before=5.0)) == 500
        assert ms.has_blobs(digests) == set(digests[:600])

    def test_commit_gc_epoch_fence(self, ms: MetadataStore) -> None:
        ms.commit(Commit(_row("01A"), None, gc_epoch="0"))  # a fresh store is at epoch "0"
        ms.condemn([], 1.0, epoch="7")
        with pytest.raises(GcEpochChanged):
            ms.commit(Commit(_row("01B", "01A"), "01A", blobs=[_blob(b"x")], gc_epoch="0"))
        assert ms.get_checkpoint("01B") is None
        assert ms.get_blob(_blob(b"x").digest) is None, "a refused commit writes nothing"
        assert ms.get_head("s", "main") == "01A"
        ms.commit(Commit(_row("01B", "01A"), "01A", gc_epoch="7"))
        ms.commit(Commit(_row("01C", "01B"), "01B"))  # no epoch: no check


@_tier(Capability.RETENTION)
class RetentionConformance(_Tier):
    """Pruned marks (:class:`~stashpoint.stores.base.Retention`)."""

    def test_pruned_marks_skip_heads_and_strangers(self, ms: MetadataStore) -> None:
        ms.commit(Commit(_row("01A"), None))
        ms.commit(Commit(_row("01B", "01A"), "01A"))
        ms.commit(Commit(_row("01X", session="other"), None))
        got = ms.mark_pruned("s", ["01A", "01B", "01X", "01NOPE"], "2026-01-01T00:00:00Z")
        assert got == ["01A"], "heads, other sessions' and unknown ids are never pruned"
        assert ms.mark_pruned("s", ["01A"], "later") == []
        assert ms.pruned("s") == {"01A": "2026-01-01T00:00:00Z"}
        assert ms.pruned("other") == {}
        assert ms.get_checkpoint("01A") is not None, "the record stays for the hash chain"

    def test_a_checkpoint_labelled_since_the_plan_is_not_pruned(self, ms: MetadataStore) -> None:
        """Retention plans without labelled checkpoints; one labelled between the plan and the
        marks must still be kept (GC would free what its label promises to keep)."""
        ms.commit(Commit(_row("01A"), None))
        ms.commit(Commit(_row("01B", "01A"), "01A"))
        ms.commit(Commit(_row("01C", "01B"), "01B"))
        ms.set_label("01A", "s", "keep me")
        assert ms.mark_pruned("s", ["01A", "01B"], "2026-01-01T00:00:00Z") == ["01B"]
        assert ms.pruned("s") == {"01B": "2026-01-01T00:00:00Z"}
        ms.set_label("01A", "s", None)
        assert ms.mark_pruned("s", ["01A"], "later") == ["01A"]

    def test_a_head_never_moves_to_a_pruned_checkpoint(self, ms: MetadataStore) -> None:
        """Retention may mark a checkpoint between the engine's check and its head move (a
        rewind, a fork): the move itself refuses, so a head's contents are never freed."""
        from ..errors import PrunedError

        ms.commit(Commit(_row("01A"), None))
        ms.commit(Commit(_row("01B", "01A"), "01A"))
        assert ms.mark_pruned("s", ["01A"], "2026-01-01T00:00:00Z") == ["01A"]
        with pytest.raises(PrunedError, match="01A"):
            ms.set_head("s", "main", "01A", "01B")
        with pytest.raises(PrunedError, match="01A"):
            ms.set_head("s", "fork", "01A", None)
        assert ms.branches("s") == {"main": "01B"}
        ms.set_head("s", "fork", "01B", None)  # a kept checkpoint: fine
        assert ms.branches("s") == {"main": "01B", "fork": "01B"}

    def test_retention_leaves_a_leased_session_to_its_holder(self, ms: MetadataStore) -> None:
        if Capability.LEASES not in ms.capabilities:
            pytest.skip("the backend declares no leases")
        ms.commit(Commit(_row("01A"), None))
        ms.commit(Commit(_row("01B", "01A"), "01A"))
        got = ms.acquire_lease("s", "worker-a", 30)
        with pytest.raises(LeaseHeld, match="worker-a"):
            ms.mark_pruned("s", ["01A"], "now")
        assert ms.pruned("s") == {}
        ms.release_lease(Fence("s", got.token))
        assert ms.mark_pruned("s", ["01A"], "now") == ["01A"]


class MetadataStoreConformance(
    CoreConformance, LeaseConformance, CollectionConformance, RetentionConformance
):
    """Every tier: the core, and each optional capability the backend declares in its
    ``capabilities`` (all of them, for the built-in backends). ``make_store`` is supplied by
    the subclass."""


class BlobBackendConformance:
    """Every place for blobs outside the metadata store (local directory, S3) must pass these;
    ``make_backend`` is supplied by the subclass and returns a fresh, empty one."""

    @pytest.fixture
    def bb(self, make_backend: Callable[[], Any]) -> Any:
        backend = make_backend()
        yield backend
        backend.close()

    def test_chunk_put_get_has_size_delete(self, bb: Any) -> None:
        data = b"chunk" * 1000
        d = hashlib.sha256(data).digest()
        assert not bb.has(d) and bb.get(d) is None and bb.size(d) is None
        revived: list[bytes] = []
        bb.before_put = revived.append
        bb.put(d, 0, len(data), data)
        bb.put(d, 0, len(data), data)  # idempotent
        assert revived == [d, d]  # the revive hook runs before every store, even a repeat
        assert bb.has(d) and bb.get(d) == (0, len(data), data)
        size = bb.size(d)
        assert size is not None and size >= len(data)
        assert dict(bb.iter_sizes()) == {d: size}
        assert bb.delete(d) == size
        assert bb.delete(d) == 0
        assert not bb.has(d) and bb.get(d) is None and list(bb.iter_sizes()) == []

    def test_packs_write_read_list_delete(self, bb: Any) -> None:
        from .._ids import new_id

        name = new_id()
        parts = [b"a" * 10, b"", "ünï".encode(), bytes(range(256))]
        spans = bb.write_pack(name, parts)
        assert [bb.read_packed(name, off, n) for off, n in spans] == parts
        listed = bb.packs()
        assert set(listed) == {name} and listed[name][0] == spans[-1][0] + spans[-1][1]
        assert list(bb.iter_sizes()) == []  # packs are not chunks
        with pytest.raises(IntegrityError):
            bb.read_packed(name, spans[-1][0], 10_000)  # past the end: truncated
        assert bb.delete_pack(name) == listed[name][0]
        assert bb.delete_pack(name) == 0 and bb.packs() == {}
        with pytest.raises(PackMissing):
            bb.read_packed(name, *spans[0])
        with pytest.raises(IntegrityError):
            bb.read_packed("../../etc/passwd", 0, 1)  # names are checked, never paths

    def test_many_chunks_listed(self, bb: Any) -> None:
        blobs = [str(i).encode() * 50 for i in range(30)]
        for b in blobs:
            bb.put(hashlib.sha256(b).digest(), 0, len(b), b)
        assert {d for d, _n in bb.iter_sizes()} == {hashlib.sha256(b).digest() for b in blobs}
