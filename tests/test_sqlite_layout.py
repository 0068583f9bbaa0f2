"""The SQLite store's on-disk layout: what one checkpoint writes, and stores of the previous
layout opening as they were."""

from __future__ import annotations

import sqlite3
import struct
from collections import Counter
from pathlib import Path

import pytest

import stashpoint
from stashpoint.errors import ConflictError
from stashpoint.stores.base import Commit, LogAppend
from stashpoint.stores.sqlite import MIGRATIONS, SCHEMA_VERSION, SqliteStore
from stashpoint.verify import verify_store


def _db(store: stashpoint.Store) -> sqlite3.Connection:
    meta = store.meta
    while hasattr(meta, "inner"):
        meta = meta.inner
    assert isinstance(meta, SqliteStore)
    return meta._db


def _wal_pages(path: Path) -> list[tuple[int, int]]:
    """(page number, commit marker) of every valid frame in a WAL file."""
    wal = path.read_bytes()
    page = struct.unpack(">I", wal[8:12])[0]
    salt, frames, off = wal[16:24], [], 32
    while off + 24 + page <= len(wal) and wal[off + 8 : off + 16] == salt:
        frames.append(struct.unpack(">II", wal[off : off + 8]))
        off += 24 + page
    return frames


def _conversation_steps(run: stashpoint.Session, msgs: list[dict[str, str]], n: int) -> None:
    for _ in range(n):
        i = len(msgs)
        msgs += [
            {"role": "user", "content": f"question {i} " + "x" * 480},
            {"role": "assistant", "content": f"answer {i} " + "y" * 480},
        ]
        run.checkpoint({"messages": msgs})


def test_a_state_checkpoint_writes_one_transaction_of_few_pages(tmp_path: Path) -> None:
    """Each B-tree an insert touches is a page in the WAL and in its fsync: a state checkpoint
    of two new messages writes its message rows, its record (the table, the id index and the
    session index) and its head, and nothing else; the message rows need no index of their
    own (version 4 kept one beside them: a page more per checkpoint)."""
    store = stashpoint.open(tmp_path / "s")
    run = store.session("conv")
    msgs: list[dict[str, str]] = []
    _conversation_steps(run, msgs, 20)
    db = _db(store)
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    seen: list[str] = []
    db.set_trace_callback(seen.append)
    n = 60
    _conversation_steps(run, msgs, n)
    db.set_trace_callback(None)
    frames = _wal_pages(tmp_path / "s" / "store.db-wal")
    owner = dict(
        (pageno, name)
        for name, pageno in sqlite3.connect(tmp_path / "s" / "store.db").execute(
            "SELECT name, pageno FROM dbstat"
        )
    )
    trees = Counter(owner.get(p, "?") for p, _ in frames)
    assert sum(1 for _, commit in frames if commit) == n  # one transaction per checkpoint
    assert [s.split()[0] for s in seen].count("BEGIN") == n
    assert len(seen) <= 5 * n, Counter(" ".join(s.split()[:3]) for s in seen)
    assert set(trees) <= {
        "messages",
        "checkpoints",
        "sqlite_autoindex_checkpoints_1",
        "checkpoints_by_session",
        "heads",
        "sqlite_schema",  # page 1: the database's size, as the file grows
    }, trees
    assert len(frames) / n < 6.5, trees
    assert run.state()["messages"] == msgs
    store.close()


def _as_version_4(path: Path) -> None:
    """Rewrite a store's message log in the version 4 layout, as an older stashpoint left it."""
    db = sqlite3.connect(path, isolation_level=None)
    db.executescript(
        """
        BEGIN;
        CREATE TABLE logs4(
            id TEXT PRIMARY KEY, session TEXT NOT NULL, parent TEXT, parent_len BIGINT NOT NULL);
        INSERT INTO logs4 SELECT id, session, parent, parent_len FROM logs;
        DROP TABLE logs;
        ALTER TABLE logs4 RENAME TO logs;
        CREATE TABLE messages4(
            log TEXT NOT NULL, idx BIGINT NOT NULL, chain BLOB NOT NULL, data BLOB NOT NULL,
            PRIMARY KEY (log, idx));
        INSERT INTO messages4 SELECT log, idx, chain, data FROM messages;
        DROP TABLE messages;
        ALTER TABLE messages4 RENAME TO messages;
        PRAGMA user_version=4;
        COMMIT;
        """
    )
    db.close()


def test_a_version_4_store_is_migrated_and_reads_as_before(tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path / "s")
    run = store.session("conv")
    msgs: list[dict[str, str]] = []
    _conversation_steps(run, msgs, 5)
    fork = run.fork(run.history()[2].id, branch="alt")
    fork_msgs = list(fork.state()["messages"])
    _conversation_steps(fork, fork_msgs, 2)
    store.close()
    _as_version_4(tmp_path / "s" / "store.db")

    store = stashpoint.open(tmp_path / "s")
    db = _db(store)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert (
        "pos INTEGER PRIMARY KEY"
        in db.execute("SELECT sql FROM sqlite_schema WHERE name='messages'").fetchone()[0]
    )
    run = store.session("conv")
    assert run.state()["messages"] == msgs
    assert store.session("conv", branch="alt").state()["messages"] == fork_msgs
    _conversation_steps(run, msgs, 2)  # and goes on growing
    assert store.session("conv").state()["messages"] == msgs
    store.close()
    with stashpoint.open(tmp_path / "s") as again:
        report = verify_store(again)
    assert report.checkpoints == 9 and report.problems == []


def test_a_message_written_twice_at_one_index_is_a_conflict(tmp_path: Path) -> None:
    """The head's compare-and-set and the message key are what refuse a second writer at the
    same place of a log (the tip is not read back in a checkpoint's transaction)."""
    meta = SqliteStore(tmp_path / "s.db")
    from stashpoint.stores.base import CheckpointRow, LogInfo

    def row(ident: str, parent: str | None) -> CheckpointRow:
        return CheckpointRow(ident, "s", "main", parent, b"{}", "d")

    first = LogAppend("L", 0, [(b"c" * 32, b"m0")], LogInfo("s", None, 0, 0))
    meta.commit(Commit(row("01A", None), None, first))
    meta.set_head("s", "other", "01A", None)
    meta.commit(Commit(row("01B", "01A"), "01A", LogAppend("L", 1, [(b"c" * 32, b"m1")])))
    with pytest.raises(ConflictError):  # another branch on the same log, at the same index
        meta.commit(
            Commit(
                CheckpointRow("01C", "s", "other", "01A", b"{}", "d"),
                "01A",
                LogAppend("L", 1, [(b"c" * 32, b"other")]),
            )
        )
    assert [m.data for m in meta.read_messages("L", 0, 5)] == [b"m0", b"m1"]
    assert meta.get_head("s", "other") == "01A"
    meta.close()


def test_a_remembered_log_number_that_is_another_logs_now_is_refused(tmp_path: Path) -> None:
    """A writer remembers the number of each log it appends to. Another writer deletes that
    log and a new log takes its number (SQLite reuses the largest rowid): an append by the
    first writer must not land in the new log's range. The record's insert checks that the
    row before the new ones belongs to this log: refused, and nothing of it is left."""
    from stashpoint.stores.base import CheckpointRow, LogInfo

    def row(ident: str, parent: str | None, session: str = "s") -> CheckpointRow:
        return CheckpointRow(ident, session, "main", parent, b"{}", "d")

    path = tmp_path / "s.db"
    meta, other = SqliteStore(path), SqliteStore(path)
    meta.commit(
        Commit(
            row("01A", None),
            None,
            LogAppend("L", 0, [(b"c" * 32, b"m0")], LogInfo("s", None, 0, 0)),
        )
    )
    meta.commit(Commit(row("01B", "01A"), "01A", LogAppend("L", 1, [(b"c" * 32, b"m1")])))
    num = _db_num(path, "L")
    other.delete_logs(["L"])
    rows = [(b"c" * 32, b"t%d" % i) for i in range(2)]
    other.commit(
        Commit(row("01T", None, "t"), None, LogAppend("M", 0, rows, LogInfo("t", None, 0, 0)))
    )
    assert _db_num(path, "M") == num  # the deleted log's number, taken again
    with pytest.raises(ConflictError):
        meta.commit(Commit(row("01C", "01B"), "01B", LogAppend("L", 2, [(b"c" * 32, b"m2")])))
    assert [m.data for m in other.read_messages("M", 0, 9)] == [b"t0", b"t1"]
    assert meta.get_checkpoint("01C") is None and meta.get_head("s", "main") == "01B"
    db = sqlite3.connect(path)
    assert db.execute("SELECT COUNT(*) FROM messages WHERE log = 'L'").fetchone() == (0,)
    db.close()
    meta.close()
    other.close()


def _db_num(path: Path, log: str) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute("SELECT num FROM logs WHERE id=?", (log,)).fetchone()[0])
    finally:
        db.close()


def test_the_migrations_run_in_order_on_a_new_file(tmp_path: Path) -> None:
    assert len(MIGRATIONS) == SCHEMA_VERSION
    meta = SqliteStore(tmp_path / "new.db")
    info = meta.log_info("missing")
    assert info is None and meta.read_messages("missing", 0, 3) == []
    meta.close()


def test_a_message_row_written_the_old_way_is_refused_not_lost(tmp_path: Path) -> None:
    """A process of an older stashpoint, still running when a newer one migrated the file,
    inserts message rows by (log, idx) alone: SQLite would number such a row after the last
    one, outside its log's range, where no read finds it. It is refused instead."""
    store = stashpoint.open(tmp_path / "s")
    a, b = store.session("a"), store.session("b")
    a.checkpoint({"messages": ["a0"]})
    b.checkpoint({"messages": ["b0"]})  # b's log is the newest: a's is not at the end
    log = a.head.state.conversation.log  # type: ignore[union-attr]
    store.close()
    db = sqlite3.connect(tmp_path / "s" / "store.db")
    with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):
        db.execute(
            "INSERT INTO messages(log, idx, chain, data) VALUES (?, 1, ?, ?)",
            (log, b"c" * 32, b'"a1"'),
        )
    db.close()
