"""The CLI's modules import each other in one direction: a command module defines plain click
commands, ``stashpoint.cli`` attaches every one of them to the ``stashpoint`` group, and no
command module imports that group back (commands registered by the side effect of an import
made a cycle through the package). Imports inside functions count too."""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

import stashpoint.cli
from stashpoint.cli import cli

grimp = pytest.importorskip("grimp")  # installed with import-linter


def test_no_cli_module_imports_the_group_or_forms_a_cycle() -> None:
    graph = grimp.build_graph("stashpoint")
    modules = {m for m in graph.modules if m.startswith("stashpoint.cli.")}
    assert graph.find_modules_that_directly_import("stashpoint.cli") & modules == set()
    cycles = [
        graph.find_shortest_chain(importer=b, imported=a)
        for a in sorted(modules)
        for b in graph.find_modules_directly_imported_by(a) & modules
        if graph.chain_exists(importer=b, imported=a)
    ]
    assert cycles == []


def _attached(group: click.Command) -> set[int]:
    found = {id(group)}
    for sub in getattr(group, "commands", {}).values():
        found |= _attached(sub)
    return found


def test_every_command_defined_is_attached() -> None:
    reachable = _attached(cli)
    defined = {
        f"{info.name}.{name}"
        for info in pkgutil.iter_modules(stashpoint.cli.__path__, "stashpoint.cli.")
        for name, value in vars(importlib.import_module(info.name)).items()
        if isinstance(value, click.Command) and id(value) not in reachable
    }
    assert defined == set(), "attach these in stashpoint/cli/__init__.py"


def test_each_summary_is_the_first_sentence_of_its_command() -> None:
    """`stashpoint --help` lists the summaries of stashpoint.cli.COMMANDS instead of importing
    the commands: at every width they must read as the commands' own help would."""
    lazy = stashpoint.cli.COMMANDS
    for name, (_where, summary) in lazy.items():
        command = cli.commands[name]
        assert command.get_short_help_str(10**6) == summary, f"update COMMANDS[{name!r}]"
        assert not command.hidden and not command.deprecated and command.name == name

    def listing(group: click.Group, width: int) -> str:
        ctx = click.Context(group, info_name="stashpoint", terminal_width=width)
        return group.get_help(ctx)

    fresh = type(cli)(name="stashpoint", lazy=lazy)  # nothing imported: summaries only
    loaded = type(cli)(name="stashpoint", lazy=lazy)
    for name in lazy:
        loaded.commands[name]  # imports the command
    for width in (40, 80, 100, 200):
        assert listing(fresh, width) == listing(loaded, width)


def test_help_imports_no_command_and_not_rich() -> None:
    code = (
        "import sys\n"
        "from stashpoint.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith(('stashpoint.', 'rich'))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "['stashpoint.cli', 'stashpoint.cli._lazy']"


@pytest.mark.parametrize("columns", ["200", "80", "79", "60"])
def test_prerendered_help_is_what_click_prints(columns: str, tmp_path: Path) -> None:
    """``stashpoint --help`` prints a pre-rendered text without importing click when click
    would print exactly that text (80 columns or more); narrower, click itself wraps it.
    Either way the bytes equal click's own output at that width."""
    env = {**os.environ, "COLUMNS": columns}
    script = Path(sys.executable).parent / "stashpoint"
    fast = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    by_click = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.argv[0] = 'stashpoint'; from stashpoint.cli import main; main()",
            "--help",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert fast.returncode == by_click.returncode == 0, fast.stderr + by_click.stderr
    assert fast.stdout == by_click.stdout
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.argv = ['stashpoint', '--help']\n"
            "try:\n    from stashpoint.__main__ import main; main()\n"
            "finally:\n    print('click' in sys.modules, file=sys.stderr)",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert probe.stderr.strip() == str(int(columns) < 80)  # click imported only when narrow


def test_the_console_entry_freezes_the_gc_before_the_interpreter_shuts_down(
    tmp_path: Path,
) -> None:
    """The process ends after the command: its objects (a stat cache entry per file of a
    snapshot) are frozen so that the shutdown's collections skip them. ``cli.main`` itself,
    which a longer-lived process may call, leaves the collector as it was."""
    probe = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
        "sys.argv = ['stashpoint', '--version']\n"
        "from stashpoint.__main__ import main; main()\n"
    )
    env = {**os.environ, "STASHPOINT_NO_DAEMON": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "frozen True"
    direct = probe.replace("stashpoint.__main__ import", "stashpoint.cli import")
    proc = subprocess.run(
        [sys.executable, "-c", direct], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "frozen False"
