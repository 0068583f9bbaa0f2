"""A mirror store witnesses its primary: it is written after the primary, with the primary's
sequence numbers, so a primary older than its mirror (restored from an old copy, its newest
rows dropped) or with another head at the same sequence number (a forged or forked tip) is
refused on any machine that opens it with its mirror, even without this user's local
witness. A primary merely ahead of its mirror is lag. Real SQLite stores, the CLI as typed."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

import stashpoint
from stashpoint.errors import IntegrityError, RollbackError
from stashpoint.mirror import compare_stores

KEY = b"k" * 32


def _backup(src: Path, dst: Path) -> None:
    """A consistent copy of a SQLite store (WAL included), as a backup tool would make."""
    a, b = sqlite3.connect(src), sqlite3.connect(dst)
    a.backup(b)
    a.close()
    b.close()


def _no_local_witness(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another machine, or a user who never saw the newer state: only the mirror can tell."""
    monkeypatch.setenv("STASHPOINT_WITNESS", "off")


@pytest.mark.parametrize("key", [None, KEY], ids=["unkeyed", "keyed"])
def test_the_mirror_carries_the_primarys_sequence_numbers(
    tmp_path: Path, key: bytes | None
) -> None:
    primary, mirror = str(tmp_path / "p.db"), str(tmp_path / "m.db")
    with stashpoint.open(primary, key=key) as store:
        run = store.session("main")
        for i in range(3):
            run.checkpoint({"i": i})
    with stashpoint.open(primary, key=key, mirror=mirror) as store:
        store.session("main").checkpoint({"i": 3})
    with stashpoint.open(primary, key=key) as p, stashpoint.open(mirror, key=key) as m:
        assert p.refs.head_seq("main", "main") == m.refs.head_seq("main", "main")
        assert p.refs.head_seq("main", "main")[1] == 4  # type: ignore[index]


@pytest.mark.parametrize("key", [None, KEY], ids=["unkeyed", "keyed"])
def test_a_primary_restored_from_an_older_copy_is_refused_by_its_mirror(
    tmp_path: Path, key: bytes | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_local_witness(monkeypatch)
    primary, mirror = tmp_path / "p.db", str(tmp_path / "m.db")
    with stashpoint.open(primary, key=key, mirror=mirror) as store:
        run = store.session("main")
        run.checkpoint({"i": 0})
        _backup(primary, tmp_path / "old.db")
        newest = [run.checkpoint({"i": i}).id for i in (1, 2)][-1]
    _backup(tmp_path / "old.db", primary)  # the newest rows are gone, every row genuine

    with stashpoint.open(primary, key=key) as store:  # alone, nothing can tell
        assert store.session("main").head is not None
    with (
        pytest.raises(RollbackError, match="rolled back from seq 3 to 1"),
        stashpoint.open(primary, key=key, mirror=mirror) as store,
    ):
        store.session("main").head  # noqa: B018 - reading the head is the check
    with stashpoint.open(mirror, key=key) as m, stashpoint.open(primary, key=key) as p:
        report = compare_stores(p, m)
    assert not report.ok
    assert any("rolled back from seq 3 to 1" in d.message for d in report.damaged)
    assert newest in {d.checkpoint for d in report.damaged} | {
        d.checkpoint for d in report.behind
    } or any(newest in d.message for d in report.damaged)

    # Accepted on purpose: the mirror follows the primary back, and it opens again.
    with stashpoint.open(primary, key=key, mirror=mirror, accept_rollback=True) as store:
        after = store.session("main").checkpoint({"i": "after"}).id
    with stashpoint.open(primary, key=key, mirror=mirror) as store:
        head = store.session("main").head
        assert head is not None and head.id == after


def test_a_forged_tip_at_the_same_sequence_is_damage_not_lag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unkeyed: moving a head and keeping its row's sequence number fools the primary alone."""
    _no_local_witness(monkeypatch)
    primary, mirror = tmp_path / "p.db", str(tmp_path / "m.db")
    with stashpoint.open(primary, mirror=mirror) as store:
        run = store.session("main")
        ids = [run.checkpoint({"i": i}).id for i in range(3)]
    con = sqlite3.connect(primary)
    con.execute("UPDATE heads SET checkpoint = ? WHERE session = 'main'", (ids[0],))
    con.commit()
    con.close()
    with stashpoint.open(primary) as store:
        head = store.session("main").head
        assert head is not None and head.id == ids[0]  # accepted without the mirror
    with (
        pytest.raises(IntegrityError, match="forged or forked tip") as info,
        stashpoint.open(primary, mirror=mirror) as store,
    ):
        store.session("main").head  # noqa: B018
    assert not isinstance(info.value, RollbackError)
    with stashpoint.open(mirror) as m, stashpoint.open(primary) as p:
        report = compare_stores(p, m)
    assert [d.message for d in report.damaged if "forged or forked tip" in d.message]


def test_a_primary_ahead_of_its_mirror_is_lag_and_catches_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_local_witness(monkeypatch)
    primary, mirror = str(tmp_path / "p.db"), str(tmp_path / "m.db")
    with stashpoint.open(primary, mirror=mirror) as store:
        store.session("main").checkpoint({"i": 0})
    with stashpoint.open(primary) as store:  # written without the mirror: it lags
        for i in (1, 2):
            store.session("main").checkpoint({"i": i})
    with stashpoint.open(mirror) as m, stashpoint.open(primary) as p:
        report = compare_stores(p, m)
    assert report.ok and report.behind
    with stashpoint.open(primary, mirror=mirror) as store:
        store.session("main").checkpoint({"i": 3})
    with stashpoint.open(mirror) as m, stashpoint.open(primary) as p:
        report = compare_stores(p, m)
        assert report.ok and not report.behind
        assert p.refs.head_seq("main", "main") == m.refs.head_seq("main", "main")


def test_cli_refuses_a_rolled_back_primary_with_its_mirror(tmp_path: Path, sp) -> None:  # type: ignore[no-untyped-def]
    """As typed, on a machine whose local witness never saw the newer state."""
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    m = ["--mirror", f"file://{tmp_path / 'mirror'}"]
    sp(*m, "snap", "-m", "first", cwd=ws)
    db = ws / ".stashpoint" / "store.db"
    _backup(db, tmp_path / "old.db")
    for text in ("two\n", "three\n"):
        (ws / "a.txt").write_text(text)
        sp(*m, "snap", cwd=ws)
    with stashpoint.open(db) as store:
        witness = Path(os.environ["STASHPOINT_WITNESS_DIR"]) / f"{store.id}.json"
    _backup(tmp_path / "old.db", db)
    witness.unlink()  # this user's own witness would refuse it too

    assert sp("log", cwd=ws).code == 0  # the primary alone cannot tell
    res = sp(*m, "log", cwd=ws, check=False)
    assert res.code == 2 and "rolled back from seq 3 to 1" in res.err, res.err
    res = sp(*m, "--accept-rollback", "verify", "--mirror", "--json", cwd=ws, check=False)
    assert res.code == 2
    damage = [d["message"] for d in json.loads(res.out)["damaged"]]
    assert any("rolled back from seq 3 to 1" in d for d in damage), damage
    sp(*m, "--accept-rollback", "snap", "-m", "after the restore", cwd=ws)
    assert sp(*m, "log", cwd=ws).code == 0
