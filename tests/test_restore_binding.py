"""Restores write only where the user pointed them: the workspace a branch is bound to, or a
directory named explicitly. Each test drives the CLI as a user types it, on real
directories, and reproduces a way files were lost before the rule existed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import stashpoint

from .conftest import Result, snapshot_tree

Sp = Callable[..., Result]
EXIT_USER, EXIT_INTEGRITY = 1, 2


def make_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def snap_json(sp: Sp, *args: str, cwd: Path) -> dict[str, object]:
    out: dict[str, object] = json.loads(sp("snap", "--json", *args, cwd=cwd).out)
    return out


def head_of(proj: Path, branch: str = "main") -> str | None:
    with stashpoint.open(proj / ".stashpoint") as store:
        return store.meta.get_head("main", branch)


# -- 1. the wrong directory ---------------------------------------------------------------


def test_rewind_from_another_directory_is_refused_and_the_undo_hint_works_anywhere(
    tmp_path: Path, sp: Sp
) -> None:
    proj, other = tmp_path / "proj", tmp_path / "checkout"
    make_tree(proj, {"a.txt": "one\n"})
    make_tree(other, {f"src/m{i}.py": f"x = {i}\n" for i in range(20)})
    first = snap_json(sp, "-m", "one", cwd=proj)
    (proj / "a.txt").write_text("two\n")
    (proj / "b.txt").write_text("new\n")
    snap_json(sp, "-m", "two", cwd=proj)
    store = str(proj / ".stashpoint")
    before = snapshot_tree(other)

    # The command a user copies from a log or a hint, run from another directory.
    res = sp("--store", store, "rewind", str(first["id"]), "--files-only", cwd=other, check=False)
    assert res.code == EXIT_USER, res
    assert str(proj) in res.err and str(other) in res.err and "-C" in res.err
    assert snapshot_tree(other) == before  # not one file of the other directory touched

    # In the directory it belongs to, the rewind works and prints an undo that works anywhere.
    out = json.loads(sp("rewind", str(first["id"]), "--json", cwd=proj).out)
    assert not (proj / "b.txt").exists()
    undo = out["undo"]
    assert "--store" in undo and "-C" in undo, undo
    args = undo.split()[1:]  # paths here hold no spaces: the hint is shell-quoted anyway
    sp(*args, cwd=other)
    assert (proj / "b.txt").read_text() == "new\n"
    assert snapshot_tree(other) == before


def test_a_rewind_from_another_directory_says_where_to_run_it_whatever_its_reference(
    tmp_path: Path, sp: Sp
) -> None:
    """The directory is checked before the reference: a user in the wrong directory hears
    that, not that ``HEAD~1`` of a branch rewound to its first checkpoint does not exist."""
    proj, other = tmp_path / "proj", tmp_path / "elsewhere"
    make_tree(proj, {"a.txt": "one\n"})
    other.mkdir()
    snap_json(sp, "-m", "one", cwd=proj)
    (proj / "a.txt").write_text("two\n")
    snap_json(sp, "-m", "two", cwd=proj)
    sp("rewind", "HEAD~1", cwd=proj)  # the head is the first checkpoint now
    store = str(proj / ".stashpoint")
    head, before = head_of(proj), snapshot_tree(proj)
    for ref in ("HEAD~1", "HEAD", "HEAD~7", "no-such-label"):
        res = sp("--store", store, "rewind", ref, cwd=other, check=False)
        assert res.code == EXIT_USER, (ref, res)
        assert f"its workspace is {proj}" in res.err, (ref, res.err)
        assert f"cd {proj}" in res.err and f"-C {other}" in res.err, (ref, res.err)
        assert "goes back only" not in res.err and "no checkpoint" not in res.err
    assert head_of(proj) == head and snapshot_tree(proj) == before
    assert list(other.iterdir()) == []
    # where the workspace is, the reference is what is wrong, and said so
    res = sp("rewind", "HEAD~1", cwd=proj, check=False)
    assert res.code == EXIT_USER and "goes back only 0 checkpoint(s)" in res.err, res


def test_an_explicit_directory_is_a_deliberate_restore_there(tmp_path: Path, sp: Sp) -> None:
    proj, copy = tmp_path / "proj", tmp_path / "copy"
    make_tree(proj, {"a.txt": "one\n"})
    first = snap_json(sp, cwd=proj)
    copy.mkdir()
    (copy / "stray.txt").write_text("x\n")
    store = str(proj / ".stashpoint")
    sp("--store", store, "-C", str(copy), "rewind", str(first["id"]), "--files-only", cwd=tmp_path)
    assert (copy / "a.txt").read_text() == "one\n"
    assert not (copy / "stray.txt").exists()  # a restore makes the tree equal: as asked


# -- 2. a bundle's recorded root ----------------------------------------------------------


def test_an_imported_bundle_never_chooses_the_directory(tmp_path: Path, sp: Sp) -> None:
    # The sender snapshotted a directory at the path where the victim keeps their files.
    victim = tmp_path / "victim"
    make_tree(victim, {"evil.txt": "planted\n"})
    sender_store = tmp_path / "sender-store"
    sp("--store", str(sender_store), "snap", "-m", "x", cwd=victim)
    bundle = tmp_path / "x.spb"
    sp("--store", str(sender_store), "export", "-o", str(bundle), cwd=tmp_path)
    for p in victim.iterdir():
        p.unlink()
    make_tree(victim, {"notes.txt": "mine\n", "work/keep.txt": "mine too\n"})
    before = snapshot_tree(tmp_path / "victim")

    store = str(tmp_path / "mystore")
    work = victim / "work"
    sp("--store", store, "import", str(bundle), cwd=work)
    for cmd in (("rewind", "HEAD"), ("rewind", "HEAD", "--files-only"), ("fork", "HEAD")):
        res = sp("--store", store, *cmd, cwd=work, check=False)
        assert res.code == EXIT_USER, (cmd, res)
        assert "bound to no directory" in res.err and "-C" in res.err
        assert snapshot_tree(victim) == before, cmd

    # Named explicitly, a new directory gets the bundle's files; nothing else changes.
    sp("--store", store, "fork", "HEAD", "--into", str(tmp_path / "replay"), cwd=work)
    assert (tmp_path / "replay" / "evil.txt").read_text() == "planted\n"
    assert snapshot_tree(victim) == before

    # import --into: the imported branch gets the directory named, and works from there.
    other = str(tmp_path / "other-store")
    into = tmp_path / "imported"
    res = sp("--store", other, "import", str(bundle), "--into", str(victim), cwd=work, check=False)
    assert res.code == EXIT_USER and "not an empty directory" in res.err, res
    assert not Path(other).exists()  # refused before anything was written
    out = json.loads(
        sp("--store", other, "import", str(bundle), "--into", str(into), "--json", cwd=work).out
    )
    assert out["workspace"] == str(into)
    assert (into / "evil.txt").read_text() == "planted\n"
    (into / "evil.txt").write_text("edited\n")
    sp("rewind", "HEAD", cwd=into)  # bound there now: no flag needed
    assert (into / "evil.txt").read_text() == "planted\n"
    assert snapshot_tree(victim) == before


# -- 3. artifacts at absolute paths ---------------------------------------------------------


def test_artifacts_go_only_where_the_user_says_and_never_over_the_store(
    tmp_path: Path, sp: Sp
) -> None:
    cron = tmp_path / "etc" / "cron.d" / "job"
    proj = tmp_path / "proj"
    db = proj / ".stashpoint" / "store.db"
    # The sender attaches files from the paths where the victim keeps a cron job and, later,
    # the store itself.
    sender = tmp_path / "sender"
    sender.mkdir()
    make_tree(tmp_path, {"etc/cron.d/job": "* * * * * root evil\n"})
    db.parent.mkdir(parents=True)
    db.write_bytes(b"not a database")
    sp("snap", "--artifact", f"job={cron}", "--artifact", f"db={db}", cwd=sender)
    sp("export", "-o", str(tmp_path / "a.spb"), cwd=sender)
    cron.unlink()
    cron.parent.rmdir()
    db.unlink()
    db.parent.rmdir()
    make_tree(proj, {"code.py": "x = 1\n"})
    sp("snap", cwd=proj)
    sp("import", str(tmp_path / "a.spb"), "--as", "theirs", cwd=proj)
    db_before = hashlib.sha256(db.read_bytes()).hexdigest()

    theirs = ("--session", "theirs", "rewind", "HEAD", "--state-only")
    res = sp(*theirs, "--artifacts", cwd=proj, check=False)
    assert res.code == EXIT_USER, res
    assert str(cron) in res.err and str(db) in res.err and "--artifacts-to" in res.err
    assert not cron.parent.exists()  # no directory chain made either

    # Even with consent to use the recorded paths, never over the store's own files; and
    # nothing at all is written when one target is refused.
    res = sp(*theirs, "--artifacts", "--artifacts-to-recorded-paths", cwd=proj, check=False)
    assert res.code == EXIT_USER and "store's own file" in res.err, res
    assert hashlib.sha256(db.read_bytes()).hexdigest() == db_before
    assert not cron.parent.exists()
    sp("verify", cwd=proj)

    out = tmp_path / "restored"
    rew = json.loads(sp(*theirs, "--artifacts", "--artifacts-to", str(out), "--json", cwd=proj).out)
    assert rew["artifact_paths"] == {
        "job": str(out / "etc" / "cron.d" / "job"),
        "db": str(out / "proj" / ".stashpoint" / "store.db"),
    }
    assert (out / "etc" / "cron.d" / "job").read_text() == "* * * * * root evil\n"
    assert not cron.exists()
    sp("verify", cwd=proj)

    # With explicit consent, the recorded path (listed in the refusal) is used.
    res = sp(*theirs, "--artifact", "job", "--artifacts-to-recorded-paths", cwd=proj)
    assert str(cron) in res.out
    assert cron.read_text() == "* * * * * root evil\n"
    sp("verify", cwd=proj)


# -- 4, 5. refused commands create nothing ----------------------------------------------------


def test_a_refused_snapshot_of_home_leaves_no_store(tmp_path: Path, sp: Sp) -> None:
    home = tmp_path  # the fixture's $HOME
    res = sp("snap", cwd=home, check=False)
    assert res.code == EXIT_USER and "refusing to snapshot" in res.err
    assert not (home / ".stashpoint").exists()
    res = sp("--store", str(home / "elsewhere"), "snap", cwd=home, check=False)
    assert res.code == EXIT_USER
    assert not (home / "elsewhere").exists()
    # Nothing for discovery to find from a directory below.
    (home / "proj").mkdir()
    res = sp("log", cwd=home / "proj", check=False)
    assert res.code == EXIT_USER and "no stashpoint store" in res.err


def test_a_typo_in_C_is_an_error_and_creates_nothing(tmp_path: Path, sp: Sp) -> None:
    missing = tmp_path / "nonexistent"
    for cmd in (("snap",), ("log",), ("init",)):
        res = sp("-C", str(missing), *cmd, cwd=tmp_path, check=False)
        assert res.code == EXIT_USER, (cmd, res)
        assert str(missing) in res.err
        assert not missing.exists(), cmd


# -- 6. git ignores the store ------------------------------------------------------------------


def test_git_does_not_see_the_store(tmp_path: Path, sp: Sp) -> None:
    proj = tmp_path / "proj"
    make_tree(proj, {"a.txt": "one\n"})
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=proj, check=True)
    sp("snap", cwd=proj)
    status = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=all"],
        cwd=proj,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert ".stashpoint" not in status and "a.txt" in status
    subprocess.run([*git, "add", "-A"], cwd=proj, check=True)
    listed = subprocess.run(
        [*git, "ls-files", "--cached"], cwd=proj, check=True, capture_output=True, text=True
    ).stdout
    assert listed.split() == ["a.txt"]
    # The store's own snapshot does not include it either (a rewind never touches it).
    assert json.loads(sp("show", "HEAD", "--json", cwd=proj).out)["workspace"]["files"] == 1


# -- 7. a failed rewind moves nothing -----------------------------------------------------------


def test_a_rewind_that_hits_damaged_data_leaves_head_and_files_as_they_were(
    tmp_path: Path, sp: Sp
) -> None:
    proj = tmp_path / "proj"
    make_tree(proj, {"a.txt": "one\n"})
    (proj / "big.bin").write_bytes(os.urandom(3 << 20))  # stored as chunk files
    first = snap_json(sp, "-m", "one", cwd=proj)
    chunks_before = set((proj / ".stashpoint" / "blobs").rglob("*"))
    (proj / "big.bin").write_bytes(os.urandom(3 << 20))
    (proj / "a.txt").write_text("two\n")
    second = snap_json(sp, "-m", "two", cwd=proj)
    for p in chunks_before:  # damage the first version's content
        if p.is_file() and len(p.name) == 64:
            raw = bytearray(p.read_bytes())
            raw[len(raw) // 2] ^= 0xFF
            p.write_bytes(bytes(raw))
    before = snapshot_tree(proj)

    res = sp("rewind", str(first["id"]), cwd=proj, check=False)
    assert res.code == EXIT_INTEGRITY, res
    assert snapshot_tree(proj) == before
    assert head_of(proj) == second["id"]
    res = sp("rewind", str(first["id"]), "--files-only", cwd=proj, check=False)
    assert res.code == EXIT_INTEGRITY, res
    assert snapshot_tree(proj) == before
    assert head_of(proj) == second["id"]
    res = sp("fork", str(first["id"]), "-b", "try", cwd=proj, check=False)
    assert res.code == EXIT_INTEGRITY, res
    assert snapshot_tree(proj) == before
    assert head_of(proj) == second["id"]
    assert head_of(proj, "try") is None


@pytest.mark.parametrize("where", ["before-link", "during-restore"])
def test_a_killed_fork_into_leaves_nothing_that_blocks_a_rerun(
    tmp_path: Path, sp: Sp, where: str
) -> None:
    proj, dest = tmp_path / "proj", tmp_path / "b"
    make_tree(proj, {f"f{i}.txt": f"{i}\n" for i in range(5)})
    cp = snap_json(sp, cwd=proj)
    # kill -9 at an exact instant: the process kills itself there.
    hook = {
        "before-link": "stashpoint.session.Session._write_link_file",
        "during-restore": "stashpoint.workspace.Workspace.restore",
    }[where]
    mod, _, attr = hook.rpartition(".")
    mod, _, cls = mod.rpartition(".")
    script = (
        "import os, signal, sys, importlib\n"
        "def die(*a, **k): os.kill(os.getpid(), signal.SIGKILL)\n"
        f"setattr(getattr(importlib.import_module({mod!r}), {cls!r}), {attr!r}, die)\n"
        "from stashpoint.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    env = dict(os.environ, HOME=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", script, "fork", str(cp["id"]), "-b", "b", "--into", str(dest)],
        cwd=proj,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -9, proc
    # Re-running the same command finishes the job.
    sp("fork", str(cp["id"]), "-b", "b", "--into", str(dest), cwd=proj)
    assert sorted(p.name for p in dest.iterdir()) == [".stashpoint", *sorted(
        f"f{i}.txt" for i in range(5))]  # fmt: skip
    log = json.loads(sp("log", "--json", cwd=dest).out)
    assert log[0]["id"] == cp["id"] and log[0]["branch"] in ("main", "b")
    (dest / "f0.txt").write_text("changed\n")
    sp("snap", "-m", "b: first", cwd=dest)
    assert json.loads(sp("log", "--json", cwd=dest).out)[0]["branch"] == "b"


def test_a_snapshot_of_another_directory_is_refused_unless_named(tmp_path: Path, sp: Sp) -> None:
    """A snap run elsewhere with the project's store would put that directory's files in
    the project's history, where a rewind in the project pours them over it."""
    proj, sib = tmp_path / "proj", tmp_path / "sib"
    make_tree(proj, {"a.txt": "one\n"})
    make_tree(sib, {"b.txt": "sibling\n"})
    snap_json(sp, cwd=proj)
    store = str(proj / ".stashpoint")
    count = len(json.loads(sp("log", "--json", cwd=proj).out))
    res = sp("--store", store, "snap", "-m", "oops", cwd=sib, check=False)
    assert res.code == EXIT_USER and str(proj) in res.err and "--session" in res.err, res
    assert len(json.loads(sp("log", "--json", cwd=proj).out)) == count
    # Its own session, or the directory named explicitly, is a deliberate choice.
    sp("--store", store, "--session", "sib", "snap", cwd=sib)
    res = sp("--store", store, "-C", str(sib), "snap", "-m", "named", cwd=tmp_path)
    assert "warning" in res.err and str(proj) in res.err
    sp("rewind", "HEAD~1", cwd=proj)  # the project is still the branch's directory
    assert (proj / "a.txt").read_text() == "one\n" and not (proj / "b.txt").exists()


# -- 8. a new branch's directory lies outside every workspace ------------------------------------


def branches_of(store: Path) -> dict[str, dict[str, str]]:
    with stashpoint.open(store) as s:
        return {name: s.meta.branches(name) for name in s.meta.sessions()}


def test_a_fork_or_import_into_a_directory_inside_a_workspace_is_refused(
    tmp_path: Path, sp: Sp
) -> None:
    """Nested in the workspace, the fork's files were snapshotted by the outer branch and
    its next rewind deleted the fork's unsaved work."""
    proj = tmp_path / "proj"
    make_tree(proj, {"a.txt": "a\n"})
    snap_json(sp, "-m", "one", "-l", "one", cwd=proj)
    store = proj / ".stashpoint"
    before, branches = snapshot_tree(proj), branches_of(store)

    res = sp("fork", "one", "-b", "try-b", "--into", "./try-b", cwd=proj, check=False)
    assert res.code == EXIT_USER, res
    assert "inside the workspace" in res.err and str(tmp_path / "try-b") in res.err, res.err
    assert snapshot_tree(proj) == before and branches_of(store) == branches  # nothing made
    res = sp("fork", "one", "-b", "try-b", "--into", "deeper/x", cwd=proj, check=False)
    assert res.code == EXIT_USER and not (proj / "deeper").exists(), res

    bundle = tmp_path / "run.spb"
    sp("export", "-o", str(bundle), cwd=proj)
    res = sp("import", str(bundle), "--as", "ci", "--into", "replay", cwd=proj, check=False)
    assert res.code == EXIT_USER and "inside the workspace" in res.err, res
    assert snapshot_tree(proj) == before and branches_of(store) == branches
    res = sp("import", str(bundle), "--into", ".stashpoint/x", cwd=proj, check=False)
    assert res.code == EXIT_USER and "inside the store" in res.err, res
    assert branches_of(store) == branches
    # A store the import makes holds no workspace yet: only the store itself is refused.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    res = sp("import", str(bundle), "--into", ".stashpoint", cwd=fresh, check=False)
    assert res.code == EXIT_USER and "inside the store" in res.err, res
    assert list(fresh.iterdir()) == []

    # The reverse: a directory holding the workspace (a store kept elsewhere) is not empty.
    outer = tmp_path / "outer"
    make_tree(outer / "ws", {"b.txt": "b\n"})
    other = str(tmp_path / "other-store")
    sp("--store", other, "snap", "-l", "b", cwd=outer / "ws")
    before_outer = snapshot_tree(outer)
    for cmd in (("fork", "b", "--into", str(outer)), ("import", str(bundle), "--into", str(outer))):
        res = sp("--store", other, *cmd, cwd=outer / "ws", check=False)
        assert res.code == EXIT_USER and "not an empty directory" in res.err, res
    assert snapshot_tree(outer) == before_outer

    # Beside the workspace, as the refusal suggests, the fork works and both stay apart.
    sp("fork", "one", "-b", "try-b", "--into", "../try-b", cwd=proj)
    (tmp_path / "try-b" / "work.txt").write_text("unsaved work of try-b\n")
    (proj / "b.txt").write_text("b\n")
    sp("snap", "-m", "two", cwd=proj)
    sp("rewind", "one", cwd=proj)
    assert (tmp_path / "try-b" / "work.txt").read_text() == "unsaved work of try-b\n"
