"""Durability levels: fsync, group commit and at-exit, per store and per session.

What a level changes cannot be shown by pulling the power, so these tests look at what each
backend is told: SQLite's ``synchronous`` setting for the commit, PostgreSQL's count of WAL
syncs. What a level must not change is shown directly: a killed process loses nothing, and
everything committed is visible and verifies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.durability import Durability
from stashpoint.errors import UsageError
from stashpoint.verify import verify_store

from .test_postgres import pg_url  # noqa: F401 - the fixture, with its skip / CI-fail rule


def test_levels_parse_and_print() -> None:
    assert Durability.parse("fsync") == Durability("fsync")
    assert Durability.parse("exit").deferred
    group = Durability.parse("group")
    assert (group.level, group.every, group.ms) == ("group", 64, 100.0)
    assert Durability.parse("group:10").every == 10
    assert Durability.parse("group:250ms").ms == 250.0
    both = Durability.parse("group:8,20ms")
    assert (both.every, both.ms) == (8, 20.0)
    assert Durability.parse(str(both)) == both
    for bad in ("sometimes", "group:0", "group:-1", "group:x", "group:", "group:1,2", "group:0ms"):
        with pytest.raises(UsageError, match="durability"):
            Durability.parse(bad)


def _sqlite_sync(store: stashpoint.Store) -> int:
    return int(store.backend._db.execute("PRAGMA synchronous").fetchone()[0])  # type: ignore[attr-defined]


def test_sqlite_defers_only_the_commits_of_deferred_sessions(tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path / "s")
    fast = store.session("fast", durability="group:5")
    safe = store.session("safe")  # the store's default: fsync
    fast.checkpoint({"i": 0})
    assert _sqlite_sync(store) == 1  # NORMAL: the commit did not wait for the disk
    assert store.group.pending == 1
    safe.checkpoint({"i": 0})
    assert _sqlite_sync(store) == 2  # FULL: fsynced, and with it everything before it
    assert store.group.pending == 0
    for i in range(1, 11):
        fast.checkpoint({"i": i})
    assert store.group.flushes == 2 and store.group.pending == 0  # every 5
    fast.checkpoint({"i": 11})
    assert store.group.pending == 1
    store.close()  # flushes what is pending
    again = stashpoint.open(tmp_path / "s")
    assert again.session("fast").state() == {"i": 11}
    assert verify_store(again).ok
    again.close()


@pytest.mark.parametrize("level", ["exit", "group:5"])
def test_journal_entries_after_a_deferred_checkpoint_are_fsynced(
    tmp_path: Path, level: str
) -> None:
    """A deferred checkpoint commits at synchronous=NORMAL; the durable step's journal entry
    that follows must not (it is always fsynced). The connection stayed at NORMAL after a
    deferred commit, so every later journal append, intent and head move went unsynced."""
    store = stashpoint.open(tmp_path / "s")
    run = store.session("s", durability=level)
    run.checkpoint({"x": 1})
    seen: list[str] = []
    db = store.backend._db  # type: ignore[attr-defined]
    level_now = int(db.execute("PRAGMA synchronous").fetchone()[0])
    db.set_trace_callback(seen.append)

    @run.step
    def charge() -> str:
        return "charged"

    run.run(lambda: charge())
    db.set_trace_callback(None)
    appends = []
    for stmt in seen:  # the synchronous level each journal append's transaction committed at
        if stmt.startswith("PRAGMA synchronous="):
            level_now = {"NORMAL": 1, "FULL": 2}[stmt.split("=")[1]]
        elif stmt.startswith("INSERT INTO messages"):
            appends.append(level_now)
    assert appends and set(appends) == {2}, appends
    store.close()


def test_group_commit_flushes_after_its_delay(tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path / "s", durability="group:1000,20ms")
    run = store.session("s")
    run.checkpoint({"x": 1})
    assert store.group.pending == 1
    deadline = time.monotonic() + 10  # a liveness bound, not a timing assertion
    while store.group.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.group.pending == 0 and store.group.flushes == 1
    store.close()


@pytest.mark.parametrize("level", ["group:1000", "exit"])
def test_a_killed_process_loses_no_deferred_checkpoint(tmp_path: Path, level: str) -> None:
    """The levels trade a machine crash, not a process crash: a commit is in the kernel's
    hands before checkpoint() returns."""
    script = (
        "import os, signal, sys, stashpoint\n"
        "run = stashpoint.open(sys.argv[1], durability=sys.argv[2]).session('s')\n"
        "for i in range(30):\n"
        "    run.checkpoint({'i': i})\n"
        "print(run.store.group.pending, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "s"), level],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert int(proc.stdout) == 30  # none of them had been flushed
    store = stashpoint.open(tmp_path / "s")
    assert len(store.session("s").history()) == 30
    assert store.session("s").state() == {"i": 29}
    assert verify_store(store).ok
    store.close()


def test_exit_level_flushes_when_the_store_closes(tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path / "s", durability="exit")
    run = store.session("s")
    for i in range(20):
        run.checkpoint({"i": i})
    assert store.group.pending == 20 and store.group.flushes == 0
    store.close()
    assert store.group.pending == 0 and store.group.flushes == 1


def test_level_from_url_env_and_store_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STASHPOINT_DURABILITY", raising=False)
    path = tmp_path / "s"
    store = stashpoint.open(path)
    assert store.durability == Durability("fsync")
    store.set_durability("group:16")  # recorded in the store for every later open
    store.close()
    store = stashpoint.open(path)
    assert store.durability == Durability.parse("group:16")
    store.close()
    monkeypatch.setenv("STASHPOINT_DURABILITY", "exit")
    store = stashpoint.open(path)
    assert store.durability.level == "exit"
    store.close()
    store = stashpoint.open(f"sqlite://{path}?durability=fsync")  # the URL wins
    assert store.durability.level == "fsync"
    store.close()
    with pytest.raises(UsageError, match="two durability levels"):
        stashpoint.open(f"sqlite://{path}?durability=fsync", durability="exit")


def _wal_syncs(url: str) -> int:
    """The server's count of WAL syncs. Backends publish their statistics when idle (at most
    once a second) or when they exit, so callers close their store first; this waits until
    the count settles."""
    import psycopg

    last = -1
    with psycopg.connect(url, autocommit=True) as db:
        for _ in range(50):
            row = db.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
            assert row is not None
            if int(row[0]) == last:
                return last
            last = int(row[0])
            time.sleep(0.3)
    return last


def test_postgres_group_commit_syncs_the_wal_far_less(pg_url: str) -> None:  # noqa: F811
    counts: dict[str, int] = {}
    for level in ("fsync", "group:1000"):
        before = _wal_syncs(pg_url)
        store = stashpoint.open(pg_url, durability=level)
        run = store.session(f"s-{level}")
        for i in range(60):
            run.checkpoint({"i": i})
        store.flush()
        assert run.state() == {"i": 59}
        assert verify_store(store).ok
        store.close()  # its connections exit and publish their WAL statistics
        counts[level] = _wal_syncs(pg_url) - before
    print("WAL syncs", counts)
    assert counts["fsync"] >= 60, counts  # one WAL flush per checkpoint
    # The WAL writer flushes deferred commits every wal_writer_delay (200 ms by default).
    assert counts["group:1000"] < counts["fsync"] / 3, counts


def test_cli_init_show_and_bad_level(sp: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    out = json.loads(sp("init", "--durability", "group:8,50ms", "--json", cwd=ws).out)
    assert out["durability"] == "group:8,50ms"
    sp("snap", "-m", "one", cwd=ws)
    shown = json.loads(sp("show", "HEAD", "--json", cwd=ws).out)
    assert shown["durability"]["level"] == "group"
    assert shown["durability"]["every"] == 8
    assert "flush every 8 checkpoints or 50 ms" in sp("show", "HEAD", cwd=ws).out
    bad = sp("init", "--durability", "sometimes", cwd=ws, check=False)
    assert bad.code == 1 and "unknown durability level" in bad.err
    env_level = sp("show", "HEAD", "--json", cwd=ws)  # still the recorded level
    assert json.loads(env_level.out)["durability"]["level"] == "group"
    assert os.path.isdir(ws / ".stashpoint")
