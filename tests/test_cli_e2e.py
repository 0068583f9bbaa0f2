"""The CLI end to end, driven as a user types it, on real directories.

Every test runs ``python -m stashpoint ...`` in a subprocess (the ``sp`` fixture) with a real
temporary workspace as the current directory, changes that workspace with Python and with shell
commands (``rm``, ``mv``, ``sed -i``, ``chmod``, ``ln``), and compares whole directory trees byte
for byte with ``snapshot_tree``. The integrity tests damage the store the way a disk or an
attacker would (raw SQLite edits, a flipped byte in a chunk file) and check that ``verify`` and
the reading commands refuse it with exit code 2 and name what is damaged.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sqlite3
import subprocess
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import stashpoint

from .conftest import Result, snapshot_tree

Tree = dict[str, tuple[str, int, bytes]]
Sp = Callable[..., Result]

MIB = 1024 * 1024
EXIT_USER, EXIT_INTEGRITY = 1, 2


# -- helpers: the workspace -----------------------------------------------------------------


def write(path: Path, content: str | bytes, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    if mode is not None:
        path.chmod(mode)


def sh(cwd: Path, command: str) -> None:
    """Change the workspace the way an agent's shell tool does."""
    subprocess.run(["sh", "-c", command], cwd=cwd, check=True)


GITIGNORE = "/build/\n*.log\n"
STASHPOINTIGNORE = "scratch/\n"


def is_ignored(rel: str) -> bool:
    """What the workspace's ignore rules (and the always-excluded ``.git``) leave out."""
    parts = rel.split("/")
    return (
        ".git" in parts
        or parts[0] in ("build", "scratch")
        or rel.endswith(".log")
        or rel == "pkg/generated.txt"
    )


def build_workspace(ws: Path) -> None:
    """A small project with every kind of entry a snapshot has to keep."""
    rng = random.Random(20261122)
    ws.mkdir(parents=True, exist_ok=True)
    write(ws / "README.md", "# demo project\n\nhello world\n")
    write(ws / "src/app.py", "".join(f"line {i}: value = {i}\n" for i in range(40)))
    write(ws / "src/util.py", "def helper():\n    return 42\n")
    write(ws / "bin/run.sh", "#!/bin/sh\necho run\n", mode=0o755)
    write(ws / "café/naïve.txt", "hello from a unicode path\n")
    write(ws / "日本.md", "# 日本語のファイル\n")
    write(ws / "data/blob.bin", bytes(range(256)) * 4 + rng.randbytes(1024))  # NULs: binary
    write(ws / "data/big.bin", rng.randbytes(3 * MIB))  # > 1 MiB: the chunked path
    write(ws / "private/key.txt", "not a real key\n", mode=0o600)
    (ws / "private").chmod(0o750)
    write(ws / "turns-into-dir", "a file for now\n")
    (ws / "empty").mkdir()
    (ws / "nested/empty/deeper").mkdir(parents=True)
    os.symlink("README.md", ws / "link-to-readme")
    os.symlink("no/such/target", ws / "dangling")
    os.symlink("src", ws / "link-to-src")
    # A nested repository: its files are snapshotted, its .git (at any depth) never.
    write(ws / ".git/HEAD", "ref: refs/heads/main\n")
    write(ws / "vendor/lib/.git/config", "[core]\n\tbare = false\n")
    write(ws / "vendor/lib/code.py", "print('vendored')\n")
    # Ignore rules at the root and deeper, and paths they exclude.
    write(ws / ".gitignore", GITIGNORE)
    write(ws / ".stashpointignore", STASHPOINTIGNORE)
    write(ws / "pkg/.gitignore", "generated.txt\n")
    write(ws / "pkg/mod.py", "x = 1\n")
    write(ws / "pkg/generated.txt", "generated v1\n")
    write(ws / "build/out.o", rng.randbytes(512))
    write(ws / "app.log", "log line 1\n")
    write(ws / "src/debug.log", "debug 1\n")
    write(ws / "scratch/notes.txt", "scratch notes\n")


def make_later_changes(ws: Path) -> None:
    """Edits of every kind, half of them by shell commands that editor checkpoints miss."""
    app = ws / "src/app.py"
    app.write_text(app.read_text().replace("line 7: value = 7\n", "line 7: value = 700\n"))
    with (ws / "README.md").open("a") as f:
        f.write("a second paragraph\n")
    sh(ws, "rm src/util.py")
    sh(ws, "mkdir -p docs && mv 日本.md docs/日本-moved.md")
    sh(ws, "sed -i 's/hello/goodbye/' 'café/naïve.txt'")
    sh(ws, "chmod +x src/app.py && chmod -x bin/run.sh && chmod 700 private")
    with (ws / "data/big.bin").open("r+b") as f:  # one chunk of three changes
        f.seek(MIB + MIB // 2)
        f.write(b"\xff" * 4096)
    write(ws / "data/blob.bin", b"\x00\x01changed binary\x00" * 64)
    write(ws / "new/file.txt", "created after the snapshot\n")
    (ws / "newempty").mkdir()
    sh(ws, "rmdir empty")
    sh(ws, "ln -sfn src/app.py link-to-readme && rm dangling && ln -s gone dangling2")
    sh(ws, "rm -r nested/empty && echo now-a-file > nested/empty")
    sh(ws, "rm turns-into-dir && mkdir turns-into-dir && echo inner > turns-into-dir/inner.txt")
    touch_ignored(ws, "1")


def touch_ignored(ws: Path, tag: str) -> None:
    """Change ignored paths: a rewind must leave every one of them exactly as it finds it."""
    sh(ws, f"echo 'log {tag}' >> app.log && echo 'debug {tag}' >> src/debug.log")
    write(ws / f"build/new-{tag}.o", f"object {tag}\n")
    write(ws / f"scratch/more-{tag}.txt", f"scratch {tag}\n")
    write(ws / "pkg/generated.txt", f"generated {tag}\n")
    write(ws / f"vendor/lib/.git/objects/{tag}", f"git object {tag}\n")
    write(ws / f".git/refs/{tag}", f"ref {tag}\n")


# -- helpers: trees ------------------------------------------------------------------------


def kept(tree: Tree) -> Tree:
    return {p: e for p, e in tree.items() if not is_ignored(p)}


def ignored(tree: Tree) -> Tree:
    return {p: e for p, e in tree.items() if is_ignored(p)}


def describe(entry: tuple[str, int, bytes] | None) -> str:
    if entry is None:
        return "absent"
    kind, mode, data = entry
    if kind == "f":
        return f"file {oct(mode)} {len(data)} B sha256:{hashlib.sha256(data).hexdigest()[:12]}"
    if kind == "l":
        return f"symlink -> {data.decode(errors='replace')}"
    return f"dir {oct(mode)}"


def assert_same_tree(actual: Tree, expected: Tree, what: str) -> None:
    """Exact comparison (bytes, modes, link targets) with a readable report of differences."""
    if actual == expected:
        return
    lines = [
        f"  {path}: expected {describe(expected.get(path))}, got {describe(actual.get(path))}"
        for path in sorted(actual.keys() | expected.keys())
        if actual.get(path) != expected.get(path)
    ]
    raise AssertionError(f"{what}: {len(lines)} path(s) differ:\n" + "\n".join(lines[:50]))


def manifest_paths(tree: Tree) -> set[tuple[str, str]]:
    return {(p, kind) for p, (kind, _m, _d) in tree.items()}


# -- helpers: the CLI ----------------------------------------------------------------------


def cli_json(sp: Sp, cwd: Path, *args: str) -> Any:
    return json.loads(sp(*args, "--json", cwd=cwd).out)


def snap(sp: Sp, ws: Path, message: str) -> dict[str, Any]:
    cp: dict[str, Any] = cli_json(sp, ws, "snap", "-m", message)
    return cp


def fails(sp: Sp, cwd: Path, *args: str, code: int) -> Result:
    res = sp(*args, cwd=cwd, check=False)
    assert res.code == code, (
        f"stashpoint {' '.join(args)}: expected exit {code}, got {res.code}\n{res.err}{res.out}"
    )
    assert "Traceback" not in res.err, f"stashpoint {' '.join(args)} crashed:\n{res.err}"
    return res


def log_ids(sp: Sp, cwd: Path) -> list[str]:
    return [cp["id"] for cp in cli_json(sp, cwd, "log")]


# -- helpers: damaging the store -----------------------------------------------------------


def store_db(ws: Path) -> closing[sqlite3.Connection]:
    return closing(sqlite3.connect(ws / ".stashpoint" / "store.db"))


def flip_blob_row(ws: Path, digest: bytes, offset: int = 0) -> None:
    with store_db(ws) as db:
        row = db.execute("SELECT data FROM blobs WHERE digest=?", (digest,)).fetchone()
        assert row is not None, f"blob {digest.hex()} is not stored inline in the blobs table"
        data = bytearray(row[0])
        data[offset % len(data)] ^= 0x01
        db.execute("UPDATE blobs SET data=? WHERE digest=?", (bytes(data), digest))
        db.commit()


def edit_checkpoint_body(ws: Path, ident: str, old: bytes, new: bytes) -> None:
    with store_db(ws) as db:
        (body,) = db.execute("SELECT body FROM checkpoints WHERE id=?", (ident,)).fetchone()
        assert old in bytes(body)
        db.execute(
            "UPDATE checkpoints SET body=? WHERE id=?", (bytes(body).replace(old, new), ident)
        )
        db.commit()


def delete_checkpoint(ws: Path, ident: str) -> None:
    with store_db(ws) as db:
        assert db.execute("DELETE FROM checkpoints WHERE id=?", (ident,)).rowcount == 1
        db.commit()


def blob_file(ws: Path, digest: bytes) -> Path:
    """The file under .stashpoint/blobs/ holding one blob (located by name, not by layout)."""
    found = [p for p in (ws / ".stashpoint" / "blobs").rglob(digest.hex()) if p.is_file()]
    assert len(found) == 1, f"expected one blob file named {digest.hex()}, found {found}"
    return found[0]


def three_snaps(sp: Sp, ws: Path) -> list[dict[str, Any]]:
    write(ws / "notes.txt", "one\n")
    out = [snap(sp, ws, "first")]
    for message in ("second", "third"):
        with (ws / "notes.txt").open("a") as f:
            f.write(f"{message}\n")
        out.append(snap(sp, ws, message))
    return out


# -- snapshot, rewind, undo ----------------------------------------------------------------


def test_rewind_restores_snapshot_byte_for_byte_and_can_be_undone(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    build_workspace(ws)
    a = snap(sp, ws, "A")
    tree_a = snapshot_tree(ws)

    make_later_changes(ws)
    b = snap(sp, ws, "B")
    tree_b = snapshot_tree(ws)
    assert (b["parent"], b["branch"], b["step"]) == (a["id"], "main", a["step"] + 1)
    # Unsaved work on top of B, also by shell commands, plus more changes to ignored paths.
    sh(ws, "echo wip > wip.txt && rm README.md && sed -i 's/value = 3$/value = 33/' src/app.py")
    touch_ignored(ws, "2")
    before = snapshot_tree(ws)
    assert kept(before) != kept(tree_a)

    result = cli_json(sp, ws, "rewind", a["id"])
    assert result["target"]["id"] == a["id"]
    assert result["safety"]["kind"] == "pre-rewind"
    after = snapshot_tree(ws)
    assert_same_tree(kept(after), kept(tree_a), "workspace after rewind to A")
    assert_same_tree(ignored(after), ignored(before), "ignored paths after rewind")
    assert cli_json(sp, ws, "show", "HEAD")["id"] == a["id"]

    # The safety checkpoint holds the unsaved work: rewinding to it undoes the rewind.
    undo = cli_json(sp, ws, "rewind", result["safety"]["id"])
    assert undo["target"]["id"] == result["safety"]["id"]
    assert_same_tree(snapshot_tree(ws), before, "workspace after undoing the rewind")

    # And forwards again to B: every rewind is a full diff (create, modify, delete, type).
    cli_json(sp, ws, "rewind", b["id"])
    assert_same_tree(kept(snapshot_tree(ws)), kept(tree_b), "workspace after rewind to B")
    sp("verify", cwd=ws)


def test_rewind_keeps_directories_that_hold_ignored_files(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws / ".gitignore", "*.log\n")
    write(ws / "keep.txt", "keep\n")
    a = snap(sp, ws, "A")
    write(ws / "newdir/made-later.txt", "remove me\n")
    write(ws / "newdir/trace.log", "an ignored file in a directory made after A\n")
    write(ws / "newrepo/.git/HEAD", "ref: refs/heads/main\n")
    write(ws / "newrepo/src.py", "print(1)\n")

    cli_json(sp, ws, "rewind", a["id"])

    assert not (ws / "newdir/made-later.txt").exists()
    assert not (ws / "newrepo/src.py").exists()
    assert (ws / "newdir/trace.log").read_text() == "an ignored file in a directory made after A\n"
    assert (ws / "newrepo/.git/HEAD").read_text() == "ref: refs/heads/main\n"
    assert (ws / "keep.txt").read_text() == "keep\n"


def test_rewind_refuses_to_put_a_file_where_ignored_files_live(sp: Sp, tmp_path: Path) -> None:
    """The target has a file P; the workspace has a directory P holding an ignored file. The
    rewind refuses with exit 1 and puts everything back; once the ignored file is moved away
    the same rewind works, and no command is left stuck on an unfinished restore."""
    ws = tmp_path / "ws"
    write(ws / ".gitignore", "*.log\n")
    write(ws / "P", "a file\n")
    a = snap(sp, ws, "A")
    (ws / "P").unlink()
    write(ws / "P/tracked.txt", "tracked\n")
    write(ws / "P/debug.log", "ignored\n")
    b = snap(sp, ws, "B")
    res = fails(sp, ws, "rewind", a["id"], code=1)
    assert "P is a directory holding ignored files (debug.log)" in res.err
    assert (ws / "P/tracked.txt").read_text() == "tracked\n"  # rolled back
    assert (ws / "P/debug.log").read_text() == "ignored\n"  # never touched
    assert log_ids(sp, ws)[1] == b["id"]  # log works: no half-done restore to complete
    (ws / "P/debug.log").rename(ws / "debug.log")
    cli_json(sp, ws, "rewind", a["id"])
    assert (ws / "P").read_text() == "a file\n"
    assert (ws / "debug.log").read_text() == "ignored\n"


def test_rewind_never_overwrites_a_file_that_is_ignored_now(sp: Sp, tmp_path: Path) -> None:
    """A file tracked in an old checkpoint and ignored now (its only copy is on disk): the
    rewind is refused before anything changes, so no later scan (which no longer knows the
    file is ignored once .gitignore is restored) can count it as the workspace's and delete it;
    moved away, the same rewind works."""
    ws = tmp_path / "ws"
    write(ws / "secret.env", "API_KEY=placeholder\n")
    write(ws / "main.py", "code\n")
    a = snap(sp, ws, "tracked by mistake")
    write(ws / ".gitignore", "secret.env\n")
    write(ws / "secret.env", "API_KEY=the-only-copy\n")
    snap(sp, ws, "now ignored")
    res = fails(sp, ws, "rewind", a["id"], code=1)
    assert "secret.env exists but is not in the snapshot" in res.err
    assert (ws / "secret.env").read_text() == "API_KEY=the-only-copy\n"
    assert (ws / ".gitignore").read_text() == "secret.env\n"  # nothing changed at all
    cli_json(sp, ws, "log")  # no half-done restore for the next command to complete
    assert (ws / "secret.env").read_text() == "API_KEY=the-only-copy\n"
    (ws / "secret.env").rename(tmp_path / "secret.env")
    cli_json(sp, ws, "rewind", a["id"])
    assert (ws / "secret.env").read_text() == "API_KEY=placeholder\n"


def test_rewind_never_replaces_an_ignored_file_with_a_directory(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws / "out/result.txt", "x\n")
    write(ws / "main.py", "code\n")
    a = snap(sp, ws, "out is a directory")
    (ws / "out/result.txt").unlink()
    (ws / "out").rmdir()
    write(ws / ".gitignore", "out\n")
    write(ws / "out", "an ignored local file\n")
    write(ws / "main.py", "code 2\n")
    snap(sp, ws, "out is an ignored file")
    res = fails(sp, ws, "rewind", a["id"], code=1)
    assert "out exists but is not in the snapshot" in res.err
    assert (ws / "out").read_text() == "an ignored local file\n"
    assert (ws / "main.py").read_text() == "code 2\n"  # refused before anything changed
    cli_json(sp, ws, "log")
    assert (ws / "out").read_text() == "an ignored local file\n"


def test_a_database_store_inside_the_workspace_is_never_snapshotted(sp: Sp, tmp_path: Path) -> None:
    """``--store agent.db`` in the workspace: the database and its side files are the store's,
    not the workspace's. They were snapshotted, and a rewind put an old copy over the live
    database: every checkpoint gone, the rewind's own safety checkpoint included."""
    ws = tmp_path / "ws"
    write(ws / "a.txt", "one\n")
    first = cli_json(sp, ws, "--store", "agent.db", "snap", "-m", "one")
    write(ws / "a.txt", "two\n")
    cli_json(sp, ws, "--store", "agent.db", "snap", "-m", "two")
    assert cli_json(sp, ws, "--store", "agent.db", "show", "HEAD")["workspace"]["files"] == 1
    cli_json(sp, ws, "--store", "agent.db", "rewind", first["id"])
    assert (ws / "a.txt").read_text() == "one\n"
    assert len(cli_json(sp, ws, "--store", "agent.db", "log")) == 3  # and the safety one
    assert sp("--store", "agent.db", "verify", cwd=ws).code == 0


def test_snap_sees_same_size_edit_with_restored_mtime(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    config = ws / "config.ini"
    write(config, "mode = aaaa\n")
    an_hour_ago = config.stat().st_mtime_ns - 3600 * 10**9
    os.utime(config, ns=(an_hour_ago, an_hour_ago))  # not "racy": the stat cache trusts it
    a = snap(sp, ws, "A")
    inode = config.stat().st_ino
    with config.open("r+b") as f:  # same inode, same size, and the mtime put back
        f.write(b"mode = bbbb\n")
    os.utime(config, ns=(an_hour_ago, an_hour_ago))
    assert (config.stat().st_ino, config.stat().st_mtime_ns) == (inode, an_hour_ago)
    b = snap(sp, ws, "B")
    assert a["workspace"]["tree"] != b["workspace"]["tree"]
    d = cli_json(sp, ws, "diff", a["id"], b["id"])
    assert d["files"] == [{"path": "config.ini", "status": "modified"}]


def lib_checkpoint(ws: Path, state: dict[str, Any], message: str) -> str:
    """What an agent built on the library does: checkpoint its state with the workspace."""
    with stashpoint.open(ws / ".stashpoint") as store:
        return store.session("main", workspace=ws).checkpoint(state, message=message).id


def test_rewind_files_only_and_state_only(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws / "plan.md", "1. read the code\n")
    write(ws / "src/main.py", "print('v1')\n")
    state_a = {"plan": "v1", "messages": [{"role": "user", "content": "fix the bug"}]}
    a = lib_checkpoint(ws, state_a, "A")
    tree_a = snapshot_tree(ws)
    sh(ws, "sed -i s/v1/v2/ src/main.py && rm plan.md && echo 'new' > added.txt")
    state_b = {
        "plan": "v2",
        "messages": [*state_a["messages"], {"role": "assistant", "content": "fixed"}],
    }
    b = lib_checkpoint(ws, state_b, "B")
    tree_b = snapshot_tree(ws)
    show_b = cli_json(sp, ws, "show", b)

    files_only = cli_json(sp, ws, "rewind", a, "--files-only")
    assert_same_tree(snapshot_tree(ws), tree_a, "after rewind --files-only")
    head = cli_json(sp, ws, "show", "HEAD")
    assert head["id"] == files_only["head"]["id"]
    assert head["state"] == state_b, "--files-only must keep the current state"
    assert head["manifest"]["tree"] == cli_json(sp, ws, "show", a)["manifest"]["tree"]

    cli_json(sp, ws, "rewind", files_only["safety"]["id"])
    assert_same_tree(snapshot_tree(ws), tree_b, "after undoing rewind --files-only")
    assert cli_json(sp, ws, "show", "HEAD")["state"] == state_b

    state_only = cli_json(sp, ws, "rewind", a, "--state-only")
    assert_same_tree(snapshot_tree(ws), tree_b, "files after rewind --state-only")
    head = cli_json(sp, ws, "show", "HEAD")
    assert head["id"] == state_only["head"]["id"]
    assert head["state"] == state_a
    assert head["manifest"]["tree"] == show_b["manifest"]["tree"]

    d = cli_json(sp, ws, "diff", a, b)
    assert d["values"] == [{"key": "plan", "status": "changed", "old": "v1", "new": "v2"}]
    assert (d["messages_removed"], d["messages_added"]) == (0, [state_b["messages"][1]])
    sp("verify", cwd=ws)


# -- fork, log, diff, show, label ----------------------------------------------------------


def test_fork_into_directory_is_an_independent_branch(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    build_workspace(ws)
    a = snap(sp, ws, "A")
    tree_a = snapshot_tree(ws)
    make_later_changes(ws)
    b = snap(sp, ws, "B")
    original = snapshot_tree(ws)

    other = tmp_path / "ws-b"
    forked = cli_json(sp, ws, "fork", a["id"], "--branch", "try-b", "--into", str(other))
    assert forked["branch"] == "try-b"
    assert_same_tree(snapshot_tree(other), kept(tree_a), "materialised fork")
    assert_same_tree(snapshot_tree(ws), original, "original workspace after fork --into")

    # Work in the fork records to the new branch and leaves the original alone.
    sh(other, "echo 'b only' > b-only.txt && rm README.md")
    in_b = snap(sp, other, "on try-b")
    assert (in_b["branch"], in_b["parent"]) == ("try-b", a["id"])
    assert cli_json(sp, other, "show", "HEAD")["id"] == in_b["id"]
    assert_same_tree(snapshot_tree(ws), original, "original workspace after a snap in the fork")
    assert not (ws / "b-only.txt").exists()

    # Work in the original continues main.
    write(ws / "main-only.txt", "main only\n")
    in_main = snap(sp, ws, "on main")
    assert (in_main["branch"], in_main["parent"]) == ("main", b["id"])
    assert not (other / "main-only.txt").exists()

    entries = {cp["id"]: cp for cp in cli_json(sp, ws, "log")}
    assert {entries[i]["branch"] for i in (in_b["id"], a["id"])} == {"try-b", "main"}
    assert entries[in_main["id"]]["branch"] == "main"
    assert log_ids(sp, other) == log_ids(sp, ws)  # one session, seen from either directory

    graph = sp("log", "--graph", cwd=ws).out
    assert "├─" in graph
    assert "HEAD -> main" in graph and "try-b" in graph
    for cp in (a, b, in_b, in_main):
        assert cp["id"][:12] in graph

    # A rewind inside the fork changes only the fork.
    cli_json(sp, other, "rewind", a["id"])
    assert_same_tree(snapshot_tree(other), kept(tree_a), "fork after its own rewind")
    assert (ws / "main-only.txt").exists()
    sp("verify", cwd=ws)


def test_diff_text_binary_and_json(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    build_workspace(ws)
    a = snap(sp, ws, "A")
    make_later_changes(ws)
    b = snap(sp, ws, "B")

    text = sp("diff", a["id"], b["id"], cwd=ws).out
    assert "--- a/src/app.py" in text and "+++ b/src/app.py" in text
    assert "-line 7: value = 7\n" in text and "+line 7: value = 700\n" in text
    assert "-hello from a unicode path\n" in text and "+goodbye from a unicode path\n" in text
    assert "Binary file data/blob.bin modified" in text
    assert "Binary file data/big.bin modified" in text
    assert "\x00" not in text
    assert "scratch" not in text and "app.log" not in text and ".git" not in text

    changes = {c["path"]: c["status"] for c in cli_json(sp, ws, "diff", a["id"], b["id"])["files"]}
    expected = {
        "src/app.py": "modified",
        "README.md": "modified",
        "src/util.py": "deleted",
        "日本.md": "deleted",
        "docs/日本-moved.md": "added",
        "café/naïve.txt": "modified",
        "bin/run.sh": "mode",
        "private": "mode",
        "data/big.bin": "modified",
        "data/blob.bin": "modified",
        "new/file.txt": "added",
        "newempty": "added",
        "empty": "deleted",
        "link-to-readme": "modified",
        "dangling": "deleted",
        "dangling2": "added",
        "nested/empty": "type",
        "nested/empty/deeper": "deleted",
        "turns-into-dir": "type",
        "turns-into-dir/inner.txt": "added",
    }
    for path, status in expected.items():
        assert changes.get(path) == status, f"{path}: {changes.get(path)} != {status}"
    assert not [p for p in changes if is_ignored(p)], changes
    assert cli_json(sp, ws, "diff", a["id"], a["id"])["files"] == []


def test_show_json_has_state_and_manifest(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    build_workspace(ws)
    a = snap(sp, ws, "A")
    tree = kept(snapshot_tree(ws))

    shown = cli_json(sp, ws, "show", a["id"])
    for key in ("id", "parent", "session", "branch", "step", "kind", "label", "message", "digest"):
        assert shown[key] == a[key], key
    assert shown["created_at"].endswith("Z")
    assert shown["state"] == {}
    manifest = shown["manifest"]
    assert manifest["root"] == str(ws.resolve())
    assert manifest["tree"] == a["workspace"]["tree"]
    assert manifest["files"] == sum(1 for kind, _m, _d in tree.values() if kind in "fl")
    assert manifest["bytes"] == sum(len(d) for kind, _m, d in tree.values() if kind == "f")

    listed = cli_json(sp, ws, "show", a["id"], "--files")["manifest"]["entries"]
    assert {(e["path"], e["type"]) for e in listed} == manifest_paths(tree)
    modes = {e["path"]: int(e["mode"], 8) for e in listed}
    assert modes["bin/run.sh"] == 0o755 and modes["private/key.txt"] == 0o600
    assert modes["private"] == 0o750

    entries = cli_json(sp, ws, "log")
    assert [e["id"] for e in entries] == [a["id"]]
    for key in ("id", "parent", "session", "branch", "step", "kind", "label", "message"):
        assert key in entries[0]


def test_label_names_a_checkpoint_everywhere(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws / "f.txt", "v1\n")
    a = snap(sp, ws, "A")
    tree_a = snapshot_tree(ws)
    write(ws / "f.txt", "v2\n")
    b = snap(sp, ws, "B")

    assert cli_json(sp, ws, "label", a["id"], "tests-pass") == {
        "id": a["id"],
        "label": "tests-pass",
    }
    assert cli_json(sp, ws, "show", "tests-pass")["id"] == a["id"]
    assert {e["id"]: e["label"] for e in cli_json(sp, ws, "log")}[a["id"]] == "tests-pass"
    assert "[tests-pass]" in sp("log", cwd=ws).out
    d = cli_json(sp, ws, "diff", "tests-pass", b["id"])
    assert (d["a"], d["files"]) == (a["id"], [{"path": "f.txt", "status": "modified"}])
    cli_json(sp, ws, "rewind", "tests-pass")
    assert_same_tree(snapshot_tree(ws), tree_a, "after rewind to a label")

    label_b = cli_json(sp, ws, "snap", "-m", "C", "--label", "at-snap")
    assert cli_json(sp, ws, "show", "at-snap")["id"] == label_b["id"]
    sp("label", "tests-pass", "--delete", cwd=ws)
    fails(sp, ws, "show", "tests-pass", code=EXIT_USER)


def test_exit_codes_for_user_errors(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws / "f.txt", "content\n")
    snap(sp, ws, "A")
    before = snapshot_tree(ws)
    unknown = "01ZZZZZZZZZZZZZZZZZZZZZZZZ"
    for args in (
        ("show", unknown),
        ("show", "no-such-label"),
        ("rewind", unknown),
        ("rewind", "HEAD~0x"),
        ("diff", unknown, "HEAD"),
        ("label", unknown, "x"),
        ("fork", unknown, "--into", str(tmp_path / "f")),
        ("rewind",),
        ("rewind", "HEAD", "--files-only", "--state-only"),
        ("snap", "--no-such-option"),
        ("no-such-command",),
        ("label", "HEAD"),
    ):
        fails(sp, ws, *args, code=EXIT_USER)
    assert_same_tree(snapshot_tree(ws), before, "workspace after failed commands")
    assert not (tmp_path / "f").exists()
    nostore = tmp_path / "nostore"
    nostore.mkdir()
    res = fails(sp, nostore, "log", code=EXIT_USER)
    assert "stashpoint init" in res.err
    assert sp("verify", cwd=ws).code == 0


# -- integrity: damage is detected and named -----------------------------------------------


def test_verify_names_checkpoint_with_flipped_byte_in_packed_blob(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    old = random.Random(1).randbytes(3000)
    write(ws / "data.bin", old)
    write(ws / "other.txt", "unchanged\n")
    a = snap(sp, ws, "A")
    write(ws / "data.bin", random.Random(2).randbytes(3000))
    b = snap(sp, ws, "B")
    sp("verify", cwd=ws)

    digest = hashlib.sha256(old).digest()
    flip_blob_row(ws, digest, offset=1500)

    res = fails(sp, ws, "verify", code=EXIT_INTEGRITY)
    assert digest.hex() in res.err and a["id"] in res.err
    assert b["id"] not in res.err, "B does not reference the damaged blob"
    report = json.loads(fails(sp, ws, "verify", "--json", code=EXIT_INTEGRITY).out)
    assert not report["ok"]
    assert {p["checkpoint"] for p in report["problems"]} == {a["id"]}
    # Reading the damaged content fails loudly instead of printing garbage.
    res = fails(sp, ws, "diff", a["id"], b["id"], code=EXIT_INTEGRITY)
    assert digest.hex() in res.err


def test_damaged_tree_object_fails_show_files_and_verify(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    a, b, _c = three_snaps(sp, ws)
    tree = bytes.fromhex(b["workspace"]["tree"])
    flip_blob_row(ws, tree, offset=5)

    res = fails(sp, ws, "verify", code=EXIT_INTEGRITY)
    assert b["id"] in res.err and tree.hex() in res.err
    assert a["id"] not in res.err
    fails(sp, ws, "show", b["id"], "--files", code=EXIT_INTEGRITY)
    fails(sp, ws, "diff", a["id"], b["id"], code=EXIT_INTEGRITY)
    sp("show", a["id"], "--files", cwd=ws)  # the rest of the store stays usable


def test_verify_names_blob_with_flipped_byte_in_chunk_file(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    content = random.Random(3).randbytes(3 * MIB + 123)
    write(ws / "model.bin", content)
    write(ws / "small.txt", "small\n")
    a = snap(sp, ws, "A")
    sp("verify", cwd=ws)

    chunk = hashlib.sha256(content[MIB : 2 * MIB]).digest()
    path = blob_file(ws, chunk)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x40
    path.write_bytes(bytes(data))

    res = fails(sp, ws, "verify", code=EXIT_INTEGRITY)
    assert chunk.hex() in res.err and a["id"] in res.err
    res = fails(sp, ws, "fork", a["id"], "--into", str(tmp_path / "copy"), code=EXIT_INTEGRITY)
    assert chunk.hex() in res.err


def test_verify_names_edited_checkpoint_record(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    a, b, c = three_snaps(sp, ws)
    edit_checkpoint_body(ws, b["id"], b'"message":"second"', b'"message":"SECOND"')

    res = fails(sp, ws, "verify", code=EXIT_INTEGRITY)
    assert b["id"] in res.err
    res = fails(sp, ws, "log", code=EXIT_INTEGRITY)
    assert b["id"] in res.err
    fails(sp, ws, "log", "--json", code=EXIT_INTEGRITY)
    res = fails(sp, ws, "show", b["id"], code=EXIT_INTEGRITY)
    assert b["id"] in res.err and "SECOND" not in res.out
    fails(sp, ws, "show", b["id"], "--json", code=EXIT_INTEGRITY)
    fails(sp, ws, "diff", a["id"], b["id"], code=EXIT_INTEGRITY)
    fails(sp, ws, "rewind", b["id"], code=EXIT_INTEGRITY)
    assert cli_json(sp, ws, "show", a["id"])["message"] == "first"
    assert cli_json(sp, ws, "show", c["id"])["message"] == "third"


def test_corrupt_head_offers_last_good_checkpoint(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    _a, b, c = three_snaps(sp, ws)
    edit_checkpoint_body(ws, c["id"], b'"message":"third"', b'"message":"thirD"')

    for args in (("show", "HEAD"), ("log",), ("snap", "-m", "on top of damage"), ("verify",)):
        res = fails(sp, ws, *args, code=EXIT_INTEGRITY)
        assert c["id"] in res.err, args
        if args[0] != "verify":
            assert b["id"] in res.err, f"`stashpoint {' '.join(args)}` does not offer {b['id']}"
    assert cli_json(sp, ws, "show", b["id"])["message"] == "second"


def test_verify_detects_checkpoint_deleted_from_the_middle_of_a_chain(
    sp: Sp, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    a, b, c = three_snaps(sp, ws)
    delete_checkpoint(ws, b["id"])

    res = fails(sp, ws, "verify", code=EXIT_INTEGRITY)
    assert c["id"] in res.err and b["id"] in res.err
    res = fails(sp, ws, "log", code=EXIT_INTEGRITY)
    assert c["id"] in res.err
    res = fails(sp, ws, "show", c["id"], code=EXIT_INTEGRITY)
    assert b["id"] in res.err
    fails(sp, ws, "show", "HEAD", "--json", code=EXIT_INTEGRITY)
    assert cli_json(sp, ws, "show", a["id"])["message"] == "first"


def test_failed_rewind_into_damaged_checkpoint_leaves_everything_usable(
    sp: Sp, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    write(ws / "a-first.txt", "first v1\n")
    write(ws / "z-last.txt", "last v1, a bit longer than one line\n" * 4)
    a = snap(sp, ws, "A")
    write(ws / "a-first.txt", "first v2\n")
    write(ws / "z-last.txt", "last v2\n")
    snap(sp, ws, "B")
    write(ws / "unsaved.txt", "work nobody saved yet\n")
    before = snapshot_tree(ws)
    damaged = hashlib.sha256(b"last v1, a bit longer than one line\n" * 4).digest()
    flip_blob_row(ws, damaged, offset=3)

    res = fails(sp, ws, "rewind", a["id"], code=EXIT_INTEGRITY)
    assert damaged.hex() in res.err
    assert not list(ws.rglob(".stashpoint-tmp-*"))
    # The store stays usable for everything that does not need the damaged blob, and the
    # failed rewind is rolled back rather than left half applied.
    snap(sp, ws, "after the failed rewind")
    assert_same_tree(snapshot_tree(ws), before, "workspace after a failed rewind")
    sp("log", cwd=ws)


def test_the_commands_an_agent_hook_runs_import_only_what_they_use(tmp_path: Path) -> None:
    """A coding agent's hook runs the CLI after every tool call: asyncio (~20 ms to import)
    is for async code only, not for a snapshot, a log or a rewind; nor are the durable-
    execution engine (~8 ms), thread pools, ctypes (file watching), temporary files,
    sockets or logging, for a snapshot or a log."""
    import sys

    (tmp_path / "f.txt").write_text("one\n")
    heavy = ["stashpoint.durable", "concurrent.futures", "ctypes", "tempfile", "socket", "logging"]
    heavy.append("pkgutil")  # only a derivation of detect-secrets rules lists its plugins
    code = (
        f"import runpy, sys\nHEAVY = {heavy!r}\n"
        "for args in (['snap', '-m', 'a'], ['snap', '-m', 'b'], ['log'], ['rewind', 'HEAD~1']):\n"
        "    sys.argv = ['stashpoint', *args]\n"
        "    try:\n"
        "        runpy.run_module('stashpoint', run_name='__main__')\n"
        "    except SystemExit as exc:\n"
        "        assert not exc.code, (args, exc.code)\n"
        "    if args == ['log']:\n"
        "        print('HEAVY', [m for m in HEAVY if m in sys.modules])\n"
        "print('ASYNCIO', 'asyncio' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "ASYNCIO False" in proc.stdout, proc.stdout
    assert "HEAVY []" in proc.stdout, proc.stdout


# Dataclasses still defined when `stashpoint snap` runs: public or backend-facing types whose
# dataclass behaviour (``dataclasses.replace``, ``vars``, ``__post_init__``) callers may use.
_SNAP_DATACLASSES = {
    "stashpoint.retention.Plan",
    "stashpoint.retention.Policy",
    "stashpoint.rewind.RewindResult",
    "stashpoint.stores.base.Commit",
    "stashpoint.stores.base.LogAppend",
    "stashpoint.upkeep.Upkeep",
    "stashpoint.upkeep.UpkeepReport",
    "stashpoint.workspace.restore.RestoreStats",
}


def test_a_snapshot_defines_no_new_dataclasses(tmp_path: Path) -> None:
    """Every CLI process pays for the classes its imports define: a dataclass compiles its
    generated methods from source at each import (~4.5 M instructions for a frozen one in
    Python 3.11; the bytecode cache does not cover them), a ``typing.NamedTuple`` ~0.7 M, a
    class with ``__slots__`` next to nothing. So value types on the start-up path of a
    command an agent's hook runs after every tool call are NamedTuples or plain classes."""
    import sys

    (tmp_path / "f.txt").write_text("one\n")
    code = (
        "import runpy, sys\n"
        "sys.argv = ['stashpoint', 'snap', '-m', 'a']\n"
        "try:\n"
        "    runpy.run_module('stashpoint', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "found = sorted(\n"
        "    f'{name}.{k}'\n"
        "    for name, m in list(sys.modules.items()) if name.startswith('stashpoint')\n"
        "    for k, v in vars(m).items()\n"
        "    if isinstance(v, type) and v.__module__ == name\n"
        "    and '__dataclass_fields__' in vars(v)\n"
        ")\n"
        "print('DATACLASSES', ' '.join(found))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("DATACLASSES"))
    assert set(line.split()[1:]) <= _SNAP_DATACLASSES


def test_the_url_a_store_reports_opens_the_same_store(sp: Sp, tmp_path: Path) -> None:
    """``sqlite:///…/.stashpoint/store.db`` (the URL a store reports, and `stashpoint ui`
    prints) is the store of that directory: the same blob directory and the same locks. It
    used to open a second, empty blob directory beside it: verify failed on a healthy store
    and a GC run that way saw no other process and freed blobs a writer was about to use."""
    ws = tmp_path / "ws"
    write(ws / "big.bin", os.urandom(3_000_000))  # a file too big to store inline
    snap(sp, ws, "one")
    with stashpoint.open(ws / ".stashpoint") as store:
        url = store.url
    assert url.endswith("/.stashpoint/store.db")
    with stashpoint.open(url) as again:
        assert again.home == (ws / ".stashpoint").resolve()
    assert sp("--store", url, "verify", cwd=ws).code == 0
    assert not (ws / ".stashpoint" / "store.db.d").exists()
    with stashpoint.open(ws / ".stashpoint"):  # open by its directory: GC is not alone
        report = cli_json(sp, ws, "--store", url, "gc")
    assert report["exclusive"] is False


def test_a_label_names_one_checkpoint_and_deleting_it_hides_it(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws / "f", "1\n")
    first = cli_json(sp, ws, "snap", "-m", "v1", "--label", "green")
    write(ws / "f", "2\n")
    second = cli_json(sp, ws, "snap", "-m", "v2", "--label", "green")  # moves the label
    assert cli_json(sp, ws, "show", "green")["id"] == second["id"]
    sp("label", first["id"], "green", cwd=ws)  # and back
    assert cli_json(sp, ws, "show", "green")["id"] == first["id"]
    labels = {cp["id"]: cp["label"] for cp in cli_json(sp, ws, "log")}
    assert labels == {first["id"]: "green", second["id"]: None}
    sp("label", first["id"], "--delete", cwd=ws)
    assert all(cp["label"] is None for cp in cli_json(sp, ws, "log"))
    assert "[green]" not in sp("log", cwd=ws).out
    fails(sp, ws, "show", "green", code=1)


def test_head_tilde_past_the_first_checkpoint_is_an_error(sp: Sp, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    write(ws / "f", "1\n")
    snap(sp, ws, "one")
    write(ws / "f", "2\n")
    snap(sp, ws, "two")
    assert "goes back only 1" in fails(sp, ws, "rewind", "HEAD~9", code=1).err
    assert (ws / "f").read_text() == "2\n"
    assert cli_json(sp, ws, "show", "HEAD~1")["message"] == "one"


def test_diff_lines_end_at_newlines_only(sp: Sp, tmp_path: Path) -> None:
    """Form feeds, lone carriage returns and U+2028 are characters inside a line, as for
    diff -u and patch, not line ends."""
    ws = tmp_path / "ws"
    write(ws / "doc.txt", "page1\fstill line 1\nline 2\u2028same line\n")
    a = snap(sp, ws, "A")
    write(ws / "doc.txt", "page1\fstill line 1 EDITED\nline 2\u2028same line\n")
    b = snap(sp, ws, "B")
    out = sp("diff", a["id"], b["id"], cwd=ws).out
    assert "-page1\fstill line 1\n+page1\fstill line 1 EDITED\n line 2\u2028same line\n" in out
    assert "No newline" not in out


def test_a_command_run_during_a_live_rewind_leaves_that_rewind_alone(
    sp: Sp, tmp_path: Path
) -> None:
    """Every command completes a rewind a crash interrupted; a rewind still running (its
    process holds the workspace's restore lock) is not interrupted: a `log` or a hook's `snap`
    run meanwhile used to "complete" it concurrently and delete its temp files."""
    from stashpoint.workspace import restoring

    ws = tmp_path / "ws"
    write(ws / "f.txt", "one\n")
    a = snap(sp, ws, "A")
    write(ws / "f.txt", "two\n")
    snap(sp, ws, "B")
    with stashpoint.open(ws / ".stashpoint") as store:
        run = store.session("main", workspace=ws)
        target = run.get(a["id"])
        safety = run.checkpoint(kind="pre-rewind", message="before rewind")
        assert store.home is not None
        with restoring(run.root, store.home / "locks"):  # type: ignore[arg-type]
            run._journal(target, safety)  # what a live rewind has written before its files
            cli_json(sp, ws, "log")
            assert (ws / "f.txt").read_text() == "two\n"  # not touched: the rewind is alive
        # The lock is free: the rewind is gone without finishing. The next command completes it.
        cli_json(sp, ws, "log")
        assert (ws / "f.txt").read_text() == "one\n"


def test_with_a_store_url_the_workspace_is_the_snapshotted_root_not_a_subdirectory(
    sp: Sp, tmp_path: Path
) -> None:
    """With --store (or $STASHPOINT_STORE) nothing marks the workspace root; run from a
    subdirectory of the root the session snapshotted, the root is still that directory: a
    rewind from proj/src used to pour the whole project into src, deleting its files."""
    proj = tmp_path / "proj"
    write(proj / "app.py", "main\n")
    write(proj / "src/lib.py", "lib v1\n")
    write(proj / "src/notes.txt", "keep me\n")
    store = str(tmp_path / "store")
    one = cli_json(sp, proj, "--store", store, "snap", "-m", "one")
    write(proj / "src/lib.py", "lib v2\n")
    cli_json(sp, proj / "src", "--store", store, "snap", "-m", "two")  # from the subdirectory
    assert cli_json(sp, proj, "--store", store, "show", "HEAD")["workspace"]["files"] == 3
    cli_json(sp, proj / "src", "--store", store, "rewind", one["id"])
    assert (proj / "src/lib.py").read_text() == "lib v1\n"
    assert sorted(p.name for p in (proj / "src").iterdir()) == ["lib.py", "notes.txt"]


def test_a_read_only_command_on_a_missing_store_path_fails_and_creates_nothing(
    sp: Sp, tmp_path: Path
) -> None:
    typo = tmp_path / "backupp" / ".stashpoint"
    assert (
        "no stashpoint store at" in fails(sp, tmp_path, "--store", str(typo), "verify", code=1).err
    )
    fails(sp, tmp_path, "--store", str(typo), "log", code=1)
    assert not (tmp_path / "backupp").exists()
