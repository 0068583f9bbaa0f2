"""The agmi suite (Agent Memory Integrity, PyPI ``agent-memory-integrity`` 0.6.3) run against
stashpoint's SQLite store: its nine at-rest attacks T1-T9 through an adapter that edits the
database file as agmi's attacker does (raw edits, no re-hashing; ``tests/test_attacks.py`` is
the stronger attacker that re-hashes). Skipped unless agmi is installed (it is in the ``dev``
extra; it has no dependencies of its own).

The adapter models a record as one checkpoint row of session ``s``; its owner is the session,
so agmi's second context (T6) is session ``other``. The rollback witness lives outside the
store, in a directory of the test (agmi's T9 attacker holds the store's files only).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.errors import IntegrityError, UsageError
from stashpoint.verify import verify_store

agmi = pytest.importorskip("agmi")
from agmi.adapters.base import MemoryAdapter, Record  # noqa: E402
from agmi.attacks.at_rest import AT_REST_ATTACKS_WITH_SNAPSHOT  # noqa: E402

KEY = bytes(range(32))
ENC = bytes(range(32, 64))


_B32 = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _next_id(ident: str) -> str:
    """The id right after ``ident`` (Crockford base32, with carry): it sorts last."""
    digits = [_B32.index(c) for c in ident]
    i = len(digits) - 1
    while digits[i] == 31:
        digits[i] = 0
        i -= 1
    digits[i] += 1
    return "".join(_B32[d] for d in digits)


class StashpointAdapter(MemoryAdapter):  # type: ignore[misc]
    supports_replay = True
    supports_metadata = True
    supports_snapshot = True

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.name = f"stashpoint-sqlite-{mode}"
        self.tmp: Path | None = None

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def home(self) -> Path:
        assert self.tmp is not None
        return self.tmp / "store"

    def _open(self) -> stashpoint.Store:
        return stashpoint.open(
            self.home,
            key=KEY if self.mode == "keyed" else b"",
            encryption_key=ENC if self.mode == "encrypted" else b"",
        )

    def setup(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="agmi-stashpoint-"))
        self._env = os.environ.get("STASHPOINT_WITNESS_DIR")
        os.environ["STASHPOINT_WITNESS_DIR"] = str(self.tmp / "witness")

    def teardown(self) -> None:
        if self._env is None:
            os.environ.pop("STASHPOINT_WITNESS_DIR", None)
        else:
            os.environ["STASHPOINT_WITNESS_DIR"] = self._env
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _seed(self, session: str, n: int) -> None:
        with self._open() as store:
            run = store.session(session)
            for i in range(n):
                run.checkpoint({"memory": f"{session} fact {i}"}, message=f"{session} {i}")

    def seed(self, n: int) -> None:
        self._seed("s", n)

    def seed_other(self, n: int) -> None:
        self._seed("other", n)

    def append_genuine(self) -> None:
        self._seed("s", 1)

    def reload(self) -> None:
        pass  # every verify() opens the store afresh

    def verify(self) -> bool:
        self.verify_detail = None
        try:
            with self._open() as store:
                report = verify_store(store)
                if not report.ok:
                    self.verify_detail = report.problems[0].message
                    return False
                run = store.session("s")
                if run.head is not None:
                    run.state()
        except (IntegrityError, UsageError) as exc:
            self.verify_detail = str(exc).splitlines()[0]
            return False
        return True

    # -- raw rows -----------------------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.home / "store.db", isolation_level=None)

    def _rows(self, session: str) -> list[Record]:
        with self._db() as db:
            rows = db.execute(
                "SELECT id, session, branch, parent, body, digest FROM checkpoints "
                "WHERE session=? ORDER BY id",
                (session,),
            ).fetchall()
        out = []
        for i, (ident, sess, branch, parent, body, digest) in enumerate(rows):
            fields: dict[str, Any] = {
                "id": ident,
                "session": sess,
                "branch": branch,
                "parent": parent,
                "body": body.hex(),
                "digest": digest,
            }
            out.append(Record(seq=i, fields=fields))
        return out

    def read_all_raw(self) -> list[Record]:
        return self._rows("s")

    def read_other_raw(self) -> list[Record]:
        return self._rows("other")

    def write_raw(self, record: Record) -> None:
        f = record.fields
        ids = [r.fields["id"] for r in self.read_all_raw()]
        with self._db() as db:
            if record.seq < len(ids):  # the slot at this position takes the record's content
                db.execute(
                    "UPDATE checkpoints SET branch=?, parent=?, body=?, digest=? WHERE id=?",
                    (
                        f["branch"],
                        f["parent"],
                        bytes.fromhex(f["body"]),
                        f["digest"],
                        ids[record.seq],
                    ),
                )
            else:
                db.execute(
                    "INSERT INTO checkpoints(id, session, branch, parent, body, digest) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        f["id"],
                        f["session"],
                        f["branch"],
                        f["parent"],
                        bytes.fromhex(f["body"]),
                        f["digest"],
                    ),
                )

    def delete_raw(self, seq: int) -> None:
        ident = self.read_all_raw()[seq].fields["id"]
        with self._db() as db:
            db.execute("DELETE FROM checkpoints WHERE id=?", (ident,))

    def replay_onto(self, victim_seq: int, donor: Record) -> None:
        ident = self.read_all_raw()[victim_seq].fields["id"]
        with self._db() as db:
            db.execute(
                "UPDATE checkpoints SET body=?, digest=? WHERE id=?",
                (bytes.fromhex(donor.fields["body"]), donor.fields["digest"], ident),
            )

    # -- what a record says ---------------------------------------------------------------
    def mutate_payload(self, record: Record) -> Record:
        body = bytes.fromhex(record.fields["body"])
        try:
            doc = json.loads(body)
            doc["message"] = str(doc.get("message")) + "  [TAMPERED]"
            body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        except ValueError:  # ciphertext: change a byte
            body = body[:-1] + bytes([body[-1] ^ 1])
        record.fields["body"] = body.hex()
        return record

    def forge_record(self, template: Record) -> Record:
        forged = Record(seq=template.seq + 1, fields=dict(template.fields))
        ident = str(template.fields["id"])
        forged.fields["id"] = _next_id(ident)
        forged.fields["parent"] = ident
        return self.mutate_payload(forged)

    def identity_of(self, record: Record) -> str:
        return str(record.fields["id"])

    def payload_of(self, record: Record) -> str:
        return json.dumps([record.fields["body"], record.fields["digest"]])

    def owner_of(self, record: Record) -> str | None:
        return str(record.fields["session"])

    def read_meta(self, seq: int) -> dict[str, Any]:
        branch = str(self.read_all_raw()[seq].fields["branch"])
        meta: dict[str, Any] = {"branch": branch.removesuffix("-tampered")}
        if branch.endswith("-tampered"):
            meta["agmi_meta_tampered"] = True
        return meta

    def write_meta(self, seq: int, meta: dict[str, Any]) -> None:
        ident = self.read_all_raw()[seq].fields["id"]
        branch = meta["branch"] + ("-tampered" if meta.get("agmi_meta_tampered") else "")
        with self._db() as db:
            db.execute("UPDATE checkpoints SET branch=? WHERE id=?", (branch, ident))

    def snapshot_store(self) -> object:
        return self._copy_store(self.home)

    def restore_store(self, token: object) -> None:
        self._restore_store(str(token), self.home)


@pytest.mark.parametrize("mode", ["unkeyed", "keyed", "encrypted"])
@pytest.mark.parametrize("attack", AT_REST_ATTACKS_WITH_SNAPSHOT, ids=lambda a: a.name)
def test_agmi_at_rest_attack(attack: type[Any], mode: str) -> None:
    result = attack().run(StashpointAdapter(mode))
    assert result.error is None and result.guard is None, (result.error, result.guard)
    assert result.detected, f"{result.attack} on {mode}: {result.detail}"
