"""Commands imported on first use, so that ``stashpoint --help`` imports none of them.

The group lists each command from a one-sentence summary kept with its name; running a
command (or asking for its own ``--help``) imports just the module that defines it. This module
imports nothing but click: it is on the start-up path of every ``stashpoint`` invocation.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import click


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's ``commands``: every name known up front, each command imported from its module
    when first looked up (``commands["snap"]``, ``commands.get("snap")``). Iterating or testing
    membership imports nothing."""

    def __init__(self, where: Mapping[str, str]) -> None:
        self._where = dict(where)  # name -> "module:attribute", relative to the package
        self._loaded: dict[str, click.Command] = {}

    def loaded(self, name: str) -> click.Command | None:
        """The command if its module was imported already, else None."""
        return self._loaded.get(name)

    def __getitem__(self, name: str) -> click.Command:
        command = self._loaded.get(name)
        if command is None:
            module, _, attribute = self._where[name].partition(":")
            command = getattr(importlib.import_module(f".{module}", __package__), attribute)
            if not isinstance(command, click.Command):  # pragma: no cover - a wrong table entry
                raise TypeError(f"{self._where[name]} is not a click command")
            self._loaded[name] = command
        return command

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._loaded.pop(name, None)
        self._where.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._where or name in self._loaded

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._where, *self._loaded]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*self._where, *self._loaded]))


class LazyGroup(click.Group):
    """A click group whose commands are imported on first use (see :class:`LazyCommands`).

    ``lazy`` maps a name to ``("module:attribute", summary)``, the module relative to this
    package; the summary is the first
    sentence of the command's help, which the group's own ``--help`` lists without importing
    the command; tests/test_cli_structure.py checks every summary against its command.
    """

    def __init__(self, *args: Any, lazy: Mapping[str, tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.summaries = {name: summary for name, (_where, summary) in lazy.items()}
        self.lazy = LazyCommands({name: where for name, (where, _s) in lazy.items()})
        self.commands = self.lazy

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Click's own listing, made from the summaries of the commands not imported yet."""
        listed = click.Group(
            commands=[
                self.lazy.loaded(name) or click.Command(name, help=self.summaries[name])
                for name in self.list_commands(ctx)
            ]
        )
        listed.format_commands(ctx, formatter)
