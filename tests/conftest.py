"""Shared fixtures: real directories, real SQLite stores, and the CLI run as a user types it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import stashpoint
from stashpoint.testing.engine import tree_of

# The opt-in pytest plugin, enabled here the way a user enables it.
pytest_plugins = ["stashpoint.testing.pytest_plugin"]

STASHPOINT = [sys.executable, "-m", "stashpoint"]


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
