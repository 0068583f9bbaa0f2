"""The curated public surface and the CLI's self-documentation stay complete."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys

import pytest

import stashpoint
import stashpoint.errors
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


def _documented_tree() -> dict[str, tuple[str | None, int | None]]:
    """The tree drawn in ``stashpoint.errors``' docstring: name -> (parent, exit code)."""
    tree: dict[str, tuple[str | None, int | None]] = {}
    stack: list[tuple[int, str]] = []
    for line in (stashpoint.errors.__doc__ or "").splitlines():
        m = re.match(r"^    ([ │├└─]*)(\w+)\s+(?:exit (\d))?", line)
        if not m or not m.group(2)[0].isupper():
            continue
        depth = len(m.group(1)) // 4
        del stack[depth:]
        parent = stack[-1][1] if stack else None
        tree[m.group(2)] = (parent, int(m.group(3)) if m.group(3) else None)
        stack.append((depth, m.group(2)))
    return tree


def _subclasses(root: type) -> list[type]:
    found = []
    for sub in root.__subclasses__():
        if sub.__module__.startswith("stashpoint") and not sub.__name__.startswith("_"):
            found.append(sub)
        found.extend(_subclasses(sub))
    return found


def test_error_tree_matches_its_documentation_and_is_exported() -> None:
    """Every public exception and warning, wherever raised, is in the documented tree, under
    the documented parent, with the documented exit code, and importable from ``stashpoint``.
    Modules are imported first so that no subclass hides in a module nothing loaded yet."""
    for mod in pkgutil.walk_packages(stashpoint.__path__, "stashpoint."):
        if mod.name.startswith("stashpoint.integrations.") or mod.name.endswith("__main__"):
            continue
        importlib.import_module(mod.name)
    for name in ("langgraph", "openai_agents", "pydantic_ai"):
        importlib.import_module(f"stashpoint.integrations.{name}")
    tree = _documented_tree()
    real = {
        cls.__name__: cls
        for root in (stashpoint.StashpointError, stashpoint.StashpointWarning)
        for cls in [root, *_subclasses(root)]
        if not cls.__module__.startswith("stashpoint.testing")
    }
    assert sorted(real) == sorted(tree), "errors.py's tree and the real classes differ"
    for name, (parent, code) in tree.items():
        cls = real[name]
        assert cls.__module__ == "stashpoint.errors", f"{name} lives in {cls.__module__}"
        assert getattr(stashpoint, name) is cls, f"{name} is not exported by stashpoint"
        if parent is not None:
            assert cls.__bases__[0] is real[parent], f"{name}'s parent is not {parent}"
        if code is not None:
            assert cls.exit_code == code, f"{name} exits {cls.exit_code}, documented {code}"


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
