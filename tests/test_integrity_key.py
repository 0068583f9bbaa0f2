"""A store whose hash chain is keyed says so: the CLI passes the key from the environment,
and a missing or wrong key is refused with a message saying which (exit 1), where `verify`
used to report every record as corrupt (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import stashpoint
from stashpoint.errors import UsageError

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))


def _cli(store: Path, *args: str, key: bytes | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STASHPOINT_")}
    if key is not None:
        env["STASHPOINT_INTEGRITY_KEY"] = key.hex()
    return subprocess.run(
        [sys.executable, "-m", "stashpoint", "--store", str(store), *args],
        capture_output=True,
        text=True,
        env=env,
    )


def test_a_keyed_store_needs_its_key_and_says_so(tmp_path: Path) -> None:
    store_dir = tmp_path / "st"
    with stashpoint.open(store_dir, key=KEY) as store:
        store.session("s").checkpoint({"n": 1})
        store.session("s").checkpoint({"n": 2})

    done = _cli(store_dir, "--session", "s", "verify", key=KEY)
    assert done.returncode == 0, done.stdout + done.stderr
    missing = _cli(store_dir, "--session", "s", "verify")
    assert missing.returncode == 1, missing.stdout + missing.stderr
    assert "keyed hash chain" in missing.stderr and "STASHPOINT_INTEGRITY_KEY" in missing.stderr
    wrong = _cli(store_dir, "--session", "s", "verify", key=OTHER)
    assert wrong.returncode == 1 and "wrong integrity key" in wrong.stderr, wrong.stderr

    with pytest.raises(UsageError, match="keyed hash chain"):
        stashpoint.open(store_dir, key=b"")
    with pytest.raises(UsageError, match="wrong integrity key"):
        stashpoint.open(store_dir, key=OTHER)
    with stashpoint.open(store_dir, key=KEY) as store:
        assert store.session("s").state() == {"n": 2}


def test_an_unkeyed_store_opens_without_a_key(tmp_path: Path) -> None:
    with stashpoint.open(tmp_path / "st", key=b"") as store:
        store.session("s").checkpoint({"n": 1})
    assert _cli(tmp_path / "st", "--session", "s", "verify").returncode == 0
