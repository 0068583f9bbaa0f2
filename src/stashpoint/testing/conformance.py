"""Conformance suite for :class:`stashpoint.stores.base.MetadataStore` backends.

Subclass :class:`MetadataStoreConformance` in a pytest module and provide a ``make_store``
fixture that returns a fresh, empty store; every backend runs the same assertions::

    class TestMyStore(MetadataStoreConformance):
        @pytest.fixture
        def make_store(self, tmp_path):
            return lambda: MyStore(...)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from ..errors import ConflictError
from ..stores.base import BlobRow, CheckpointRow, Commit, LogAppend, LogInfo, MetadataStore

__all__ = ["MetadataStoreConformance"]


def _row(
    ident: str, parent: str | None = None, session: str = "s", branch: str = "main"
) -> CheckpointRow:
    body = f"body-{ident}".encode()
    return CheckpointRow(ident, session, branch, parent, body, hashlib.sha256(body).hexdigest())


def _blob(data: bytes) -> BlobRow:
    return BlobRow(hashlib.sha256(data).digest(), 0, len(data), data)


class MetadataStoreConformance:
    """Every backend must pass these; ``make_store`` is supplied by the subclass."""

    @pytest.fixture
    def ms(self, make_store: Callable[[], MetadataStore]) -> Any:
        store = make_store()
        yield store
        store.close()

    def test_meta_set_get_delete(self, ms: MetadataStore) -> None:
        assert ms.get_meta("k") is None
        ms.set_meta("k", "v")
        ms.set_meta("k", "w")
        assert ms.get_meta("k") == "w"
        ms.set_meta("k", None)
        assert ms.get_meta("k") is None

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

    def test_labels(self, ms: MetadataStore) -> None:
        ms.commit(Commit(_row("01A"), None))
        ms.set_label("01A", "s", "green")
        assert ms.labels("s") == {"01A": "green"}
        ms.set_label("01A", "s", "blue")
        assert ms.labels("s") == {"01A": "blue"}
        ms.set_label("01A", "s", None)
        assert ms.labels("s") == {}

    def test_unicode_and_binary_bodies(self, ms: MetadataStore) -> None:
        row = CheckpointRow("01U", "séssion ☃", "brånch", None, bytes(range(256)), "d" * 64)
        ms.commit(Commit(row, None))
        assert ms.get_checkpoint("01U") == row
        assert ms.branches("séssion ☃") == {"brånch": "01U"}
