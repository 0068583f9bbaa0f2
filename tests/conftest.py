"""Shared fixtures: real directories, real SQLite stores, and the CLI run as a user types it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import stashpoint
from stashpoint.testing.engine import tree_of

# The opt-in pytest plugin, enabled here the way a user enables it.
pytest_plugins = ["stashpoint.testing.pytest_plugin"]

STASHPOINT = [sys.executable, "-m", "stashpoint"]

# Rollback witnesses (stashpoint.witness) go to a directory of this test run, never to the
# real home; subprocesses inherit it. Tests of the witness itself point it elsewhere.
os.environ["STASHPOINT_WITNESS_DIR"] = tempfile.mkdtemp(prefix="stashpoint-witness-")


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def sp(tmp_path: Path) -> Iterator[object]:
    """Run ``stashpoint ARGS`` in a subprocess; ``sp(*args, cwd=...)`` -> Result."""
    env = dict(os.environ)
    env.pop("STASHPOINT_STORE", None)
    env.pop("STASHPOINT_SESSION", None)
    env.pop("STASHPOINT_KEY", None)  # tests that encrypt set their own key
    env.pop("STASHPOINT_KEY_FILE", None)
    env["HOME"] = str(tmp_path)  # discovery stops at $HOME: keep it inside the test

    def run(
        *args: str, cwd: Path | str | None = None, check: bool = True, input: str | None = None
    ) -> Result:
        proc = subprocess.run(
            [*STASHPOINT, *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            input=input,
            timeout=300,
        )
        res = Result(proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"stashpoint {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}"
            )
        return res

    yield run


@pytest.fixture
def store(tmp_path: Path) -> Iterator[stashpoint.Store]:
    s = stashpoint.open(tmp_path / "store")
    yield s
    s.close()


snapshot_tree = tree_of
"""Everything under a workspace but the store: path -> (type, mode, content or link target)."""


def assert_restores_from_empty(run: stashpoint.Session, cp_id: str, ws: Path) -> None:
    """``cp_id`` (just taken of ``ws``) puts back exactly what ``ws`` holds now, into the
    workspace emptied: every file is read back from the store, none left where it was."""
    import shutil

    before = snapshot_tree(ws)
    shutil.rmtree(ws)
    ws.mkdir()
    run.rewind(cp_id)
    assert snapshot_tree(ws) == before


def stop_watch_daemon(pid: int, marker: Path) -> None:
    """SIGTERM the watch daemon ``pid`` a test started, if it still runs: only when that pid
    is still a watch daemon whose command line names ``marker`` (the test's directory), never
    a process that got the number after the daemon exited."""
    import signal

    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return
    if b"stashpoint.watch_daemon" in cmdline and os.fsencode(marker) in cmdline:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
