"""The SQLite store gives its write-ahead log its full size once a process keeps writing.

Why it matters: while the WAL file grows, each fsynced commit also journals the file's new
size. The tests check the effect on disk (size, frames intact, crash recovery), never time.
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
from pathlib import Path

import stashpoint
from stashpoint.stores.sqlite import WAL_GROW_AFTER, SqliteStore

from .test_disk_full import tiny_fs  # noqa: F401  (a fixture: a real 3 MiB tmpfs)


def _full_size(db: Path) -> int:
    """What the WAL reaches before SQLite's automatic checkpoint, read from SQLite itself."""
    with sqlite3.connect(db) as conn:
        pages = conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    return 32 + pages * (24 + page)


def _wal(root: Path) -> Path:
    return root / "store.db-wal"


def test_a_process_that_keeps_writing_presizes_the_wal_and_loses_no_frame(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    store = stashpoint.open(root)
    assert isinstance(store.refs.inner, SqliteStore)
    session = store.session("s")
    first = session.checkpoint({"step": 0})
    small = _wal(root).stat().st_size
    assert 0 < small < _full_size(root / "store.db") // 4
    ids = [first.id] + [session.checkpoint({"step": i}).id for i in range(1, 6)]
    assert _wal(root).stat().st_size >= _full_size(root / "store.db")

    # The files as a crash would leave them (the store still open, nothing checkpointed into
    # the database file): SQLite must recover every commit from the WAL's frames.
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    for name in ("store.db", "store.db-wal"):
        shutil.copy2(root / name, crashed / name)
    shutil.copytree(root / "blobs", crashed / "blobs", dirs_exist_ok=True)
    store.close()
    with stashpoint.open(crashed) as again:
        session = again.session("s")
        assert [c.id for c in session.history()] == ids[::-1]  # each record verified
        assert [session.state(i)["step"] for i in ids] == list(range(6))
        with sqlite3.connect(crashed / "store.db") as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_process_that_commits_once_or_twice_leaves_the_wal_small(tmp_path: Path) -> None:
    """The CLI and agent hooks commit once or twice per process: they never pay for it."""
    root = tmp_path / "store"
    with stashpoint.open(root) as store:
        session = store.session("s")
        session.checkpoint({"step": 0})
        session.checkpoint({"step": 1})
        assert _wal(root).stat().st_size < _full_size(root / "store.db") // 4


def test_a_full_disk_leaves_the_wal_as_it_was_and_commits_still_succeed(
    tiny_fs: Path,  # noqa: F811
) -> None:
    root = tiny_fs / "store"
    with stashpoint.open(root) as store:
        session = store.session("s")
        ids = [session.checkpoint({"step": i}).id for i in range(WAL_GROW_AFTER + 3)]
        assert _wal(root).stat().st_size < 1 << 20  # 4 MiB did not fit: cut back
        assert [c.id for c in session.history()] == ids[::-1]


def test_many_threads_opening_one_new_store_at_once_all_succeed(tmp_path: Path) -> None:
    """Switching a new database to WAL fails at once, without SQLite's busy handler, when
    another connection holds it: openers must retry, not fail (it failed 3 tries in 30)."""
    errors: list[str] = []
    for trial in range(20):
        path = tmp_path / f"s{trial}" / "store.db"
        start = threading.Barrier(16)

        def open_one(path: Path = path, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                SqliteStore(path).close()
            except Exception as exc:  # collected, asserted below
                errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=open_one) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert errors == []
