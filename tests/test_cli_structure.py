"""The CLI's modules import each other in one direction: a command module defines plain click
commands, ``stashpoint.cli`` attaches every one of them to the ``stashpoint`` group, and no
command module imports that group back (commands registered by the side effect of an import
made a cycle through the package). Imports inside functions count too."""

from __future__ import annotations

import importlib
import pkgutil

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
