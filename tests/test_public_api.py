"""The curated public surface and the CLI's self-documentation stay complete."""

from __future__ import annotations

import subprocess
import sys

import pytest

import stashpoint
from stashpoint.cli import cli

CONTRACT_NOW = [
    *("init", "snap", "log", "show", "diff", "rewind", "fork", "label", "edit", "tasks"),
    *("resume", "approve", "reject", "prune", "gc", "du", "verify", "export", "import"),
    *("hooks", "chaos", "demo"),
]


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert stashpoint.__all__ == sorted(stashpoint.__all__)
    for name in stashpoint.__all__:
        assert getattr(stashpoint, name) is not None


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        stashpoint.does_not_exist  # noqa: B018


def test_errors_form_one_tree_with_exit_codes() -> None:
    for name in stashpoint.__all__:
        obj = getattr(stashpoint, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and name.endswith("Error"):
            assert issubclass(obj, stashpoint.StashpointError)
    assert stashpoint.IntegrityError.exit_code == 2
    assert stashpoint.ConflictError.exit_code == 3
    assert stashpoint.UsageError.exit_code == 1


@pytest.mark.parametrize("command", CONTRACT_NOW)
def test_every_command_has_help_with_an_example(command: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stashpoint", command, "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "Example" in proc.stdout, f"`stashpoint {command} --help` shows no example"
    assert command in cli.commands


def test_top_level_help_lists_commands_and_exit_codes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stashpoint", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0
    for command in CONTRACT_NOW:
        assert command in proc.stdout
    assert "Exit codes" in proc.stdout


def test_usage_errors_exit_1() -> None:
    for args in (["--no-such-option"], ["rewind"], ["no-such-command"]):
        proc = subprocess.run(
            [sys.executable, "-m", "stashpoint", *args], capture_output=True, text=True
        )
        assert proc.returncode == 1, (args, proc.returncode, proc.stderr)


def test_show_reports_the_stores_durability(sp: object, tmp_path: object) -> None:
    import json
    from pathlib import Path

    ws = Path(str(tmp_path)) / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("x")
    sp("snap", "-m", "one", cwd=ws)  # type: ignore[operator]
    shown = json.loads(sp("show", "HEAD", "--json", cwd=ws).out)  # type: ignore[operator]
    assert shown["durability"]["level"] == "fsync"
    assert "synchronous=FULL" in shown["durability"]["backend"]
    human = sp("show", "HEAD", cwd=ws).out  # type: ignore[operator]
    assert "durability" in human and "fsync" in human


def test_snap_if_changed_records_nothing_when_nothing_changed(sp: object, tmp_path: object) -> None:
    import json
    from pathlib import Path

    run = sp
    ws = Path(str(tmp_path)) / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("x")
    first = json.loads(run("snap", "--json", cwd=ws).out)  # type: ignore[operator]
    again = json.loads(run("snap", "--if-changed", "--json", cwd=ws).out)  # type: ignore[operator]
    assert first["created"] is True and again["created"] is False
    assert again["id"] == first["id"]
    plain = json.loads(run("snap", "--json", cwd=ws).out)  # type: ignore[operator]
    assert plain["created"] is True and plain["parent"] == first["id"]
    (ws / "f.txt").write_text("y")
    changed = json.loads(run("snap", "--if-changed", "--json", cwd=ws).out)  # type: ignore[operator]
    assert changed["created"] is True and changed["parent"] == plain["id"]
    assert len(json.loads(run("log", "--json", cwd=ws).out)) == 3  # type: ignore[operator]
