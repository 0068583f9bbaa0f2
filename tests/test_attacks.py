"""An attack suite against the store at rest: an attacker who can write the SQLite file (but
holds no key) edits it, and the victim's next open, verify and reads must notice.

The attacker adapter recomputes every digest it can: unkeyed digests are plain SHA-256, so it
rewrites a whole chain after an edit, and bumps a ref's sequence number when it moves it. It
cannot compute a keyed digest or a ref MAC; it can replay rows it saw earlier (it watched the
store while the victim worked). The rollback witness lives outside the store, where the
attacker cannot reach (``STASHPOINT_WITNESS_DIR``, a directory of the test).

T1-T9 follow the agmi suite's at-rest attacks (content tamper, tail truncation, middle
deletion, reorder, forged insertion, cross-session replay, rollback replay, metadata tamper,
whole-store snapshot rollback); the rest are stashpoint's own: a head or label moved, the
integrity marker forged, a keyed store opened without its key. ``EXPECTED`` is the table
docs/security.md prints: what each mode rejects.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

import stashpoint
from stashpoint.errors import IntegrityError, StashpointError, UsageError
from stashpoint.verify import verify_store

KEY = bytes(range(32))
ENC = bytes(range(32, 64))
MODES = ("unkeyed", "keyed", "encrypted")


def _open(home: Path, mode: str, **kw: object) -> stashpoint.Store:
    return stashpoint.open(
        home,
        key=KEY if mode == "keyed" else b"",
        encryption_key=ENC if mode == "encrypted" else b"",
        **kw,  # type: ignore[arg-type]
    )


@dataclass
class Seeded:
    home: Path
    mode: str
    ids: list[str]
    other: list[str]
    captured: list[tuple[str, str | None]] = field(default_factory=list)
    """The ``main`` head row (checkpoint, auth) after each checkpoint: what the attacker saw."""
    labels: dict[str, tuple[str, str | None]] = field(default_factory=dict)


def seed(home: Path, mode: str) -> Seeded:
    """Five checkpoints in session ``s`` (label ``L4`` on the last) and two in ``other``."""
    got = Seeded(home, mode, [], [])
    with _open(home, mode) as store:
        run = store.session("s")
        for i in range(5):
            cp = run.checkpoint({"n": i, "note": f"genuine {i}"}, label=f"L{i}" if i == 4 else None)
            got.ids.append(cp.id)
            row = store.refs.inner.head_row("s", "main")
            assert row is not None
            got.captured.append(row)
        got.labels = store.refs.inner.label_rows("s")
        other = store.session("other")
        got.other = [other.checkpoint({"m": i}).id for i in range(2)]
    return got


class Attacker:
    """Edits the SQLite file directly; recomputes what needs no key."""

    def __init__(self, home: Path, mode: str) -> None:
        self.db = sqlite3.connect(home / "store.db", isolation_level=None)
        self.mode = mode

    def close(self) -> None:
        self.db.close()

    def row(self, ident: str) -> tuple[str, str, str | None, bytes, str]:
        got = self.db.execute(
            "SELECT session, branch, parent, body, digest FROM checkpoints WHERE id=?", (ident,)
        ).fetchone()
        assert got is not None
        return got  # type: ignore[no-any-return]

    def write(self, ident: str, record: dict[str, object]) -> str:
        """Store a (changed) record with a recomputed unkeyed digest, and re-chain every
        descendant so each parent link matches again."""
        record = dict(record, digest="")
        body = msgspec.json.encode(record, order="sorted")
        digest = hashlib.sha256(b"stashpoint-checkpoint-v1\n" + body).hexdigest()
        self.db.execute(
            "UPDATE checkpoints SET body=?, digest=?, parent=?, session=?, branch=? WHERE id=?",
            (body, digest, record["parent"], record["session"], record["branch"], ident),
        )
        for (child,) in self.db.execute(
            "SELECT id FROM checkpoints WHERE parent=?", (ident,)
        ).fetchall():
            self.write(child, dict(self.record(child), parent_digest=digest))
        return digest

    def record(self, ident: str) -> dict[str, object]:
        body = self.row(ident)[3]
        try:
            got: dict[str, object] = json.loads(body)
        except ValueError:  # encrypted: ciphertext the attacker cannot rewrite
            raise Unreadable from None
        return got

    def flip(self, ident: str) -> None:
        """Damage a record the attacker cannot decode (an encrypted one)."""
        body = bytearray(self.row(ident)[3])
        body[len(body) // 2] ^= 1
        self.db.execute("UPDATE checkpoints SET body=? WHERE id=?", (bytes(body), ident))

    def edit(self, ident: str, change: Callable[[dict[str, object]], None]) -> None:
        try:
            record = self.record(ident)
        except Unreadable:
            self.flip(ident)
            return
        change(record)
        self.write(ident, record)

    def move_head(self, target: str, replay: tuple[str, str | None] | None = None) -> None:
        """Point ``main`` at ``target``: unkeyed, with the sequence number bumped past any
        witness (all an unkeyed ref needs); keyed, replaying the row seen earlier for that
        target when there is one (a MAC it cannot compute)."""
        cur = self.db.execute("SELECT auth FROM heads WHERE session='s' AND branch='main'")
        auth = cur.fetchone()[0]
        if self.mode == "unkeyed":
            auth = str(int(str(auth).partition(".")[0]) + 1)
        elif replay is not None and replay[0] == target:
            auth = replay[1]
        self.db.execute(
            "UPDATE heads SET checkpoint=?, auth=? WHERE session='s' AND branch='main'",
            (target, auth),
        )


class Unreadable(Exception):
    pass


def detected(home: Path, mode: str) -> bool:
    """Whether the victim notices: opening, verify, the head, labels, a label's target."""
    try:
        with _open(home, mode) as store:
            if not verify_store(store).ok:
                return True
            run = store.session("s")
            run.branches()
            labels = run.labels()
            if "L4" not in labels.values():
                return True
            run.state(store.resolve("L4", "s"))
            run.state(run.head.id if run.head is not None else "")
    except (IntegrityError, UsageError):
        return True
    return False


# -- the attacks --------------------------------------------------------------------------
def t1_content_tamper(a: Attacker, s: Seeded) -> None:
    a.edit(s.ids[2], lambda r: r.update(message="attacker was here"))


def t2_tail_truncation(a: Attacker, s: Seeded) -> None:
    a.move_head(s.ids[2], replay=s.captured[2])
    for ident in s.ids[3:]:
        a.db.execute("DELETE FROM checkpoints WHERE id=?", (ident,))
    a.db.execute("DELETE FROM labels WHERE checkpoint=?", (s.ids[4],))
    a.db.execute(
        "INSERT INTO labels(checkpoint, session, label, auth) VALUES (?, 's', 'L4', ?)",
        (s.ids[2], "1" if a.mode == "unkeyed" else s.labels[s.ids[4]][1]),
    )


def t3_middle_deletion(a: Attacker, s: Seeded) -> None:
    a.db.execute("DELETE FROM checkpoints WHERE id=?", (s.ids[2],))
    try:
        record = a.record(s.ids[3])
    except Unreadable:
        return
    parent = a.record(s.ids[1])
    record.update(parent=s.ids[1], parent_digest=a.row(s.ids[1])[4])
    del parent
    a.write(s.ids[3], record)


def t4_reorder(a: Attacker, s: Seeded) -> None:
    try:
        two, three = a.record(s.ids[2]), a.record(s.ids[3])
    except Unreadable:
        b2, b3 = a.row(s.ids[2])[3], a.row(s.ids[3])[3]
        a.db.execute("UPDATE checkpoints SET body=? WHERE id=?", (b3, s.ids[2]))
        a.db.execute("UPDATE checkpoints SET body=? WHERE id=?", (b2, s.ids[3]))
        return
    for k in ("state", "step", "created_at"):  # swap what the two say, keep their places
        two[k], three[k] = three[k], two[k]
    a.write(s.ids[2], two)
    three["parent_digest"] = a.row(s.ids[2])[4]
    a.write(s.ids[3], three)


def t5_forged_insertion(a: Attacker, s: Seeded) -> None:
    ident = s.ids[4][:-1] + ("Z" if s.ids[4][-1] != "Z" else "Y")
    try:
        record = a.record(s.ids[4])
    except Unreadable:
        session, branch, _parent, body, digest = a.row(s.ids[4])
        a.db.execute(
            "INSERT INTO checkpoints(id, session, branch, parent, body, digest) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (ident, session, branch, s.ids[4], body, digest),
        )
        a.move_head(ident)
        return
    record.update(id=ident, parent=s.ids[4], parent_digest=a.row(s.ids[4])[4], message="forged")
    a.db.execute(
        "INSERT INTO checkpoints(id, session, branch, parent, body, digest) "
        "VALUES (?, 's', 'main', ?, x'', '')",
        (ident, s.ids[4]),
    )
    a.write(ident, record)
    a.move_head(ident)


def t6_cross_session_replay(a: Attacker, s: Seeded) -> None:
    body, digest = a.row(s.other[1])[3:]
    a.db.execute("UPDATE checkpoints SET body=?, digest=? WHERE id=?", (body, digest, s.ids[2]))


def t7_rollback_replay(a: Attacker, s: Seeded) -> None:
    body, digest = a.row(s.ids[1])[3:]  # an older genuine record of the same session
    a.db.execute("UPDATE checkpoints SET body=?, digest=? WHERE id=?", (body, digest, s.ids[3]))


def t8_metadata_tamper(a: Attacker, s: Seeded) -> None:
    a.db.execute("UPDATE checkpoints SET branch='elsewhere' WHERE id=?", (s.ids[2],))


def head_moved_back(a: Attacker, s: Seeded) -> None:
    a.move_head(s.ids[2], replay=s.captured[2])


def head_moved_no_replay(a: Attacker, s: Seeded) -> None:
    a.move_head(s.ids[2])


def label_moved(a: Attacker, s: Seeded) -> None:
    a.db.execute("UPDATE labels SET checkpoint=? WHERE label='L4'", (s.ids[0],))


def marker_forged(a: Attacker, s: Seeded) -> None:
    a.db.execute("UPDATE meta SET value='0123456789abcdef' WHERE key='integrity'")
    a.db.execute("UPDATE meta SET value=? WHERE key='store_id'", ("f" * 32,))


ATTACKS: dict[str, Callable[[Attacker, Seeded], None]] = {
    "T1 content tamper": t1_content_tamper,
    "T2 tail truncation": t2_tail_truncation,
    "T3 middle deletion": t3_middle_deletion,
    "T4 reorder": t4_reorder,
    "T5 forged insertion": t5_forged_insertion,
    "T6 cross-session replay": t6_cross_session_replay,
    "T7 rollback replay": t7_rollback_replay,
    "T8 metadata tamper": t8_metadata_tamper,
    "head moved back (old row replayed)": head_moved_back,
    "head moved back (no old row)": head_moved_no_replay,
    "label moved onto checkpoint 0": label_moved,
    "integrity marker and store id forged": marker_forged,
}

R, A = "rejected", "accepted"
EXPECTED: dict[str, tuple[str, str, str]] = {
    # attack: (unkeyed, keyed, encrypted)
    "T1 content tamper": (A, R, R),
    "T2 tail truncation": (A, R, R),
    "T3 middle deletion": (A, R, R),
    "T4 reorder": (A, R, R),
    "T5 forged insertion": (A, R, R),
    "T6 cross-session replay": (R, R, R),
    "T7 rollback replay": (R, R, R),
    "T8 metadata tamper": (R, R, R),
    "head moved back (old row replayed)": (A, R, R),
    "head moved back (no old row)": (A, R, R),
    "label moved onto checkpoint 0": (A, R, R),
    "integrity marker and store id forged": (A, R, R),
    "T9 whole-store snapshot rollback": (R, R, R),
    "keyed store opened without its key": ("n/a", R, R),
    "stat cache poisoned": (A, R, R),
}


@pytest.fixture(autouse=True)
def _witness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STASHPOINT_WITNESS_DIR", str(tmp_path / "witness"))
    monkeypatch.delenv("STASHPOINT_ACCEPT_ROLLBACK", raising=False)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_attack(tmp_path: Path, attack: str, mode: str) -> None:
    s = seed(tmp_path / "store", mode)
    assert not detected(s.home, mode), "the untouched store must verify"
    a = Attacker(s.home, mode)
    try:
        ATTACKS[attack](a, s)
    finally:
        a.close()
    got = R if detected(s.home, mode) else A
    assert got == EXPECTED[attack][MODES.index(mode)], f"{attack} / {mode}: {got}"


@pytest.mark.parametrize("mode", MODES)
def test_t9_whole_store_snapshot_rollback(tmp_path: Path, mode: str) -> None:
    """Copy the SQLite file, checkpoint more, put the old file back: the witness notices;
    accepting the rollback explicitly lets the store open, and the witness follows it."""
    s = seed(tmp_path / "store", mode)
    snapshot = tmp_path / "snapshot.db"
    shutil.copy(s.home / "store.db", snapshot)
    with _open(s.home, mode) as store:
        store.session("s").checkpoint({"n": 99})
    shutil.copy(snapshot, s.home / "store.db")
    assert detected(s.home, mode)
    refused = pytest.raises(stashpoint.RollbackError, match=r"store rolled back from seq 6 to 5")
    with refused, _open(s.home, mode) as store:
        store.session("s").state()
    with _open(s.home, mode, accept_rollback=True) as store:
        assert store.session("s").state() == {"n": 4, "note": "genuine 4"}
    assert not detected(s.home, mode)  # accepted: the witness followed the store back
    assert EXPECTED["T9 whole-store snapshot rollback"][MODES.index(mode)] == R


@pytest.mark.parametrize("mode", ["keyed", "encrypted"])
def test_keyed_store_opened_without_its_key(tmp_path: Path, mode: str) -> None:
    s = seed(tmp_path / "store", mode)
    with (
        pytest.raises(StashpointError),
        stashpoint.open(s.home, key=b"", encryption_key=b"") as store,
    ):
        store.session("s").state()


def test_rollback_is_exit_2_in_the_cli(tmp_path: Path, sp: Callable[..., object]) -> None:
    s = seed(tmp_path / "store", "unkeyed")
    snapshot = tmp_path / "snapshot.db"
    shutil.copy(s.home / "store.db", snapshot)
    with _open(s.home, "unkeyed") as store:
        store.session("s").checkpoint({"n": 99})
    shutil.copy(snapshot, s.home / "store.db")
    res = sp("--store", str(s.home), "--session", "s", "log", check=False)
    assert res.code == 2 and "rolled back from seq 6 to 5" in res.err  # type: ignore[attr-defined]
    res = sp("--store", str(s.home), "verify", check=False)
    assert res.code == 2 and "rolled back" in res.out + res.err  # type: ignore[attr-defined]


def _file_digest(store: stashpoint.Store, cp: object, name: bytes) -> bytes:
    from stashpoint.workspace.tree import TreeReader

    ws = cp.workspace  # type: ignore[attr-defined]
    for path, entry in TreeReader(store.blobs).walk(bytes.fromhex(ws.tree)):
        if path == name:
            return entry.ref
    raise AssertionError(f"{name!r} not in the checkpoint")


@pytest.mark.parametrize("mode", MODES)
def test_stat_cache_poisoning(tmp_path: Path, mode: str) -> None:
    """The attacker points an unchanged file's cache entry at the digest of its older
    content (a blob the store holds) and drops the directory entries so the scan consults
    it. Keyed and encrypted stores ignore the altered cache and re-read the file; an unkeyed
    store cannot tell (the table in docs/security.md says so)."""
    ws, home = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    f = ws / "a.txt"

    def write(text: str, age_s: int) -> None:
        f.write_text(text)
        t = time.time_ns() - age_s * 1_000_000_000 + 123_456  # old, not racy, not whole
        os.utime(f, ns=(t, t))

    with _open(home, mode) as store:
        run = store.session("s", workspace=ws)
        write("v1 genuine", 30)
        run.checkpoint({"n": 1})
        write("v2 genuine", 20)
        run.checkpoint({"n": 2})
        run.checkpoint({"n": 3})  # unchanged: vouched for by the cache
    old, real = hashlib.sha256(b"v1 genuine").digest(), hashlib.sha256(b"v2 genuine").digest()
    (cache_file,) = (home / "cache").glob("stat-*.bin")
    raw = cache_file.read_bytes()
    if mode == "unkeyed":
        disk = msgspec.msgpack.decode(raw)
        assert b"a.txt" in disk[4]
        i = disk[4].index(b"a.txt")
        disk[5][i][5] = old
        disk[8], disk[9] = [], []  # no tree entries: the scan goes down to the file entry
        cache_file.write_bytes(msgspec.msgpack.encode(disk))
    elif mode == "keyed":  # the MAC cannot be recomputed: the old one stays in front
        mac, disk = raw[:32], msgspec.msgpack.decode(raw[32:])
        i = disk[4].index(b"a.txt")
        disk[5][i][5] = old
        disk[8], disk[9] = [], []
        cache_file.write_bytes(mac + msgspec.msgpack.encode(disk))
    else:  # ciphertext: no digest to find; the attacker flips a byte
        assert b"a.txt" not in raw and real not in raw
        cache_file.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    with _open(home, mode) as store:
        run = store.session("s", workspace=ws)
        cp = run.checkpoint({"n": 4})
        got = _file_digest(store, cp, b"a.txt")
        assert verify_store(store).ok
    expected = EXPECTED["stat cache poisoned"][MODES.index(mode)]
    assert (got == real) == (expected == R), (mode, got == old)
