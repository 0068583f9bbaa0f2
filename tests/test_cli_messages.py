"""What a new user runs into at the command line: a command that must work as documented, a
refused command that must leave nothing behind, and errors that must name the real cause and
the way out (a fork that was killed, a directory that was deleted, every damaged file)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .conftest import Result
from .test_cli_e2e import flip_blob_row

Sp = Callable[..., Result]


def _snap(sp: Sp, ws: Path, message: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(sp("snap", "-m", message, "--json", cwd=ws).out)
    return out


def _project(root: Path, files: dict[str, str | bytes] | None = None) -> Path:
    root.mkdir(parents=True)
    for name, content in (files or {"a.txt": "a\n"}).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def test_import_into_the_empty_current_directory_works(sp: Sp, tmp_path: Path) -> None:
    src = _project(tmp_path / "src", {"a.txt": "a\n", "lib/b.py": "b = 1\n"})
    cp = _snap(sp, src, "one")
    sp("export", "-o", str(tmp_path / "run.spb"), cwd=src)

    here = tmp_path / "here"
    here.mkdir()
    res = sp("import", str(tmp_path / "run.spb"), "--into", ".", cwd=here, check=False)
    assert res.code == 0, res.err
    assert (here / "a.txt").read_text() == "a\n" and (here / "lib" / "b.py").exists()
    log = json.loads(sp("log", "--json", cwd=here).out)
    assert cp["id"] in [c["id"] for c in log]
    (here / "a.txt").write_text("changed\n")
    sp("snap", "-m", "here", cwd=here)  # the directory follows the imported branch
    sp("rewind", cp["id"], cwd=here)
    assert (here / "a.txt").read_text() == "a\n"

    # refused (the directory holds a file): nothing is created, not even the store
    busy = _project(tmp_path / "busy", {"mine.txt": "mine\n"})
    res = sp("import", str(tmp_path / "run.spb"), "--into", ".", cwd=busy, check=False)
    assert res.code == 1 and "not an empty directory" in res.err, res
    assert sorted(p.name for p in busy.iterdir()) == ["mine.txt"]


def test_the_documented_command_to_rewind_into_another_directory_works(
    sp: Sp, tmp_path: Path
) -> None:
    proj = _project(tmp_path / "proj")
    cp = _snap(sp, proj, "one")
    (proj / "a.txt").write_text("two\n")
    _snap(sp, proj, "two")
    other = tmp_path / "other"
    other.mkdir()

    help_text = " ".join(sp("rewind", "--help", cwd=proj).out.split())
    [documented] = re.findall(r"`(stashpoint [^`]*-C DIR rewind REF)`", help_text)
    argv = shlex.split(documented.replace("DIR", str(other)).replace("REF", cp["id"]))
    res = sp(*argv[1:], cwd=proj, check=False)  # run in the project, as the help says
    assert res.code == 0, (documented, res.err)
    assert (other / "a.txt").read_text() == "a\n"
    assert (proj / "a.txt").read_text() == "two\n"

    # -C alone looks for the store from DIR: the error names the store found here
    res = sp("-C", str(tmp_path / "other"), "log", cwd=proj, check=False)
    assert res.code == 1 and "--store" in res.err and str(proj / ".stashpoint") in res.err


def test_verify_names_every_damaged_file(sp: Sp, tmp_path: Path) -> None:
    contents = {f"d/f{i}.bin": random.Random(i).randbytes(3000) for i in range(10)}
    ws = _project(tmp_path / "ws", {"ok.txt": "fine\n", **contents})
    cp = _snap(sp, ws, "one")
    for content in contents.values():
        flip_blob_row(ws, hashlib.sha256(content).digest(), offset=1500)

    res = sp("verify", cwd=ws, check=False)
    assert res.code == 2 and "10 problem(s)" in res.out, res.out
    for name in contents:
        assert name in res.err, (name, res.err)
    report = json.loads(sp("verify", "--json", cwd=ws, check=False).out)
    assert len(report["problems"]) == 10
    assert {p["checkpoint"] for p in report["problems"]} == {cp["id"]}


def test_a_second_fork_of_a_checkpoint_gets_a_free_branch_name(sp: Sp, tmp_path: Path) -> None:
    proj = _project(tmp_path / "proj")
    cp = _snap(sp, proj, "one")
    a, b = tmp_path / "a", tmp_path / "b"
    first = json.loads(sp("fork", cp["id"], "--into", str(a), "--json", cwd=proj).out)
    second = json.loads(sp("fork", cp["id"], "--into", str(b), "--json", cwd=proj).out)
    assert first["branch"] == f"fork-{cp['id'][-8:].lower()}"
    assert second["branch"] == first["branch"] + "-2"
    assert (b / "a.txt").read_text() == "a\n"

    # the real error, not "branch ... already exists"
    res = sp("fork", cp["id"], "--into", str(a), cwd=proj, check=False)
    assert res.code == 1 and "not an empty directory" in res.err, res.err
    res = sp("fork", cp["id"], "-b", first["branch"], "--into", str(a), cwd=proj, check=False)
    assert res.code == 1 and "not an empty directory" in res.err, res.err


def test_a_fork_killed_after_writing_files_says_how_to_finish_it(sp: Sp, tmp_path: Path) -> None:
    proj = _project(tmp_path / "proj", {f"f{i}.txt": f"{i}\n" for i in range(5)})
    cp = _snap(sp, proj, "one")
    dest = tmp_path / "b"
    script = (  # kill -9 once the files are written, before the branch exists
        "import os, signal, sys\n"
        "from stashpoint.workspace import Workspace\n"
        "restore = Workspace.restore\n"
        "def die(*a, **k):\n"
        "    restore(*a, **k)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "Workspace.restore = die\n"
        "from stashpoint.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "fork", cp["id"], "-b", "b", "--into", str(dest)],
        cwd=proj,
        env=dict(os.environ, HOME=str(tmp_path)),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc
    assert (dest / "f0.txt").exists()

    res = sp("fork", cp["id"], "-b", "b", "--into", str(dest), cwd=proj, check=False)
    assert res.code == 1 and "interrupted" in res.err and "finishes it" in res.err, res.err
    sp("log", cwd=dest)  # as the message says
    assert json.loads(sp("log", "--json", cwd=dest).out)[0]["id"] == cp["id"]
    (dest / "f0.txt").write_text("changed\n")
    assert _snap(sp, dest, "b: first")["branch"] == "b"  # the fork is finished


def test_a_command_run_from_a_deleted_directory_says_so(sp: Sp, tmp_path: Path) -> None:
    proj = _project(tmp_path / "proj")
    _snap(sp, proj, "one")
    gone = proj / "sub"
    gone.mkdir()
    script = (
        "import os, sys\n"
        f"os.chdir({str(gone)!r}); os.rmdir({str(gone)!r})\n"
        "from stashpoint.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "log"],
        env=dict(os.environ, HOME=str(tmp_path)),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc
    assert "the current directory no longer exists" in proc.stderr, proc.stderr
