"""Encryption at rest on real SQLite files and PostgreSQL.

Stores are damaged the way someone with write access to the database would: ciphertexts copied
between rows, plaintext rows planted, bytes flipped - with raw SQL, never through stashpoint.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.crypto import Cipher, key_from_env, parse_key
from stashpoint.errors import EncryptionKeyError, IntegrityError, UsageError
from stashpoint.session import StashpointWarning
from stashpoint.stores.base import MetadataStore
from stashpoint.testing.conformance import MetadataStoreConformance

from .conftest import snapshot_tree
from .test_postgres import pg_url  # noqa: F401 - the fixture: a fresh schema per test
from .test_redis import redis_url  # noqa: F401 - the fixture: a fresh key prefix per test

KEY = bytes(range(32))
KEY_HEX = KEY.hex()
OTHER = bytes(range(1, 33))
SECRETS = [b"the launch code is 0000", b"file body: hunter2 hunter2", b"assistant says swordfish"]


def _state(extra: str = "") -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "the launch code is 0000"},
            {"role": "assistant", "content": "assistant says swordfish" + extra},
        ],
        "plan": ["step one", "step two" + extra],
        "blob": b"\x00\x01raw bytes",
    }


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("file body: hunter2 hunter2\n" * 50)
    (ws / "big.bin").write_bytes(os.urandom(3 << 20))  # chunked: loose chunk files
    return ws


def _store_bytes(home: Path) -> bytes:
    """Every byte the store keeps on disk (database, WAL, chunk files, packs)."""
    return b"".join(p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file())


# -- round trips on real backends -------------------------------------------------------------


def _round_trip(store: stashpoint.Store, ws: Path) -> None:
    s = store.session("main", workspace=ws)
    cp1 = s.checkpoint(_state(), message="first")
    before = snapshot_tree(ws)
    (ws / "src" / "app.py").write_text("changed\n")
    s.checkpoint(_state(" again"), message="second")
    assert s.state(cp1.id) == _state()
    s.rewind(cp1.id)
    assert snapshot_tree(ws) == before
    assert s.state() == _state()
    from stashpoint.verify import verify_store

    assert verify_store(store).problems == []


def test_round_trip_sqlite_and_nothing_readable_on_disk(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    with stashpoint.open(tmp_path / "st", encryption_key=KEY) as store:
        assert store.cipher is not None and store.hasher.keyed
        _round_trip(store, ws)
    raw = _store_bytes(tmp_path / "st")
    for secret in SECRETS:
        assert secret not in raw
    assert b"step one" not in raw and b"first" not in raw  # records (messages) too
    meta = json.loads(_sql(tmp_path, "SELECT value FROM meta WHERE key='encryption'")[0][0])
    assert meta == {"cipher": "AES-256-GCM", "kdf": "HKDF-SHA256", "key_id": Cipher(KEY).key_id}
    assert KEY_HEX not in raw.decode("latin-1") and KEY not in raw


def test_unencrypted_store_is_readable_on_disk(tmp_path: Path) -> None:
    """The control for the test above: the same secrets are visible without a key."""
    with stashpoint.open(tmp_path / "st") as store:
        store.session("main").checkpoint(_state())
    assert b"assistant says swordfish" in _store_bytes(tmp_path / "st")


def test_round_trip_postgres(tmp_path: Path, pg_url: str) -> None:  # noqa: F811
    with stashpoint.open(pg_url, encryption_key=KEY) as store:
        _round_trip(store, _workspace(tmp_path))
    import psycopg

    with psycopg.connect(pg_url) as db:
        rows = db.execute(
            "SELECT data FROM sp_blobs UNION ALL SELECT data FROM sp_messages"
        ).fetchall()
        rows += db.execute("SELECT body FROM sp_checkpoints").fetchall()
    raw = b"".join(bytes(r[0]) for r in rows)
    for secret in SECRETS:
        assert secret not in raw
    with pytest.raises(EncryptionKeyError, match=Cipher(KEY).key_id):
        stashpoint.open(pg_url, encryption_key=OTHER)


def test_round_trip_redis(tmp_path: Path, redis_url: str) -> None:  # noqa: F811
    with stashpoint.open(redis_url, encryption_key=KEY) as store:
        _round_trip(store, _workspace(tmp_path))
    import redis

    base, prefix = redis_url.split("?prefix=")
    client = redis.Redis.from_url(base)
    parts: list[bytes] = []
    for k in client.scan_iter(match=f"{prefix}*"):
        kind = client.type(k)
        if kind == b"string":
            parts.append(client.get(k) or b"")
        elif kind == b"hash":
            parts += [b"%s=%s" % kv for kv in client.hgetall(k).items()]
        elif kind == b"list":
            parts += client.lrange(k, 0, -1)
        elif kind == b"zset":
            parts += client.zrange(k, 0, -1)
        elif kind == b"set":
            parts += list(client.smembers(k))
    client.close()
    raw = b"".join(parts)
    assert len(raw) > 1000  # we did read the store
    for secret in SECRETS:
        assert secret not in raw
    with pytest.raises(EncryptionKeyError, match="STASHPOINT_KEY"):
        stashpoint.open(redis_url)


# -- keys ---------------------------------------------------------------------------------------


def test_missing_key_names_the_env_var_and_wrong_key_names_the_key_id(tmp_path: Path) -> None:
    stashpoint.open(tmp_path / "st", encryption_key=KEY).close()
    with pytest.raises(EncryptionKeyError, match="STASHPOINT_KEY") as exc:
        stashpoint.open(tmp_path / "st")
    assert Cipher(KEY).key_id in str(exc.value)
    with pytest.raises(EncryptionKeyError, match=f"key id {Cipher(KEY).key_id}"):
        stashpoint.open(tmp_path / "st", encryption_key=OTHER)


def test_key_from_env_and_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STASHPOINT_KEY", KEY_HEX)
    with stashpoint.open(tmp_path / "st") as store:
        store.session().checkpoint({"x": 1})
    monkeypatch.delenv("STASHPOINT_KEY")
    keyfile = tmp_path / "k"
    keyfile.write_bytes(KEY)  # raw 32 bytes; hex and base64 work too
    keyfile.chmod(0o600)
    monkeypatch.setenv("STASHPOINT_KEY_FILE", str(keyfile))
    with stashpoint.open(tmp_path / "st") as store:
        assert store.session().state() == {"x": 1}


def test_key_formats() -> None:
    import base64

    assert parse_key(KEY_HEX) == KEY
    assert parse_key(base64.b64encode(KEY).decode()) == KEY
    assert parse_key(base64.urlsafe_b64encode(KEY).decode()) == KEY
    with pytest.raises(UsageError, match="32 random bytes"):
        parse_key("abcd")


def test_key_file_takes_the_same_keys_as_the_env_var(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The key file stripped whitespace, then took any 32-byte result as a raw key: 16 bytes in
    # hex, a 32-character passphrase or base64 of 24 bytes all made a store.
    import base64

    keyfile = tmp_path / "k"
    monkeypatch.setenv("STASHPOINT_KEY_FILE", str(keyfile))
    weak = {
        "short hex": os.urandom(16).hex() + "\n",
        "passphrase": "password1234password1234password\n",
        "base64 of 24 bytes": base64.b64encode(os.urandom(24)).decode() + "\n",
        "31 chars": "password1234password1234passwo\n",  # 32 bytes with its newline
        "32 chars unterminated": "password1234password1234password",
    }
    for what, text in weak.items():
        keyfile.write_text(text)
        keyfile.chmod(0o600)
        with pytest.raises(UsageError, match=f"STASHPOINT_KEY_FILE {keyfile}: not a key"):
            key_from_env()
        with pytest.raises(UsageError, match="STASHPOINT_KEY: not a key"):
            parse_key(text.strip())
        with pytest.raises(UsageError, match="STASHPOINT_KEY_FILE"):
            stashpoint.open(tmp_path / what)
        assert not (tmp_path / what).exists()  # no store was made with it
    keyfile.write_bytes(KEY + b"\n")  # raw bytes are taken only as written
    with pytest.raises(UsageError, match="STASHPOINT_KEY_FILE"):
        key_from_env()
    unpadded = base64.urlsafe_b64encode(KEY).decode().rstrip("=")
    for good in (KEY, f"  {KEY_HEX}\n".encode(), f"{unpadded}\n".encode()):
        keyfile.write_bytes(good)
        assert key_from_env() == KEY
        assert parse_key(good) == KEY
    ws = tmp_path / "ws"
    ws.mkdir()
    keyfile.write_text(weak["short hex"])
    keyfile.chmod(0o600)
    res = _run(ws, "snap", key=None, STASHPOINT_KEY_FILE=str(keyfile))
    assert res.returncode == 1 and f"STASHPOINT_KEY_FILE {keyfile}: not a key" in res.stderr


def test_a_key_file_other_users_can_read_draws_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyfile = tmp_path / "k"
    keyfile.write_text(KEY_HEX + "\n")
    monkeypatch.setenv("STASHPOINT_KEY_FILE", str(keyfile))
    keyfile.chmod(0o644)
    with pytest.warns(StashpointWarning, match="chmod 600"):
        assert key_from_env() == KEY
    keyfile.chmod(0o600)
    assert key_from_env() == KEY  # warnings are errors in this suite: none here


def test_key_for_a_plaintext_store_with_data_is_refused(tmp_path: Path) -> None:
    with stashpoint.open(tmp_path / "st") as store:
        store.session().checkpoint({"x": 1})
    with pytest.raises(EncryptionKeyError, match="not encrypted and already holds data"):
        stashpoint.open(tmp_path / "st", encryption_key=KEY)
    with stashpoint.open(tmp_path / "st") as store:  # nothing was changed by the refusal
        assert store.session().state() == {"x": 1}


def test_keyed_chain_without_encryption_and_explicit_mac_key_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with stashpoint.open(tmp_path / "a", key=b"mac key") as store:
        assert store.hasher.keyed and store.cipher is None
        cp = store.session().checkpoint({"x": 1})
    with pytest.raises(UsageError, match="keyed hash chain"):
        stashpoint.open(tmp_path / "a")  # the store says it is keyed
    _drop_integrity_mark(tmp_path / "a" / "store.db")  # as someone who can write it could
    with pytest.raises(IntegrityError, match="integrity marker was removed"):
        stashpoint.open(tmp_path / "a")  # the MAC'd ref marker still says keyed
    _drop_integrity_mark(tmp_path / "a" / "store.db", "integrity:refs")
    with pytest.raises(IntegrityError, match="was keyed when this user last opened it"):
        stashpoint.open(tmp_path / "a")  # this user's rollback witness remembers it
    monkeypatch.setenv("STASHPOINT_WITNESS", "off")  # another user, with neither marker
    with stashpoint.open(tmp_path / "a") as store, pytest.raises(IntegrityError):
        store.get(cp.id)  # an unkeyed reader still cannot verify (or forge) the HMAC chain
    with stashpoint.open(tmp_path / "b", encryption_key=KEY, key=b"mac key") as store:
        cp = store.session().checkpoint({"x": 1})
    with (
        pytest.raises(IntegrityError, match="names key id"),  # refused as it opens
        stashpoint.open(tmp_path / "b", encryption_key=KEY) as store,
    ):
        store.get(cp.id)  # the derived MAC key is not the explicit one


def _drop_integrity_mark(db: Path, key: str = "integrity") -> None:
    import sqlite3

    with sqlite3.connect(db) as con:
        assert con.execute("DELETE FROM meta WHERE key = ?", (key,)).rowcount == 1


# -- damage: moved ciphertexts, planted plaintext -----------------------------------------------


def _sql(tmp_path: Path, query: str, *args: Any, store: str = "st") -> list[Any]:
    with closing(sqlite3.connect(tmp_path / store / "store.db")) as db, db:
        return db.execute(query, args).fetchall()


def _two_checkpoints(tmp_path: Path) -> tuple[str, str]:
    with stashpoint.open(tmp_path / "st", encryption_key=KEY) as store:
        s = store.session()
        a = s.checkpoint(_state(), message="a")
        b = s.checkpoint(_state(" more"), message="b")
    return a.id, b.id


def _reopen(tmp_path: Path) -> stashpoint.Store:
    return stashpoint.open(tmp_path / "st", encryption_key=KEY)


def test_record_ciphertext_moved_to_another_row_fails(tmp_path: Path) -> None:
    a, b = _two_checkpoints(tmp_path)
    body = _sql(tmp_path, "SELECT body FROM checkpoints WHERE id=?", a)[0][0]
    _sql(tmp_path, "UPDATE checkpoints SET body=? WHERE id=?", body, b)
    with _reopen(tmp_path) as store:
        with pytest.raises(IntegrityError, match="moved from another row") as exc:
            store.get(b)
        assert exc.value.checkpoint == b and exc.value.last_good == a
        from stashpoint.verify import verify_store

        assert [p.checkpoint for p in verify_store(store).problems] == [b]


def test_message_ciphertext_moved_to_another_index_fails(tmp_path: Path) -> None:
    a, _b = _two_checkpoints(tmp_path)
    with _reopen(tmp_path) as store:
        conv = store.get(a).state.conversation
    assert conv is not None and conv.length == 2
    m0 = _sql(tmp_path, "SELECT data FROM messages WHERE log=? AND idx=0", conv.log)[0][0]
    _sql(tmp_path, "UPDATE messages SET data=? WHERE log=? AND idx=1", m0, conv.log)
    with _reopen(tmp_path) as store:
        with pytest.raises(IntegrityError, match="message 1 of log"):
            store.session().state(a)
        from stashpoint.verify import verify_store

        assert any("message 1" in p.message for p in verify_store(store).problems)


def test_blob_ciphertext_moved_to_another_digest_fails(tmp_path: Path) -> None:
    _a, _b = _two_checkpoints(tmp_path)
    rows = _sql(tmp_path, "SELECT digest, codec, size, data FROM blobs")
    (d1, c1, s1, x1), (d2, _c2, _s2, _x2) = rows[0], rows[1]
    _sql(tmp_path, "UPDATE blobs SET codec=?, size=?, data=? WHERE digest=?", c1, s1, x1, d2)
    with _reopen(tmp_path) as store:
        with pytest.raises(IntegrityError, match=f"blob {bytes(d2).hex()}"):
            store.blobs.read(bytes(d2))
        assert store.blobs.read(bytes(d1))  # the original stays readable


def test_flipped_byte_in_a_chunk_file_fails(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    with stashpoint.open(tmp_path / "st", encryption_key=KEY) as store:
        store.session(workspace=ws).checkpoint()
    chunk = next(
        p for p in (tmp_path / "st" / "blobs").rglob("*") if p.is_file() and len(p.name) == 64
    )
    raw = bytearray(chunk.read_bytes())
    raw[-5] ^= 1
    chunk.write_bytes(bytes(raw))
    with _reopen(tmp_path) as store:
        from stashpoint.verify import verify_store

        assert any("fails authentication" in p.message for p in verify_store(store).problems)


def test_plaintext_rows_planted_in_an_encrypted_store_are_refused(tmp_path: Path) -> None:
    a, _b = _two_checkpoints(tmp_path)
    # A plaintext message where a ciphertext was.
    log = _sql(tmp_path, "SELECT log FROM messages")[0][0]
    _sql(tmp_path, "UPDATE messages SET data=? WHERE log=? AND idx=0", b'{"role":"user"}', log)
    # A plaintext blob (codec 0: raw) for one of the state values.
    digest = _sql(tmp_path, "SELECT digest FROM blobs")[0][0]
    _sql(tmp_path, "UPDATE blobs SET codec=0, data=? WHERE digest=?", b"planted", digest)
    with _reopen(tmp_path) as store:
        with pytest.raises(IntegrityError, match="unencrypted in an encrypted store"):
            store.session().state(a)
        with pytest.raises(IntegrityError, match="unencrypted in an encrypted store"):
            store.blobs.read(bytes(digest))
    # A whole plaintext checkpoint record, sealed by an unencrypted store with the same MAC.
    with stashpoint.open(tmp_path / "plain", key=Cipher(KEY).mac_key) as other:
        forged = other.session().checkpoint({"x": "forged"})
        row = other.meta.get_checkpoint(forged.id)
    assert row is not None
    _sql(
        tmp_path,
        "INSERT INTO checkpoints(id, session, branch, parent, body, digest) VALUES (?,?,?,?,?,?)",
        *row,
    )
    refused = pytest.raises(IntegrityError, match="unencrypted in an encrypted store")
    with _reopen(tmp_path) as store, refused:
        store.get(forged.id)


def test_removing_the_encryption_marker_does_not_reveal_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _b = _two_checkpoints(tmp_path)
    _sql(tmp_path, "DELETE FROM meta WHERE key='encryption'")
    with pytest.raises(IntegrityError, match="marker was removed"):
        stashpoint.open(tmp_path / "st")  # the MAC'd ref marker says the chain is keyed
    _sql(tmp_path, "DELETE FROM meta WHERE key='integrity:refs'")
    monkeypatch.setenv("STASHPOINT_WITNESS", "off")  # nor a witness that remembers it
    with stashpoint.open(tmp_path / "st") as store, pytest.raises(IntegrityError):
        store.get(a)


# -- maintenance on an encrypted store: retention, GC, du, bundles ------------------------------


def test_gc_prune_and_du_work_on_an_encrypted_store(tmp_path: Path) -> None:
    from stashpoint import gc, retention
    from stashpoint.verify import verify_store

    ws = _workspace(tmp_path)
    with stashpoint.open(tmp_path / "st", encryption_key=KEY) as store:
        s = store.session(workspace=ws)
        ids = []
        for i in range(4):
            (ws / "src" / "app.py").write_text(f"version {i}\n" * 100)
            ids.append(s.checkpoint(_state(str(i))).id)
        plan = retention.plan_session(store, "main", retention.Policy(keep_last=1))
        retention.apply(store, plan)
        report = gc.collect(store, grace=0)
        assert report.to_dict()
        usage = gc.usage(store)
        assert usage.sessions["main"]["records"] == 4
        assert verify_store(store).problems == []
        assert s.state(ids[-1]) == _state("3")


def test_bundle_export_decrypts_and_import_reencrypts(tmp_path: Path) -> None:
    from stashpoint.bundle import export_bundle, import_bundle, read_bundle
    from stashpoint.verify import verify_store

    ws = _workspace(tmp_path)
    with stashpoint.open(tmp_path / "st", encryption_key=KEY) as store:
        s = store.session(workspace=ws)
        s.checkpoint(_state())
        head = s.checkpoint(_state(" two"))
        export_bundle(store, tmp_path / "run.spb", session="main")
        hasher = store.hasher
    raw = (tmp_path / "run.spb").read_bytes()
    assert b"assistant says swordfish" in raw  # documented: a bundle holds plaintext
    # Into a new store under the same key: re-encrypted there, chain verifies under its MAC.
    with stashpoint.open(tmp_path / "st2", encryption_key=KEY) as dest:
        with read_bundle(tmp_path / "run.spb", hasher=hasher) as bundle:
            import_bundle(dest, bundle)
        assert dest.session().state(head.id) == _state(" two")
        assert verify_store(dest).problems == []
    for secret in SECRETS:
        assert secret not in _store_bytes(tmp_path / "st2")
    # Into a plaintext store, or under another key: refused (the chain's MAC is the key's).
    with (
        stashpoint.open(tmp_path / "st3") as plain,
        pytest.raises(UsageError, match="key"),
        read_bundle(tmp_path / "run.spb", hasher=plain.hasher) as bundle,
    ):
        import_bundle(plain, bundle)


def test_a_plaintext_store_is_encrypted_and_a_key_rotated_through_bundles(tmp_path: Path) -> None:
    from stashpoint.bundle import export_bundle, import_bundle, read_bundle
    from stashpoint.integrity import ChainHasher
    from stashpoint.verify import verify_store

    ws = _workspace(tmp_path)
    with stashpoint.open(tmp_path / "plain") as store:
        head = store.session(workspace=ws).checkpoint(_state())
        export_bundle(store, tmp_path / "p.spb", session="main")
    with stashpoint.open(tmp_path / "k1", encryption_key=KEY) as store:
        with read_bundle(tmp_path / "p.spb") as bundle:  # unkeyed: checked without a key
            with pytest.raises(UsageError, match="--as NAME"):
                import_bundle(store, bundle)
            rep = import_bundle(store, bundle, as_session="main")
        assert store.session().state(rep.ids[head.id]) == _state()
        assert verify_store(store).problems == []
        export_bundle(store, tmp_path / "k1.spb", session="main")
    with stashpoint.open(tmp_path / "k2", encryption_key=OTHER) as store:
        old = ChainHasher(Cipher(KEY).mac_key)  # the old key checks the bundle
        with read_bundle(tmp_path / "k1.spb", hasher=old) as bundle:
            import_bundle(store, bundle, as_session="main")
        assert store.session().state() == _state()
        assert verify_store(store).problems == []
    for home in ("k1", "k2"):
        raw = _store_bytes(tmp_path / home)
        assert all(secret not in raw for secret in SECRETS)


# -- the CLI as a user types it -----------------------------------------------------------------


def _run(
    cwd: Path, *args: str, key: str | None = KEY_HEX, **env: str
) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("STASHPOINT_")}
    e["HOME"] = str(cwd.parent)
    if key is not None:
        e["STASHPOINT_KEY"] = key
    e.update(env)
    return subprocess.run(
        [sys.executable, "-m", "stashpoint", *args],
        cwd=cwd,
        env=e,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_snap_show_rewind_verify_with_a_key(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    made = _run(ws, "init", "--new-key", "-", key=None)
    key = made.stdout.strip()
    assert made.returncode == 0 and len(key) == 64, made.stderr
    assert _run(ws, "snap", "-m", "first", key=key).returncode == 0
    before = snapshot_tree(ws)
    (ws / "src" / "app.py").write_text("broken\n")
    assert _run(ws, "snap", "-m", "second", key=key).returncode == 0
    shown = json.loads(_run(ws, "show", "HEAD~1", "--json", key=key).stdout)
    assert shown["message"] == "first"
    assert _run(ws, "rewind", "HEAD~1", key=key).returncode == 0
    assert snapshot_tree(ws) == before
    assert _run(ws, "verify", key=key).returncode == 0
    assert b"hunter2" not in _store_bytes(ws / ".stashpoint")

    missing = _run(ws, "log", key=None)
    assert missing.returncode == 1 and "STASHPOINT_KEY" in missing.stderr
    wrong = _run(ws, "log", key=OTHER.hex())
    assert wrong.returncode == 1 and "key id" in wrong.stderr
    bad = _run(ws, "log", key="not a key")
    assert bad.returncode == 1 and "--new-key" in bad.stderr

    keyfile = tmp_path / "k"
    keyfile.write_text(key + "\n")
    assert _run(ws, "log", key=None, STASHPOINT_KEY_FILE=str(keyfile)).returncode == 0

    # Damage: a record's ciphertext moved onto its successor -> exit 2, named.
    rows = _sql(ws, "SELECT id, body FROM checkpoints ORDER BY id", store=".stashpoint")
    _sql(
        ws, "UPDATE checkpoints SET body=? WHERE id=?", rows[0][1], rows[1][0], store=".stashpoint"
    )
    damaged = _run(ws, "verify", key=key)
    assert damaged.returncode == 2 and rows[1][0][:12] in damaged.stdout + damaged.stderr


def test_cli_export_import_between_encrypted_stores(tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    assert _run(ws, "snap", "-m", "one").returncode == 0
    assert _run(ws, "export", "-o", str(tmp_path / "b.spb")).returncode == 0
    other = tmp_path / "other"
    other.mkdir()
    done = _run(other, "import", str(tmp_path / "b.spb"), "--json")
    assert done.returncode == 0, done.stderr
    assert _run(other, "verify").returncode == 0
    refused = _run(tmp_path / "other", "import", str(tmp_path / "b.spb"), key=OTHER.hex())
    assert refused.returncode in (1, 2)
    # A plaintext store's bundle goes into an encrypted store as a new session.
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "f.txt").write_text("plain file hunter2 hunter2\n")
    assert _run(plain, "snap", key=None).returncode == 0
    assert _run(plain, "export", "-o", str(tmp_path / "p.spb"), key=None).returncode == 0
    no_as = _run(other, "import", str(tmp_path / "p.spb"))
    assert no_as.returncode == 1 and "--as NAME" in no_as.stderr
    done = _run(other, "import", str(tmp_path / "p.spb"), "--as", "migrated")
    assert done.returncode == 0, done.stderr
    assert _run(other, "verify").returncode == 0
    assert b"hunter2" not in _store_bytes(other / ".stashpoint")


def test_init_new_key_writes_a_private_key_file_and_never_overwrites(tmp_path: Path) -> None:
    out = tmp_path / "key"
    ws = tmp_path / "ws"
    ws.mkdir()
    res = _run(ws, "init", "--new-key", str(out), "--json", key=None)
    assert res.returncode == 0 and out.stat().st_mode & 0o777 == 0o600, res.stderr
    assert json.loads(res.stdout)["key_id"] == Cipher(parse_key(out.read_text())).key_id
    locked = _run(ws, "log", key=None)
    assert locked.returncode == 1 and "STASHPOINT_KEY" in locked.stderr  # encrypted from birth
    assert _run(ws, "snap", key=None, STASHPOINT_KEY_FILE=str(out)).returncode == 0
    other = tmp_path / "ws2"
    other.mkdir()
    again = _run(other, "init", "--new-key", str(out), key=None)
    assert again.returncode == 1 and "refusing to overwrite" in again.stderr


# -- the log wrapper passes the backend conformance suite ---------------------------------------


class TestEncryptedLogsConformance(MetadataStoreConformance):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Callable[[], MetadataStore]:
        from stashpoint.stores.encrypted import EncryptedLogs
        from stashpoint.stores.sqlite import SqliteStore

        return lambda: EncryptedLogs(SqliteStore(tmp_path / "store.db"), Cipher(KEY))

    def test_blob_info_and_log_sizes(self, ms: MetadataStore) -> None:
        pytest.skip("log sizes count stored bytes: each entry carries 40 bytes of cipher header")


def test_durable_run_resumes_on_an_encrypted_store_and_its_records_are_sealed(
    tmp_path: Path,
) -> None:
    class Crash(BaseException):
        pass

    calls: list[str] = []

    def program(store: stashpoint.Store, crash: bool) -> Any:
        run = store.session("job", redact=False)

        @run.step
        def fetch(i: int) -> str:
            calls.append(f"fetch{i}")
            if crash and i == 2:
                raise Crash
            return f"purple elephant {i}"

        return run.run(lambda: [fetch(1), fetch(2)])

    with stashpoint.open(tmp_path / "st", encryption_key=KEY) as store:
        with pytest.raises(Crash):
            program(store, crash=True)
        records = [v for k, v in store.meta.inner.iter_meta("run:")]  # type: ignore[attr-defined]
        assert records and all(v.startswith("sealed:") for v in records)
    raw = _store_bytes(tmp_path / "st")
    assert b"purple elephant" not in raw and b"fetch" not in raw
    with stashpoint.open(tmp_path / "st", encryption_key=KEY) as store:
        result = program(store, crash=False)
    assert result.value == ["purple elephant 1", "purple elephant 2"]
    assert calls == ["fetch1", "fetch2", "fetch2"]  # step 1 was replayed from the journal
    # A plaintext run record planted where the sealed one was is refused.
    _sql(tmp_path, "UPDATE meta SET value=? WHERE key LIKE 'run:%'", '{"argv": ["rm"]}')
    with _reopen(tmp_path) as store, pytest.raises(IntegrityError, match="unencrypted"):
        program(store, crash=False)


def test_a_new_meta_key_is_sealed_and_plaintext_from_older_versions_still_reads(
    tmp_path: Path,
) -> None:
    with stashpoint.open(tmp_path / "st", encryption_key=KEY) as store:
        store.meta.set_meta("some-new-feature:x", "purple giraffe notes")
    assert b"purple giraffe" not in _store_bytes(tmp_path / "st")
    from stashpoint import metakeys

    plain = dict(_sql(tmp_path, "SELECT key, value FROM meta"))
    assert set(plain) >= {metakeys.GC_EPOCH, metakeys.ENCRYPTION, metakeys.STORE_ID}
    assert not any(v.startswith("sealed:") for k, v in plain.items() if k in metakeys.PLAINTEXT)
    # An older version left checkouts plaintext: still read, sealed when next written.
    _sql(tmp_path, "INSERT INTO meta(key, value) VALUES ('checkout:s:/w', 'old-branch')")
    with _reopen(tmp_path) as store:
        assert store.meta.get_meta("some-new-feature:x") == "purple giraffe notes"
        assert store.meta.get_meta("checkout:s:/w") == "old-branch"
        store.meta.set_meta("checkout:s:/w", "new-branch")
    assert _sql(tmp_path, "SELECT value FROM meta WHERE key='checkout:s:/w'")[0][0].startswith(
        "sealed:"
    )


def test_memory_store_encrypts_and_collects(tmp_path: Path) -> None:
    from stashpoint import gc
    from stashpoint.verify import verify_store

    with stashpoint.open("memory://", encryption_key=KEY) as store:
        s = store.session()
        first = s.checkpoint({"v": "swordfish " * 50})
        s.checkpoint({"v": "other"})
        backend = store.backend
        assert all(b"swordfish" not in r.data for r in backend._blobs.values())  # type: ignore[attr-defined]
        report = gc.collect(store, grace=0)
        assert report.dry_run is False
        assert s.state(first.id) == {"v": "swordfish " * 50}
        assert verify_store(store).problems == []


def test_an_empty_store_open_elsewhere_without_a_key_is_not_encrypted_under_it(
    tmp_path: Path,
) -> None:
    """A process that opened a new store without a key writes plaintext: the store cannot be
    marked encrypted while it is open (its checkpoints would land unencrypted in an encrypted
    store, unreadable with the key). Once it closed, the key encrypts the store."""
    key = os.urandom(32)
    keyless = stashpoint.open(tmp_path / "s")
    with pytest.raises(EncryptionKeyError, match="open in another process without a key"):
        stashpoint.open(tmp_path / "s", encryption_key=key)
    keyless.session("a").checkpoint({"note": "written without a key"})  # still a plain store
    keyless.close()
    fresh = tmp_path / "t"
    stashpoint.open(fresh).close()  # created and closed without a key: still empty
    with stashpoint.open(fresh, encryption_key=key) as store:
        assert store.cipher is not None
        store.session("a").checkpoint({"note": "secret words"})
    assert b"secret words" not in b"".join(p.read_bytes() for p in fresh.rglob("*") if p.is_file())


def test_a_sessions_application_value_is_sealed(tmp_path: Path) -> None:
    """Store.session_value keeps the key the LangGraph saver always used, sealed."""
    from stashpoint.metakeys import LANGGRAPH_PENDING, langgraph_pending_key

    with stashpoint.open(tmp_path / "st", encryption_key=KEY) as store:
        store.set_session_value("t", LANGGRAPH_PENDING, '{"w": "swordfish"}')
        assert store.session_value("t", LANGGRAPH_PENDING) == '{"w": "swordfish"}'
        with pytest.raises(UsageError, match="no session value named"):
            store.session_value("t", "nope")
    [(raw,)] = _sql(tmp_path, f"SELECT value FROM meta WHERE key='{langgraph_pending_key('t')}'")
    assert raw.startswith("sealed:") and "swordfish" not in raw
