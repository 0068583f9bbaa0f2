"""The command line's side of the agent hook recipes: the command a hook runs (this
interpreter's stashpoint, with the store and session the user named), a scope checked as a
usage error, and the names the hook runner uses. The recipes themselves, and keeping them
through a restore, are :mod:`stashpoint.agent_hooks`'s."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from ..agent_hooks.recipes import SCOPES, settings_path
from ._app import Ctx

# Other library modules are imported inside the functions, not here: ``hooks run`` imports
# this module at every tool call (start-up time); ``agent_hooks.recipes`` imports nothing but
# the standard library and the errors.

SESSION_PREFIX = {"claude-code": "claude", "codex": "codex", "aider": "aider"}
LOG_NAME = "hooks.log"
AIDER_LOOP = (
    'while sleep 30; do stashpoint snap --if-changed -m "aider: periodic" >/dev/null; done &'
)


def config_path(agent: str, scope: str | None, project: Path) -> tuple[str, Path]:
    """(the scope, its settings file): ``scope`` defaults to the agent's first one."""
    scope = scope or SCOPES[agent][0]
    if scope not in SCOPES[agent]:
        raise click.UsageError(
            f"{agent} has no {scope!r} scope; use one of: {', '.join(SCOPES[agent])}"
        )
    return scope, settings_path(agent, scope, project)


def hook_command(ctx: Ctx, agent: str, prefix: str | None) -> str:
    """The command line the agent runs. By default an absolute path, so the hook works
    whatever PATH the agent's shell has (a virtualenv that is not activated): the
    ``stashpoint`` script beside this interpreter when it runs stashpoint with it (it
    starts several milliseconds sooner than ``python -m``, at every tool call), else this
    interpreter's ``-m stashpoint``."""
    from ..urls import parse_store_url  # here, not at the top: for the CLI's start-up time
    from ..watchd.launcher import script_for

    script = script_for(sys.executable)
    default = shlex.quote(script) if script else f"{shlex.quote(sys.executable)} -m stashpoint"
    parts = [prefix or default]
    if ctx.store_url:
        url = ctx.store_url
        if not parse_store_url(url).explicit:  # a plain path: absolute, links resolved
            url = str(Path(url).expanduser().resolve())
        parts.append(f"--store {shlex.quote(url)}")
    if ctx.session_name:
        parts.append(f"--session {shlex.quote(ctx.session_name)}")
    parts.append(f"hooks run {agent}")
    return " ".join(parts)


def notify_argv(command: str) -> list[str]:
    return shlex.split(command)
