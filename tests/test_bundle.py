"""Portable bundles, end to end.

Histories are built with the library on real directories and real SQLite stores; export,
import, verify, log, show and fork run as a user types them (``sp``, a subprocess). The second
"machine" is a second store in another temporary directory. Every hostile bundle is crafted
the way an attacker would - with every digest recomputed so that only the one trick is wrong -
and each refusal asserts the exit code, that the store is byte-for-byte and row-for-row
unchanged, and that nothing else under the test's directory (its $HOME) was written.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sqlite3
import stat
import unicodedata
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zstandard

import stashpoint
from stashpoint._ids import new_id
from stashpoint.bundle import (
    BLOB,
    CHUNKS,
    LOG,
    RAW,
    RECORD,
    TREE,
    ZSTD,
    BundleWriter,
    Limits,
    LogEntry,
    RawEntry,
    RecordEntry,
    decode_payload,
    export_bundle,
    import_bundle,
    iter_entries,
    manifest_keyed,
    read_bundle,
)
from stashpoint.errors import IntegrityError, UsageError
from stashpoint.integrity import EMPTY_CHAIN, ChainHasher, message_chain
from stashpoint.model import ArtifactRef, Checkpoint, LogRef, TreeEntry
from stashpoint.session import StashpointWarning
from stashpoint.stores.base import CheckpointRow, Commit, LogAppend, LogInfo
from stashpoint.verify import verify_store

from .conftest import Result, snapshot_tree

Sp = Callable[..., Result]
EXIT_USER, EXIT_INTEGRITY = 1, 2
MIB = 1 << 20


# -- building histories --------------------------------------------------------------------------
def write(path: Path, content: str | bytes, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    if mode is not None:
        path.chmod(mode)


def populate(ws: Path, seed: int = 0) -> None:
    write(ws / "README.md", "# project\n")
    write(ws / "src" / "main.py", "print('hi')\n")
    write(ws / "src" / "words.txt", "compressible words\n" * 400)
    write(ws / "src" / "deep" / "er" / "x.txt", "deep\n")
    write(ws / "run.sh", "#!/bin/sh\necho run\n", 0o755)
    write(ws / "big.bin", random.Random(seed).randbytes(MIB * 5 // 2))  # three chunks
    (ws / "empty").mkdir()
    os.symlink("src/main.py", ws / "main-link")


def msg(i: int, text: str = "") -> dict[str, Any]:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": text or f"message {i}"}


def build_history(ws: Path, alt: Path) -> tuple[stashpoint.Store, dict[str, Any]]:
    """main: three checkpoints (files, conversation, a value, a big file edited in one chunk);
    alt: a fork of the second with a diverging conversation (a log continuing a log)."""
    populate(ws)
    store = stashpoint.open(ws / ".stashpoint")
    run = store.session("main", workspace=ws)
    expect: dict[str, Any] = {}
    msgs = [msg(0), msg(1)]
    c1 = run.checkpoint({"messages": msgs, "plan": ["a"]}, message="first")
    expect[c1.id] = (snapshot_tree(ws), list(msgs))
    write(ws / "src" / "main.py", "print('hello')\n")
    (ws / "README.md").unlink()
    msgs = [*msgs, msg(2), msg(3)]
    c2 = run.checkpoint({"messages": msgs, "plan": ["a", "b"]}, message="second", label="two")
    expect[c2.id] = (snapshot_tree(ws), list(msgs))
    with open(ws / "big.bin", "r+b") as f:
        f.seek(MIB + 10)
        f.write(b"edited")
    msgs = [*msgs, msg(4)]
    c3 = run.checkpoint({"messages": msgs, "plan": ["a", "b", "c"]}, message="third")
    expect[c3.id] = (snapshot_tree(ws), list(msgs))
    other = run.fork(c2.id, "alt", into=alt)
    write(alt / "alt.txt", "alternative\n")
    amsgs = [*expect[c2.id][1][:3], msg(3, "another answer"), msg(4)]
    c4 = other.checkpoint({"messages": amsgs, "plan": ["alt"]}, message="on alt")
    expect[c4.id] = (snapshot_tree(alt), list(amsgs))
    return store, expect


def ids_in_log(sp: Sp, cwd: Path, *args: str) -> list[str]:
    return [c["id"] for c in json.loads(sp(*args, "log", "--json", cwd=cwd).out)]


# -- proving that nothing was written ------------------------------------------------------------
def listing(root: Path) -> dict[str, Any]:
    """Every path under ``root`` with its content digest, plus every row of every store
    database (SQLite's -wal/-shm side files are left out; their content is in the rows)."""
    out: dict[str, Any] = {}
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            p = Path(dirpath) / name
            if name.endswith(("-wal", "-shm")):
                continue
            if p.is_symlink():
                out[str(p)] = ("l", os.readlink(p))
            elif p.is_dir():
                out[str(p)] = ("d",)
            else:
                out[str(p)] = ("f", hashlib.sha256(p.read_bytes()).hexdigest())
                if name == "store.db":
                    out[f"{p} rows"] = rows(p)
    return out


def rows(db: Path) -> dict[str, list[Any]]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall()) for t in tables}


# -- round trips ---------------------------------------------------------------------------------
def test_round_trip_to_another_machine(sp: Sp, tmp_path: Path) -> None:
    ws, alt = tmp_path / "a" / "project", tmp_path / "a" / "project-alt"
    store, expect = build_history(ws, alt)
    store.close()
    source_before = listing(ws / ".stashpoint")
    bundle = tmp_path / "run.spb"
    out = json.loads(sp("export", "-o", str(bundle), "--json", cwd=ws).out)
    assert out["checkpoints"] == len(expect) and out["scope"] == "session"
    assert set(out["heads"]) == {"main", "alt"}
    assert listing(ws / ".stashpoint") == source_before  # export only reads

    b = tmp_path / "b" / "proj"
    b.mkdir(parents=True)
    checked = json.loads(sp("import", str(bundle), "--dry-run", "--json", cwd=b).out)
    assert checked["ok"] and checked["checkpoints"] == len(expect)
    assert not (b / ".stashpoint").exists()  # a dry run creates nothing
    rep = json.loads(sp("import", str(bundle), "--json", cwd=b).out)
    assert rep["checkpoints"] == len(expect) and rep["present"] == 0
    assert {h["action"] for h in rep["heads"].values()} == {"created"}
    assert (b / ".stashpoint" / "store.db").exists()
    assert "ok" in sp("verify", cwd=b).out
    assert set(ids_in_log(sp, b)) == set(expect)
    ids = list(expect)
    for ident in (ids[0], ids[2], ids[3]):  # main's root, main's tip (edited chunk), alt's tip
        tree, msgs = expect[ident]
        dest = tmp_path / "b" / f"replay-{ident}"
        sp("fork", ident, "--into", str(dest), cwd=b)
        assert snapshot_tree(dest) == tree, ident
        shown = json.loads(sp("show", ident, "--json", cwd=b).out)
        assert shown["state"]["messages"] == msgs
        assert shown["digest"] and shown["id"] == ident
    again = json.loads(sp("import", str(bundle), "--json", cwd=b).out)
    assert (again["checkpoints"], again["present"], again["objects"]) == (0, len(expect), 0)
    assert "ok" in sp("verify", cwd=b).out


def test_single_checkpoint_carries_its_ancestry(sp: Sp, tmp_path: Path) -> None:
    ws, alt = tmp_path / "a" / "project", tmp_path / "a" / "project-alt"
    store, expect = build_history(ws, alt)
    ids = list(expect)
    store.close()
    bundle = tmp_path / "one.spb"
    out = json.loads(sp("export", ids[3], "-o", str(bundle), "--json", cwd=ws).out)
    assert out["scope"] == "checkpoint" and out["heads"] == {"alt": ids[3]}
    b = tmp_path / "b"
    b.mkdir()
    sp("import", str(bundle), cwd=b)
    assert "ok" in sp("verify", cwd=b).out
    assert sorted(ids_in_log(sp, b)) == sorted([ids[0], ids[1], ids[3]])  # lineage, not main's tip
    sp("fork", ids[3], "--into", str(tmp_path / "replay"), cwd=b)  # (beside b: see fork)
    assert snapshot_tree(tmp_path / "replay") == expect[ids[3]][0]


def test_reimport_fast_forwards_and_divergence_needs_as(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "a"
    write(ws / "one.txt", "one\n")
    with stashpoint.open(ws / ".stashpoint") as store:
        store.session("main", workspace=ws).checkpoint(message="one")
    bundle = tmp_path / "x.spb"
    sp("export", "-o", str(bundle), cwd=ws)
    b = tmp_path / "b"
    b.mkdir()
    sp("import", str(bundle), cwd=b)
    write(ws / "new.txt", "new\n")
    sp("snap", "-m", "two", cwd=ws)
    sp("export", "-o", str(bundle), "--overwrite", cwd=ws)
    rep = json.loads(sp("import", str(bundle), "--json", cwd=b).out)
    assert rep["heads"]["main"]["action"] == "fast-forward" and rep["present"] == 1
    assert ids_in_log(sp, b) == ids_in_log(sp, ws)
    # Both sides move on: the histories diverge, and the import is refused untouched ...
    sp("snap", "-m", "made on b", cwd=b)
    write(ws / "new.txt", "newer\n")
    sp("snap", "-m", "three", cwd=ws)
    sp("export", "-o", str(bundle), "--overwrite", cwd=ws)
    before = listing(tmp_path)
    r = sp("import", str(bundle), cwd=b, check=False)
    assert r.code == EXIT_USER and "--as" in r.err
    assert listing(tmp_path) == before
    # ... until it goes into a session of its own, re-sealed with new ids.
    rep = json.loads(sp("import", str(bundle), "--as", "from-a", "--json", cwd=b).out)
    assert rep["session"] == "from-a" and rep["checkpoints"] == 3
    assert "ok" in sp("verify", cwd=b).out
    moved = ids_in_log(sp, b, "--session", "from-a")
    source = ids_in_log(sp, ws)
    assert moved == [rep["ids"][i] for i in source] and not set(moved) & set(source)
    shown = json.loads(sp("--session", "from-a", "show", moved[0], "--json", cwd=b).out)
    assert shown["meta"]["stashpoint_import"]["id"] == source[0]
    sp("--session", "from-a", "fork", moved[0], "--into", str(tmp_path / "r"), cwd=b)
    assert snapshot_tree(tmp_path / "r") == snapshot_tree(ws)


def test_journal_and_any_log_ref_travel_with_their_parent_logs(tmp_path: Path) -> None:
    """A record's LogRefs are followed generically: here a journal log that continues another
    log from a fork point, committed the way the durable layer does (append_log)."""
    src = stashpoint.open(tmp_path / "src")
    run = src.session("main")
    head = run.checkpoint({"messages": [msg(0)]})
    entries = [f"step {i}".encode() for i in range(4)]
    j1 = chained(EMPTY_CHAIN, entries[:3])  # J1: steps 0, 1, 2
    j2 = chained(j1[1][0].hex(), entries[3:])  # J2: J1's first two, then step 3
    src.meta.append_log(LogAppend("J1", 0, j1, LogInfo("main", None, 0, 0)))
    src.meta.append_log(LogAppend("J2", 2, j2, LogInfo("main", "J1", 2, 2)))
    cp = msgspec.structs.replace(
        head,
        id=new_id(),
        parent=head.id,
        parent_digest=head.digest,
        step=2,
        journal=LogRef("J2", 3, j2[-1][0].hex()),
    )
    sealed_cp, body = src.hasher.seal(cp)
    row = CheckpointRow(cp.id, "main", "main", head.id, body, sealed_cp.digest)
    src.meta.commit(Commit(row, head.id))
    assert verify_store(src).ok
    path = tmp_path / "j.spb"
    export_bundle(src, path, session="main")
    logs = {
        e.name: msgspec.msgpack.decode(content(e), type=LogEntry)
        for e in iter_entries(path)
        if e.kind == LOG
    }
    assert logs["J1"].parent is None and len(logs["J1"].rows) == 2  # up to J2's fork point
    assert (logs["J2"].parent, logs["J2"].parent_len, len(logs["J2"].rows)) == ("J1", 2, 1)
    dst = stashpoint.open(tmp_path / "dst")
    with read_bundle(path) as bundle:
        import_bundle(dst, bundle)
    assert verify_store(dst).ok
    assert dst.meta.log_info("J2") == LogInfo("main", "J1", 2, 3)
    assert [r.data for r in dst.meta.read_messages("J2", 0, 9)] == [entries[3]]
    # A journal entry altered in the bundle (digests recomputed) breaks the running hash.
    altered = msgspec.structs.replace(logs["J2"], rows=[(j2[0][0], b"step X")])
    forged = [
        blob_entry(LOG, "J2", msgspec.msgpack.encode(altered)) if e.name == "J2" else e
        for e in iter_entries(path)
    ]
    with pytest.raises(IntegrityError, match="running hash"):
        read_bundle(save(forged, tmp_path / "f.spb"))


def chained(start: str, entries: list[bytes]) -> list[tuple[bytes, bytes]]:
    """(running hash, entry) rows continuing a log whose hash so far is ``start``."""
    out, chain = [], start
    for e in entries:
        chain = message_chain(chain, e)
        out.append((bytes.fromhex(chain), e))
    return out


def test_pruned_records_travel_as_records_only(tmp_path: Path) -> None:
    """A record pruned by retention keeps its place in the chain but its contents may be gone:
    it travels without them, and is marked pruned where it is imported."""
    ws = tmp_path / "ws"
    ws.mkdir()
    src = stashpoint.open(tmp_path / "src")
    run = src.session("main", workspace=ws)
    cps = []
    for i in range(3):
        write(ws / "a.txt", f"version {i}\n")
        cps.append(run.checkpoint({"messages": [msg(j) for j in range(i + 1)], "n": i}))
    when = "2026-01-01T00:00:00Z"
    assert src.meta.mark_pruned("main", [cps[0].id], when) == [cps[0].id]
    path = tmp_path / "p.spb"
    export_bundle(src, path, session="main")
    names = {e.name for e in iter_entries(path)}
    assert cps[0].id in names  # the record, for the chain ...
    assert hashlib.sha256(b"version 0\n").hexdigest() not in names  # ... not its files
    dst = stashpoint.open(tmp_path / "dst")
    with read_bundle(path) as bundle:
        report = import_bundle(dst, bundle)
    assert (report.checkpoints, report.pruned) == (3, 1)
    assert dst.meta.pruned("main") == {cps[0].id: when}
    assert dst.session("main").state(cps[1].id)["n"] == 1
    dst.session("main").fork(cps[2].id, "b", into=tmp_path / "out")
    assert (tmp_path / "out" / "a.txt").read_text() == "version 2\n"


def test_a_durable_run_resumes_elsewhere_without_executing_again(tmp_path: Path) -> None:
    calls: list[int] = []

    def agent(store: stashpoint.Store, crash: bool = False) -> Any:
        run = store.session("d")

        @run.step
        def think(n: int) -> str:
            calls.append(n)
            return f"t{n}"

        def main() -> list[str]:
            out = [think(1), think(2)]
            if crash:
                raise KeyboardInterrupt  # killed between checkpoints
            return [*out, think(3)]

        return run, main

    src = stashpoint.open(tmp_path / "src")
    src.session("d").checkpoint({"x": 1})
    run, main = agent(src, crash=True)
    with pytest.raises(KeyboardInterrupt):
        run.run(main)
    with pytest.warns(StashpointWarning, match="2 journal entries after its last checkpoint"):
        export_bundle(src, tmp_path / "crashed.spb", session="d")
    run, main = agent(src)
    assert run.run(main).value == ["t1", "t2", "t3"] and calls == [1, 2, 3]
    export_bundle(src, tmp_path / "done.spb", session="d")  # no warning: filterwarnings=error
    dst = stashpoint.open(tmp_path / "dst")
    with read_bundle(tmp_path / "done.spb") as bundle:
        import_bundle(dst, bundle)
    assert verify_store(dst).ok
    calls.clear()
    run, main = agent(dst)
    result = run.run(main)
    assert (result.value, result.status, calls) == (["t1", "t2", "t3"], "completed", [])


def test_keyed_bundles_need_the_same_key(tmp_path: Path) -> None:
    src = stashpoint.open(tmp_path / "src", key=b"k1")
    src.session("main").checkpoint({"x": 1})
    path = tmp_path / "k.spb"
    export_bundle(src, path, session="main")
    with pytest.raises(UsageError, match="HMAC key"):
        read_bundle(path)
    with pytest.raises(IntegrityError, match="another key"):
        read_bundle(path, hasher=ChainHasher(b"k2"))
    dst = stashpoint.open(tmp_path / "dst", key=b"k1")
    with read_bundle(path, hasher=dst.hasher) as bundle:
        import_bundle(dst, bundle)
    assert verify_store(dst).ok and dst.session("main").state() == {"x": 1}


def test_absolute_size_limit(tmp_path: Path, base: Path) -> None:
    with pytest.raises(UsageError, match="decompression bomb"):
        read_bundle(base, limits=Limits(max_bytes=100_000, ratio_floor=0))
    read_bundle(base).close()


# -- hostile bundles -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A legitimate one-checkpoint bundle (files, a chunked file, a link, a conversation)."""
    d = tmp_path_factory.mktemp("base")
    populate(d / "ws")
    with stashpoint.open(d / "store") as store:
        run = store.session("main", workspace=d / "ws")
        run.checkpoint({"messages": [msg(0), msg(1)], "plan": "p"})
        export_bundle(store, d / "base.spb", session="main")
    return d / "base.spb"


def content(e: RawEntry) -> bytes:
    return decode_payload(e.codec, e.size, e.payload)


def blob_entry(kind: bytes, name: str, data: bytes) -> RawEntry:
    return RawEntry(kind, name, RAW, len(data), data)


def save(entries: list[RawEntry], path: Path, shas: dict[int, bytes] | None = None) -> Path:
    with open(path, "wb") as f:
        w = BundleWriter(f)
        for i, e in enumerate(entries):
            w.add_payload(e.kind, e.name, e.codec, e.size, e.payload, sha=(shas or {}).get(i, b""))
        w.finish()
    return path


def the_record(entries: list[RawEntry]) -> tuple[int, Checkpoint]:
    (i,) = [n for n, e in enumerate(entries) if e.kind == RECORD]
    rec = msgspec.msgpack.decode(content(entries[i]), type=RecordEntry)
    return i, msgspec.json.decode(rec.body, type=Checkpoint)


def sealed(cp: Checkpoint) -> RawEntry:
    new, body = ChainHasher().seal(cp)
    return blob_entry(RECORD, cp.id, msgspec.msgpack.encode(RecordEntry(new.digest, body)))


def obj(kind: bytes, data: bytes) -> tuple[bytes, RawEntry]:
    digest = hashlib.sha256(data).digest()
    return digest, blob_entry(kind, digest.hex(), data)


def with_root(
    base: Path,
    extra: list[TreeEntry],
    added: list[RawEntry],
    *,
    files: int | None = None,
    change: Callable[[Checkpoint], Checkpoint] | None = None,
) -> list[RawEntry]:
    """The base bundle with ``extra`` entries in the workspace's root directory (a new root tree,
    the record re-sealed to point at it, and the counts it declares kept true: ``files`` is the
    count of files ``extra`` adds when it has directories; ``change`` edits the record too)."""
    entries = list(iter_entries(base))
    i, cp = the_record(entries)
    assert cp.workspace is not None
    (r,) = [n for n, e in enumerate(entries) if e.name == cp.workspace.tree]
    tree = msgspec.msgpack.decode(content(entries[r]), type=list[TreeEntry]) + extra
    digest, entries[r] = obj(TREE, msgspec.msgpack.encode(tree))
    if files is None:
        files = sum(1 for e in extra if e.kind in "fl")
    size = sum(e.size for e in extra if e.kind == "f")
    ws = msgspec.structs.replace(
        cp.workspace,
        tree=digest.hex(),
        files=cp.workspace.files + files,
        bytes=cp.workspace.bytes + size,
    )
    cp = msgspec.structs.replace(cp, workspace=ws)
    entries[i] = sealed(change(cp) if change is not None else cp)
    return entries + added


def file_entry(name: bytes, data: bytes, mode: int = 0o644) -> tuple[TreeEntry, RawEntry]:
    digest, entry = obj(BLOB, data)
    return TreeEntry(name, "f", mode, len(data), digest), entry


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A project directory whose store already holds a checkpoint of its own."""
    t = tmp_path / "target"
    write(t / "mine.txt", "mine\n")
    with stashpoint.open(t / ".stashpoint") as store:
        store.session("mine", workspace=t).checkpoint(message="mine")
    return t


def refused(sp: Sp, tmp_path: Path, cwd: Path, bundle: Path, code: int, match: str) -> None:
    before = listing(tmp_path)
    r = sp("import", str(bundle), cwd=cwd, check=False)
    assert r.code == code, r.err + r.out
    assert match in r.err, r.err
    assert "Traceback" not in r.err
    assert listing(tmp_path) == before


@pytest.mark.parametrize(
    "name", [b"..", b".", b"../../escape", b"/etc/passwd", b"a/b", b"nul\0byte", b""]
)
def test_unsafe_names(sp: Sp, tmp_path: Path, base: Path, name: bytes) -> None:
    entry, data = file_entry(name, b"x")
    bundle = save(with_root(base, [entry], [data]), tmp_path / "evil.spb")
    empty = tmp_path / "fresh"  # no store yet: a refused import must not create one either
    empty.mkdir()
    refused(sp, tmp_path, empty, bundle, EXIT_USER, "unsafe name")
    assert not (empty / ".stashpoint").exists()


def test_symlink_then_file_through_it(sp: Sp, tmp_path: Path, base: Path, target: Path) -> None:
    outside = tmp_path / "outside"
    inner, payload = file_entry(b"payload.txt", b"owned\n")
    sub, sub_entry = obj(TREE, msgspec.msgpack.encode([inner]))
    link = TreeEntry(b"evil", "l", 0o777, len(bytes(outside)), os.fsencode(outside))
    bundle = save(
        with_root(base, [link, TreeEntry(b"evil", "d", 0o755, 0, sub)], [sub_entry, payload]),
        tmp_path / "evil.spb",
    )
    refused(sp, tmp_path, target, bundle, EXIT_USER, "twice")
    # The same through a case variant of the link's name.
    bundle = save(
        with_root(base, [link, TreeEntry(b"EVIL", "d", 0o755, 0, sub)], [sub_entry, payload]),
        tmp_path / "evil.spb",
    )
    refused(sp, tmp_path, target, bundle, EXIT_USER, "collide")
    assert not outside.exists()


@pytest.mark.parametrize(
    ("kind", "why"),
    [("h", "hard link"), ("c", "char device"), ("b", "block device"), ("p", "fifo")],
)
def test_hardlinks_and_device_files(
    sp: Sp, tmp_path: Path, base: Path, target: Path, kind: str, why: str
) -> None:
    entry = TreeEntry(b"special", kind, 0o644, 0, b"README.md" if kind == "h" else b"\x01\x03")
    bundle = save(with_root(base, [entry], []), tmp_path / "evil.spb")
    refused(sp, tmp_path, target, bundle, EXIT_USER, "no device files, hard links")


def test_container_entry_of_unknown_kind(sp: Sp, tmp_path: Path, base: Path, target: Path) -> None:
    entries = list(iter_entries(base))
    entries.insert(1, blob_entry(b"H", "hardlink", b"../../etc/passwd"))
    refused(sp, tmp_path, target, save(entries, tmp_path / "evil.spb"), EXIT_USER, "unknown")


def test_duplicate_entries(sp: Sp, tmp_path: Path, base: Path, target: Path) -> None:
    entries = list(iter_entries(base))
    (blob,) = [e for e in entries if e.kind == BLOB][:1]
    refused(
        sp, tmp_path, target, save([*entries, blob], tmp_path / "d.spb"), EXIT_USER, "duplicate"
    )
    (rec,) = [e for e in entries if e.kind == RECORD]
    refused(sp, tmp_path, target, save([*entries, rec], tmp_path / "d.spb"), EXIT_USER, "duplicate")
    a, da = file_entry(b"same", b"one")
    b, db = file_entry(b"same", b"two")
    bundle = save(with_root(base, [a, b], [da, db]), tmp_path / "d.spb")
    refused(sp, tmp_path, target, bundle, EXIT_USER, "twice")


def test_unreferenced_entries_are_refused(sp: Sp, tmp_path: Path, base: Path, target: Path) -> None:
    _d, smuggled = obj(BLOB, b"nothing refers to me")
    bundle = save([*iter_entries(base), smuggled], tmp_path / "u.spb")
    refused(sp, tmp_path, target, bundle, EXIT_USER, "no checkpoint refers to")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (b"README.txt", b"readme.TXT"),
        ("caf\u00e9".encode(), unicodedata.normalize("NFD", "caf\u00e9").encode()),
        ("\u212a".encode(), b"k"),  # KELVIN SIGN folds to k
    ],
)
def test_case_and_normalisation_collisions(
    sp: Sp, tmp_path: Path, base: Path, target: Path, a: bytes, b: bytes
) -> None:
    ea, da = file_entry(a, b"first")
    eb, db = file_entry(b, b"second")
    bundle = save(with_root(base, [ea, eb], [da, db]), tmp_path / "c.spb")
    refused(sp, tmp_path, target, bundle, EXIT_USER, "collide")


@pytest.mark.parametrize("name", [b".git", b".GIT", b".git.", b".g\xe2\x80\x8cit", b".stashpoint"])
def test_git_and_store_directories_are_refused(
    sp: Sp, tmp_path: Path, base: Path, target: Path, name: bytes
) -> None:
    hook, data = file_entry(b"post-checkout", b"#!/bin/sh\nrm -rf ~\n", 0o755)
    sub, sub_entry = obj(TREE, msgspec.msgpack.encode([hook]))
    entry = TreeEntry(name, "d", 0o755, 0, sub)
    bundle = save(with_root(base, [entry], [sub_entry, data]), tmp_path / "g.spb")
    refused(sp, tmp_path, target, bundle, EXIT_USER, "never snapshots")


def test_setuid_files_are_refused(sp: Sp, tmp_path: Path, base: Path, target: Path) -> None:
    entry, data = file_entry(b"su", b"\x7fELF", 0o4755)
    bundle = save(with_root(base, [entry], [data]), tmp_path / "s.spb")
    refused(sp, tmp_path, target, bundle, EXIT_USER, "setuid")


def _lie_entry_size(entries: list[RawEntry]) -> list[RawEntry]:
    i = next(n for n, e in enumerate(entries) if e.kind == BLOB and e.codec == RAW)
    e = entries[i]
    entries[i] = RawEntry(e.kind, e.name, e.codec, e.size + 10, e.payload)
    return entries


def _lie_frame_size(entries: list[RawEntry]) -> list[RawEntry]:
    i = next(n for n, e in enumerate(entries) if e.kind == BLOB and e.codec == ZSTD)
    e = entries[i]
    frame = zstandard.ZstdCompressor().compress(content(e) + b"more")
    entries[i] = RawEntry(e.kind, e.name, ZSTD, e.size, frame)
    return entries


def _lie_tree_size(base: Path) -> list[RawEntry]:
    entry, data = file_entry(b"small.txt", b"12345")
    return with_root(base, [msgspec.structs.replace(entry, size=999)], [data])


def _lie_workspace_count(entries: list[RawEntry]) -> list[RawEntry]:
    i, cp = the_record(entries)
    assert cp.workspace is not None
    ws = msgspec.structs.replace(cp.workspace, files=cp.workspace.files + 1)
    entries[i] = sealed(msgspec.structs.replace(cp, workspace=ws))
    return entries


@pytest.mark.parametrize(
    ("lie", "match"),
    [
        ("entry", "bytes but holds"),
        ("frame", "but its frame says"),
        ("tree", "declares 999 bytes, its content 5"),
        ("workspace", "files /"),
    ],
)
def test_declared_sizes_that_lie(
    sp: Sp, tmp_path: Path, base: Path, target: Path, lie: str, match: str
) -> None:
    entries = list(iter_entries(base))
    forged = {
        "entry": lambda: _lie_entry_size(entries),
        "frame": lambda: _lie_frame_size(entries),
        "tree": lambda: _lie_tree_size(base),
        "workspace": lambda: _lie_workspace_count(entries),
    }[lie]()
    refused(sp, tmp_path, target, save(forged, tmp_path / "l.spb"), EXIT_INTEGRITY, match)


def test_decompression_bomb(sp: Sp, tmp_path: Path, target: Path) -> None:
    """300 MiB of zeros in a 10 KiB frame, in a bundle of a few KiB: refused before a byte of
    it is decompressed (bound: 1000x the file, at least 64 MiB)."""
    with stashpoint.open(tmp_path / "src") as src:
        src.session("main").checkpoint({"plan": "small"})
        export_bundle(src, tmp_path / "small.spb", session="main")
    base = tmp_path / "small.spb"
    size = 300 * MIB
    cobj = zstandard.ZstdCompressor(level=1).compressobj(size=size)
    zeros = bytes(MIB)
    frame = b"".join(cobj.compress(zeros) for _ in range(size // MIB)) + cobj.flush()
    assert len(frame) < MIB // 4
    digest = hashlib.sha256()
    for _ in range(size // MIB):
        digest.update(zeros)
    bomb = RawEntry(BLOB, digest.hexdigest(), ZSTD, size, frame)
    entries = list(iter_entries(base))
    bundle = save([entries[0], bomb, *entries[1:]], tmp_path / "bomb.spb")
    refused(sp, tmp_path, target, bundle, EXIT_USER, "decompression bomb")


def _flip_payload(base: Path) -> tuple[list[RawEntry], dict[int, bytes]]:
    entries = list(iter_entries(base))
    i = next(n for n, e in enumerate(entries) if e.kind == BLOB and e.codec == RAW)
    e = entries[i]
    sha = hashlib.sha256(e.payload).digest()  # the digest of the original, kept in the header
    entries[i] = RawEntry(e.kind, e.name, e.codec, e.size, b"X" + e.payload[1:])
    return entries, {i: sha}


def _wrong_name(base: Path) -> tuple[list[RawEntry], dict[int, bytes]]:
    entries = list(iter_entries(base))
    i = next(n for n, e in enumerate(entries) if e.kind == BLOB)
    e = entries[i]
    entries[i] = RawEntry(e.kind, hashlib.sha256(b"other").hexdigest(), e.codec, e.size, e.payload)
    return entries, {}


def _altered_record(base: Path) -> tuple[list[RawEntry], dict[int, bytes]]:
    entries = list(iter_entries(base))
    i, _cp = the_record(entries)
    rec = msgspec.msgpack.decode(content(entries[i]), type=RecordEntry)
    body = rec.body.replace(b'"step":1', b'"step":7')
    assert body != rec.body
    forged = RecordEntry(rec.digest, body)
    entries[i] = blob_entry(RECORD, entries[i].name, msgspec.msgpack.encode(forged))
    return entries, {}


def _altered_message(base: Path) -> tuple[list[RawEntry], dict[int, bytes]]:
    entries = list(iter_entries(base))
    i = next(n for n, e in enumerate(entries) if e.kind == LOG)
    log = msgspec.msgpack.decode(content(entries[i]), type=LogEntry)
    rows = [(log.rows[0][0], log.rows[0][1].replace(b"message", b"massage")), *log.rows[1:]]
    new = msgspec.structs.replace(log, rows=rows)
    entries[i] = blob_entry(LOG, entries[i].name, msgspec.msgpack.encode(new))
    return entries, {}


def _swapped_chunks(base: Path) -> tuple[list[RawEntry], dict[int, bytes]]:
    entries = list(iter_entries(base))
    i = next(n for n, e in enumerate(entries) if e.kind == CHUNKS)
    data = content(entries[i])
    entries[i] = blob_entry(CHUNKS, entries[i].name, data[32:64] + data[:32] + data[64:])
    return entries, {}


@pytest.mark.parametrize(
    ("forge", "match"),
    [
        (_flip_payload, "does not match its digest"),
        (_wrong_name, "is not in the bundle"),  # what it names is missing: checked first
        (_altered_record, "does not match its digest"),
        (_altered_message, "running hash"),
        (_swapped_chunks, "does not match its digest"),
    ],
)
def test_digest_mismatches(
    sp: Sp, tmp_path: Path, base: Path, target: Path, forge: Any, match: str
) -> None:
    entries, shas = forge(base)
    bundle = save(entries, tmp_path / "m.spb", shas)
    refused(sp, tmp_path, target, bundle, EXIT_INTEGRITY, match)


@pytest.mark.parametrize("how", ["trailer", "truncated", "appended", "magic"])
def test_damaged_files(sp: Sp, tmp_path: Path, base: Path, target: Path, how: str) -> None:
    data = bytearray(base.read_bytes())
    if how == "trailer":  # another bundle digest, with the trailer's own digest made to fit
        payload = bytes([data[-48] ^ 1]) + bytes(data[-47:])
        data[-80:-48] = hashlib.sha256(payload).digest()
        data[-48:] = payload
    elif how == "truncated":
        del data[len(data) // 2 :]
    elif how == "appended":
        data += b"tail"
    else:
        data[1] ^= 1
    bundle = tmp_path / "x.spb"
    bundle.write_bytes(bytes(data))
    if how == "magic":
        refused(sp, tmp_path, target, bundle, EXIT_USER, "not a stashpoint bundle")
    else:
        refused(sp, tmp_path, target, bundle, EXIT_INTEGRITY, "damaged")


def test_existing_id_with_other_contents(sp: Sp, tmp_path: Path, base: Path, target: Path) -> None:
    sp("import", str(base), cwd=target)
    entries = list(iter_entries(base))
    i, cp = the_record(entries)
    entries[i] = sealed(msgspec.structs.replace(cp, message="rewritten history"))
    bundle = save(entries, tmp_path / "o.spb")
    refused(sp, tmp_path, target, bundle, EXIT_USER, "refusing to overwrite")
    assert "ok" in sp("verify", cwd=target).out


def _shared_subtrees(levels: int, names: int) -> tuple[TreeEntry, list[RawEntry], int]:
    """A directory whose every level names the level below under ``names`` names: a few KiB
    that a restore would expand to ``names ** levels`` files. Returns (entry, objects, files)."""
    leaf, data = file_entry(b"f", b"")
    sub, sub_entry = obj(TREE, msgspec.msgpack.encode([leaf]))
    added = [data, sub_entry]
    for _ in range(levels):
        level = [TreeEntry(b"n%d" % k, "d", 0o755, 0, sub) for k in range(names)]
        sub, sub_entry = obj(TREE, msgspec.msgpack.encode(level))
        added.append(sub_entry)
    return TreeEntry(b"boom", "d", 0o755, 0, sub), added, names**levels


def test_shared_subtrees_cannot_expand_past_the_entry_limit(
    sp: Sp, tmp_path: Path, base: Path, target: Path
) -> None:
    """One subtree named twice at each of 40 levels: 2**40 files declared truthfully, in a
    bundle of ~10 KiB. Refused (checked once per subtree, so refusing it is quick)."""
    entry, added, files = _shared_subtrees(40, 2)
    bundle = save(with_root(base, [entry], added, files=files), tmp_path / "dag.spb")
    assert bundle.stat().st_size - base.stat().st_size < 16_000
    refused(sp, tmp_path, target, bundle, EXIT_USER, "files, directories and symlinks")


def test_the_entry_limit_counts_files_directories_and_symlinks(base: Path) -> None:
    # base: README.md, src/{main.py, words.txt, deep/er/x.txt}, run.sh, big.bin, empty/,
    # main-link: 7 files and symlinks, 4 directories.
    read_bundle(base, limits=Limits(max_restore_entries=11)).close()
    with pytest.raises(UsageError, match="more than 10 files, directories and symlinks"):
        read_bundle(base, limits=Limits(max_restore_entries=10)).close()


def test_a_shared_subtree_cannot_hide_depth(
    sp: Sp, tmp_path: Path, base: Path, target: Path
) -> None:
    """Three chains of 200 directories, each ending in the previous one: each is checked once
    (at depth 1), but reached through the others it nests 600 deep (limit 256)."""
    leaf, data = file_entry(b"f", b"")
    sub, sub_entry = obj(TREE, msgspec.msgpack.encode([leaf]))
    added, tops = [data, sub_entry], []
    for chain in range(3):
        for i in range(200):
            level = [TreeEntry(b"c%d-%d" % (chain, i), "d", 0o755, 0, sub)]
            sub, sub_entry = obj(TREE, msgspec.msgpack.encode(level))
            added.append(sub_entry)
        tops.append(TreeEntry(b"top%d" % chain, "d", 0o755, 0, sub))
    bundle = save(with_root(base, tops, added, files=3), tmp_path / "deep.spb")
    refused(sp, tmp_path, target, bundle, EXIT_USER, "nest deeper than 256")


def test_setuid_artifacts_are_refused(sp: Sp, tmp_path: Path, base: Path, target: Path) -> None:
    """Like tree files: a rewind --artifacts would create the file with the mode it names."""
    payload = b"#!/bin/sh\nid\n"
    digest, blob = obj(BLOB, payload)
    for mode in (0o4755, 0o2755):
        art = ArtifactRef(digest.hex(), len(payload), str(tmp_path / "out" / "tool"), mode, 1)
        entries = with_root(
            base,
            [],
            [blob],
            change=lambda cp, a=art: msgspec.structs.replace(cp, artifacts={"t": a}),
        )
        bundle = save(entries, tmp_path / "art.spb")
        refused(sp, tmp_path, target, bundle, EXIT_USER, "artifact 't' is setuid/setgid")
    assert not (tmp_path / "out").exists()


def _bad_utf8_manifest(entries: list[RawEntry]) -> list[RawEntry]:
    data = content(entries[0]).replace(b'"session":"main"', b'"session":"ma\xa1n"')
    entries[0] = blob_entry(entries[0].kind, "manifest", data)
    return entries


def _bad_utf8_record(entries: list[RawEntry]) -> list[RawEntry]:
    i, _cp = the_record(entries)
    rec = msgspec.msgpack.decode(content(entries[i]), type=RecordEntry)
    data = msgspec.msgpack.encode(rec).replace(rec.digest.encode(), b"\xa1" * 64)
    entries[i] = blob_entry(RECORD, entries[i].name, data)
    return entries


def _bad_utf8_record_body(entries: list[RawEntry]) -> list[RawEntry]:
    """Invalid UTF-8 inside the record's JSON, with the record's digest made to fit."""
    i, _cp = the_record(entries)
    rec = msgspec.msgpack.decode(content(entries[i]), type=RecordEntry)
    body = rec.body.replace(b'"branch":"main"', b'"branch":"ma\xa1n"')
    assert body != rec.body
    forged = RecordEntry(ChainHasher().digest(body), body)
    entries[i] = blob_entry(RECORD, entries[i].name, msgspec.msgpack.encode(forged))
    return entries


def _bad_utf8_log(entries: list[RawEntry]) -> list[RawEntry]:
    i = next(n for n, e in enumerate(entries) if e.kind == LOG)
    data = content(entries[i]).replace(b"\xa4main", b"\xa4ma\xa1n", 1)
    entries[i] = blob_entry(LOG, entries[i].name, data)
    return entries


def _bad_utf8_tree(base: Path) -> list[RawEntry]:
    leaf, data = file_entry(b"f", b"x")
    tree = msgspec.msgpack.encode([msgspec.structs.replace(leaf, kind="q")])
    sub, sub_entry = obj(TREE, tree.replace(b"\xa1q", b"\xa1\xff"))
    return with_root(base, [TreeEntry(b"d", "d", 0o755, 0, sub)], [sub_entry, data], files=1)


@pytest.mark.parametrize("where", ["manifest", "record", "record body", "log", "tree"])
def test_invalid_utf8_is_damage_not_a_traceback(
    sp: Sp, tmp_path: Path, base: Path, target: Path, where: str
) -> None:
    entries = list(iter_entries(base))
    forged = {
        "manifest": lambda: _bad_utf8_manifest(entries),
        "record": lambda: _bad_utf8_record(entries),
        "record body": lambda: _bad_utf8_record_body(entries),
        "log": lambda: _bad_utf8_log(entries),
        "tree": lambda: _bad_utf8_tree(base),
    }[where]()
    bundle = save(forged, tmp_path / "u8.spb")
    refused(sp, tmp_path, target, bundle, EXIT_INTEGRITY, "damaged")
    with pytest.raises(IntegrityError, match="malformed"):
        read_bundle(bundle)
    if where == "manifest":
        assert manifest_keyed(bundle) is None  # the peek that picks a key: cannot tell


def test_export_never_replaces_what_is_not_a_regular_file(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws / "a.txt", "x\n")
    sp("snap", "-m", "one", cwd=ws)
    fifo, folder, link = tmp_path / "fifo", tmp_path / "folder", tmp_path / "link"
    os.mkfifo(fifo)
    folder.mkdir()
    write(tmp_path / "kept.spb", "kept\n")
    os.symlink(tmp_path / "kept.spb", link)
    for path, kind in ((fifo, "a FIFO"), (link, "a symlink")):
        for flags in ((), ("--overwrite",)):
            r = sp("export", "-o", str(path), *flags, cwd=ws, check=False)
            assert r.code == EXIT_USER, r.err + r.out
            assert f"is not a regular file ({kind})" in r.err and "Traceback" not in r.err
    with (  # (the CLI refuses a directory itself)
        stashpoint.open(ws / ".stashpoint") as store,
        pytest.raises(UsageError, match=r"is not a regular file \(a directory\)"),
    ):
        export_bundle(store, folder, session="main", overwrite=True)
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and folder.is_dir() and link.is_symlink()
    assert (tmp_path / "kept.spb").read_text() == "kept\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left
    sp("export", "-o", str(tmp_path / "kept.spb"), "--overwrite", cwd=ws)  # a file: replaced
    read_bundle(tmp_path / "kept.spb").close()


def test_ids_a_file_store_cannot_hold_are_refused_before_writing(
    tmp_path: Path, base: Path
) -> None:
    """A bundle allows ids of 128 characters with '.' and ':'; a file:// store holds ids of at
    most 64 of [0-9A-Za-z_-]. Refused before any blob or log is written; --as gives new ids."""
    for new in ("log.with.dots", "L" * 100):
        entries = list(iter_entries(base))
        i, cp = the_record(entries)
        j = next(n for n, e in enumerate(entries) if e.kind == LOG)
        e = entries[j]
        entries[j] = RawEntry(LOG, new, e.codec, e.size, e.payload)
        assert cp.state.conversation is not None
        conv = msgspec.structs.replace(cp.state.conversation, log=new)
        entries[i] = sealed(
            msgspec.structs.replace(cp, state=msgspec.structs.replace(cp.state, conversation=conv))
        )
        bundle = save(entries, tmp_path / "ids.spb")
        url = f"file://{tmp_path / 'fstore'}"
        with stashpoint.open(url) as store:
            before = listing(tmp_path / "fstore")
            with read_bundle(bundle) as b, pytest.raises(UsageError, match=r"file store.*--as"):
                import_bundle(store, b)
            with read_bundle(bundle) as b, pytest.raises(UsageError, match="file store"):
                import_bundle(store, b, dry_run=True)
            assert listing(tmp_path / "fstore") == before
    with stashpoint.open(url) as store, read_bundle(bundle) as b:
        import_bundle(store, b, as_session="renamed")
        assert store.session("renamed").state()["plan"] == "p"
        assert verify_store(store).ok


def test_export_does_not_replace_a_file_made_while_it_writes(sp: Sp, tmp_path: Path) -> None:
    """The look for an existing file comes before the bundle is written; a file another
    process makes at the path in between is refused like one that was there (not replaced
    unasked), and nothing is left behind."""
    import subprocess
    import sys

    ws = tmp_path / "ws"
    write(ws / "a.txt", "x\n")
    sp("snap", "-m", "one", cwd=ws)
    dest = tmp_path / "run.spb"
    made: list[bool] = []

    def someone_else(_done: int, _total: int) -> None:
        if not made:  # another process writes the file while the export runs
            script = "import sys; open(sys.argv[1], 'x').write('theirs\\n')"
            subprocess.run([sys.executable, "-c", script, str(dest)], check=True)
            made.append(True)

    with (
        stashpoint.open(ws / ".stashpoint") as store,
        pytest.raises(UsageError, match="exists; choose another name or pass --overwrite"),
    ):
        export_bundle(store, dest, session="main", progress=someone_else)
    assert made and dest.read_text() == "theirs\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left
