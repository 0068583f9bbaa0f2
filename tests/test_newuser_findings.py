"""Findings of a new (and careless) user driving the CLI on a real project (an unpacked Django
5.1.4 sdist), each reduced to a small directory: data lost, written where the user did not
point, or a message that sends the user the wrong way."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

import stashpoint

from .conftest import Result

Sp = Callable[..., Result]


def _undo_command(out: str) -> list[str]:
    line = out.split("undo with: ", 1)[1].strip().splitlines()[0]
    argv = shlex.split(line)
    assert argv[0] == "stashpoint"
    return argv[1:]


def test_undo_hint_survives_the_rewind_deleting_the_cwd(sp: Sp, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "a.txt").write_text("a\n")
    sp("snap", "-m", "one", cwd=proj)
    sub = proj / "newpkg"
    sub.mkdir()
    (sub / "b.py").write_text("b = 1\n")
    sp("snap", "-m", "two", cwd=proj)

    res = sp("--store", "../.stashpoint", "rewind", "HEAD~1", cwd=sub)
    assert not sub.exists()  # the rewind removed the directory it was run from
    undo = sp(*_undo_command(res.out), cwd=tmp_path, check=False)
    assert undo.code == 0, undo.err
    assert (sub / "b.py").read_text() == "b = 1\n"


def test_rewind_replaces_a_symlink_to_outside_without_looking_through_it(
    sp: Sp, tmp_path: Path
) -> None:
    proj = tmp_path / "proj"
    (proj / "ext").mkdir(parents=True)
    (proj / "ext" / "a.txt").write_text("inside\n")
    sp("snap", "-m", "ext is a directory", cwd=proj)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.txt").write_text("precious\n")
    (proj / "ext" / "a.txt").unlink()
    (proj / "ext").rmdir()
    (proj / "ext").symlink_to(outside)
    sp("snap", "-m", "ext is a link", cwd=proj)

    res = sp("rewind", "HEAD~1", cwd=proj, check=False)
    assert (outside / "a.txt").read_text() == "precious\n"  # holds today too
    assert sorted(p.name for p in outside.iterdir()) == ["a.txt"]
    assert res.code == 0, res.err
    assert not (proj / "ext").is_symlink()
    assert (proj / "ext" / "a.txt").read_text() == "inside\n"


def test_store_pointed_at_a_project_dir_does_not_blind_the_project(sp: Sp, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "app.py").write_text("print('hi')\n")
    sib = tmp_path / "sib"
    sib.mkdir()
    (sib / "notes.txt").write_text("n\n")

    sp("--store", "../proj", "snap", cwd=sib, check=False)  # a careless user's typo
    gitignore = proj / ".gitignore"
    assert not (gitignore.exists() and gitignore.read_text().strip().endswith("*"))

    sp("snap", "-m", "in the project", cwd=proj)
    show = sp("show", "HEAD", "--json", "--files", cwd=proj)
    assert '"app.py"' in show.out, show.out


def test_imported_session_short_ids_are_unique(sp: Sp, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    with stashpoint.open(proj / ".stashpoint") as store:
        run = store.session("main")
        for i in range(40):
            run.checkpoint({"i": i}, message=f"s{i}")
    sp("export", "-o", str(tmp_path / "b.spb"), cwd=proj)
    sp("import", str(tmp_path / "b.spb"), "--as", "other", cwd=proj)

    shown = [line.split()[0] for line in sp("--session", "other", "log", cwd=proj).out.splitlines()]
    assert len(shown) == 40
    assert len(set(shown)) == 40, f"{40 - len(set(shown))} short ids repeat"
    with stashpoint.open(proj / ".stashpoint") as store:  # each printed id is usable
        run = store.session("other")
        assert len({run.resolve(short) for short in shown}) == 40


def test_fork_dir_after_original_project_moved_creates_nothing(sp: Sp, tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    (a / "f.txt").write_text("1\n")
    sp("snap", "-m", "one", cwd=a)
    sp("fork", "HEAD", "--branch", "b", "--into", "../b", cwd=a)
    a.rename(tmp_path / "a-moved")  # the user moves the original project

    log = sp("log", cwd=tmp_path / "b", check=False)
    assert not a.exists(), "a read-only command recreated the moved project's directory"
    assert log.code != 0 or "a-moved" in log.out + log.err
    (tmp_path / "b" / "g.txt").write_text("2\n")
    sp("snap", "-m", "in the fork", cwd=tmp_path / "b", check=False)
    assert not a.exists(), "snap wrote a new store where the moved project used to be"
