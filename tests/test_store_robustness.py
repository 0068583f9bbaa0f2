"""A store that is damaged, unreachable or on a full disk, driven through the CLI as a user types
it: the command says what is wrong in one clear message, with the documented exit code, and
shows whatever is still intact.

The damage is done the way a disk or an editor would do it (raw SQLite edits, bytes overwritten
inside the database file); the stores are real SQLite files and a real PostgreSQL server.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

import stashpoint
import stashpoint.session

from .conftest import Result

Sp = Callable[..., Result]
EXIT_USER, EXIT_INTEGRITY = 1, 2


def _snaps(sp: Sp, ws: Path, n: int) -> list[str]:
    """``n`` checkpoints of a changing workspace, oldest first."""
    ids = []
    for i in range(n):
        (ws / "notes.txt").write_text(f"version {i}\n")
        ids.append(json.loads(sp("snap", "-m", f"step {i}", "--json", cwd=ws).out)["id"])
    return ids


def _damage_body(db: Path, ident: str) -> None:
    """Alter one byte-for-byte field of a checkpoint record: its digest no longer matches."""
    with closing(sqlite3.connect(db)) as con, con:
        (body,) = con.execute("SELECT body FROM checkpoints WHERE id=?", (ident,)).fetchone()
        changed = bytes(body).replace(b'"step 0"', b'"step X"')
        assert changed != bytes(body)
        con.execute("UPDATE checkpoints SET body=? WHERE id=?", (changed, ident))


# -- a damaged record does not hide the intact ones -----------------------------------------


def test_log_lists_the_intact_checkpoints_then_names_the_damaged_record(
    sp: Sp, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    first, second, third = _snaps(sp, ws, 3)
    _damage_body(ws / ".stashpoint" / "store.db", first)

    res = sp("log", cwd=ws, check=False)
    assert res.code == EXIT_INTEGRITY, res
    lines = res.out.splitlines()
    assert [line.split()[0] for line in lines] == [third[:12], second[:12]], res.out
    assert first in res.err and "corrupt" in res.err, res.err
    assert "Traceback" not in res.err

    res = sp("log", "--graph", cwd=ws, check=False)
    assert res.code == EXIT_INTEGRITY and first in res.err, res
    assert second[:12] in res.out and third[:12] in res.out, res.out


def test_log_json_prints_the_intact_checkpoints_and_exits_2(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    first, second, third = _snaps(sp, ws, 3)
    _damage_body(ws / ".stashpoint" / "store.db", first)

    res = sp("log", "--json", cwd=ws, check=False)
    assert res.code == EXIT_INTEGRITY, res
    assert [c["id"] for c in json.loads(res.out)] == [third, second]
    assert first in res.err and "Traceback" not in res.err, res.err


def test_history_without_a_collector_still_raises_on_a_damaged_record(
    sp: Sp, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    first, second, third = _snaps(sp, ws, 3)
    _damage_body(ws / ".stashpoint" / "store.db", first)
    with closing(stashpoint.open(ws / ".stashpoint")) as store:
        session = store.session("main")
        with pytest.raises(stashpoint.IntegrityError) as info:
            session.history()
        assert info.value.checkpoint == first
        damaged: list[stashpoint.IntegrityError] = []
        assert [c.id for c in session.history(damaged=damaged)] == [third, second]
        assert [e.checkpoint for e in damaged] == [first]


# -- the log follows the parent chain, not the ids ---------------------------------------------


@pytest.fixture
def same_millisecond_ids(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Checkpoint ids as two processes make them in one millisecond: the second process's
    random part happens to be smaller, so its checkpoint (a child of the first) sorts first.
    Then a later millisecond for a third checkpoint."""
    from stashpoint._ids import new_id

    ms = new_id()[:10]
    later = new_id()
    while later[:10] == ms:
        later = new_id()
    ids = [ms + "8" + "0" * 15, ms + "7" + "Z" * 15, later]
    queue = list(ids)
    monkeypatch.setattr(stashpoint.session, "new_id", lambda: queue.pop(0))
    yield ids


def test_log_orders_checkpoints_by_their_parent_chain(
    sp: Sp, tmp_path: Path, same_millisecond_ids: list[str]
) -> None:
    first, second, third = same_millisecond_ids
    assert second < first  # the child's id sorts before its parent's
    ws = tmp_path / "ws"
    ws.mkdir()
    st = tmp_path / "st"
    with closing(stashpoint.open(st)) as store:
        run = store.session("main", workspace=ws)
        for i in range(3):
            (ws / "notes.txt").write_text(f"version {i}\n")
            run.checkpoint(message=f"step {i}")
        assert [c.parent for c in run.history()] == [second, first, None]

    out = json.loads(sp("--store", str(st), "log", "--json", cwd=ws).out)
    assert [c["id"] for c in out] == [third, second, first]
    text = sp("--store", str(st), "log", cwd=ws).out.splitlines()
    assert [line.split()[0] for line in text] == [third[:12], second[:12], first[:12]]
    limited = json.loads(sp("--store", str(st), "log", "-n", "2", "--json", cwd=ws).out)
    assert [c["id"] for c in limited] == [third, second]


# -- a malformed database file is an integrity failure ---------------------------------------


def _corrupt_pages(db: Path, tables: tuple[str, ...]) -> None:
    """Overwrite the head of these tables' root pages in the file itself, as a bad disk
    sector would: SQLite then answers "database disk image is malformed"."""
    with closing(sqlite3.connect(db)) as con:
        size = con.execute("PRAGMA page_size").fetchone()[0]
        marks = ",".join("?" * len(tables))
        roots = [
            r[0]
            for r in con.execute(
                f"SELECT rootpage FROM sqlite_master WHERE tbl_name IN ({marks})", tables
            )
        ]
    assert roots
    with open(db, "r+b") as f:
        for page in roots:
            f.seek((page - 1) * size)
            f.write(b"\xff" * 64)


def test_a_malformed_database_page_fails_every_command_with_exit_2(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    _snaps(sp, ws, 3)
    db = ws / ".stashpoint" / "store.db"
    _corrupt_pages(db, ("checkpoints",))

    for command in (["verify"], ["log"], ["log", "--json"], ["show", "HEAD"], ["gc"]):
        res = sp(*command, cwd=ws, check=False)
        assert res.code == EXIT_INTEGRITY, (command, res)
        assert "Traceback" not in res.err, res.err
        assert "damaged" in res.err and "malformed" in res.err and str(db) in res.err, res.err


# -- an unreachable PostgreSQL fails at once, in one line ------------------------------------


@pytest.mark.parametrize("where", ["missing database", "closed port"])
def test_an_unreachable_postgres_store_fails_in_one_line(
    sp: Sp, tmp_path: Path, where: str
) -> None:
    from urllib.parse import urlsplit

    from .test_postgres import BASE_URL, _server_or_skip

    _server_or_skip()  # the missing database needs a server that says so
    parts = urlsplit(BASE_URL)
    if where == "missing database":
        url = parts._replace(path="/sp_no_such_db_" + uuid.uuid4().hex[:8]).geturl()
        reason = "does not exist"
    else:
        url = parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:1").geturl()
        reason = "refused"
    ws = tmp_path / "ws"
    ws.mkdir()
    for command in (["log"], ["snap", "-m", "x"]):
        res = sp("--store", url, *command, cwd=ws, check=False)
        assert res.code == EXIT_USER, res
        lines = res.err.splitlines()
        assert len(lines) == 1, res.err  # no pool warnings, no libpq hint lines
        assert lines[0].startswith("error: cannot connect to PostgreSQL:"), res.err
        assert reason in lines[0], res.err
        assert "pool" not in res.err, res.err
