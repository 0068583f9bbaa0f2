"""Keep stashpoint's own agent hooks through a restore of the workspace's files.

Why: the agent's settings file (``.claude/settings.local.json``, ``.codex/hooks.json``,
``.aider.conf.yml``) lives in the workspace, so a rewind to a checkpoint taken before
``stashpoint hooks install`` deletes it (or puts back a version without our entries), and
from then on the agent's actions are silently no longer checkpointed. Whether stashpoint
snapshots the agent is a setting of the tool, not part of the project's history: after a
restore, our entries are merged back into whatever the restored file holds, exactly as
``hooks install`` merges them, and the command says so. Everything else in the file is the
checkpoint's. Only the files in the project are looked at: a user-scope install lives in the
home directory, which no restore writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ._app import printable
from .hook_recipes import (
    AGENTS,
    AIDER_BLOCK,
    SCOPES,
    add_json_hooks,
    config_path,
    dump_json,
    install_aider,
    is_ours,
    read_json_object,
    remove_json_hooks,
    write_atomic,
)

if TYPE_CHECKING:
    from ..session import Session


@dataclass(frozen=True)
class Installed:
    """Our hooks for ``agent`` in ``path``, run as ``command``, before the restore."""

    agent: str
    path: Path
    command: str


def installed_hooks(root: Path) -> list[Installed]:
    """Our hooks installed in the project at ``root``: in each agent's project-side settings
    files (every scope but the user's), with the command each one runs."""
    found = []
    for agent in AGENTS:
        for scope in SCOPES[agent]:
            if scope == "user":
                continue
            _s, path = config_path(agent, scope, root)
            command = _our_command(agent, path)
            if command is not None:
                found.append(Installed(agent, path, command))
    return found


def put_back(root: Path, before: list[Installed]) -> tuple[list[str], list[str]]:
    """Merge our hooks back where the restore removed or changed them: (the files written,
    relative to ``root``; a warning for each file they could not be merged into)."""
    kept: list[str] = []
    failed: list[str] = []
    for hook in before:
        if _our_command(hook.agent, hook.path) == hook.command:
            continue  # the restore left them as they were
        where = _relative(hook.path, root)
        try:
            _merge(hook)
        except (click.ClickException, OSError) as exc:
            why = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
            failed.append(
                f"stashpoint's {hook.agent} hooks were not put back into {where}: {why}; "
                f"the agent is not checkpointed until you run `stashpoint hooks install "
                f"{hook.agent}`"
            )
            continue
        kept.append(where)
    return kept, failed


def _merge(hook: Installed) -> None:
    if hook.agent == "aider":
        old = hook.path.read_text(encoding="utf-8") if hook.path.is_file() else ""
        write_atomic(hook.path, install_aider(old, hook.command))
        return
    data = read_json_object(hook.path) if hook.path.is_file() else {}
    remove_json_hooks(data, hook.agent)  # an older install the checkpoint held
    add_json_hooks(data, hook.agent, hook.command)
    write_atomic(hook.path, dump_json(data))


def _our_command(agent: str, path: Path) -> str | None:
    """The command our hooks for ``agent`` run in ``path``, or None when there are none (or
    the file cannot be read: then there is nothing we could keep either)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if agent == "aider":
        block = AIDER_BLOCK.search(text)
        if block is None:
            return None
        for line in block.group(0).splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "test-cmd":
                try:
                    command = json.loads(value.strip())
                except ValueError:
                    return None
                return command if isinstance(command, str) else None
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    hooks = data.get("hooks") if isinstance(data, dict) else None
    for groups in hooks.values() if isinstance(hooks, dict) else ():
        for group in groups if isinstance(groups, list) else ():
            handlers: Any = group.get("hooks") if isinstance(group, dict) else None
            for handler in handlers if isinstance(handlers, list) else ():
                command = handler.get("command") if isinstance(handler, dict) else None
                if is_ours(command, agent):
                    return str(command)
    return None


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def hooks_before(session: Session) -> list[Installed]:
    """Our hooks in the workspace a restore of ``session`` is about to write."""
    if session.root is None or session.workspace is None:
        return []
    return installed_hooks(session.root)


def hooks_after(session: Session, before: list[Installed]) -> list[str]:
    """Put back the hooks the restore removed; the files written. A file they cannot be
    merged into (the checkpoint's is not JSON) is a warning, not a failed restore."""
    if not before or session.root is None:
        return []
    kept, failed = put_back(session.root, before)
    for message in failed:
        click.echo(f"warning: {message}", err=True)
    return kept


def kept_text(kept: list[str]) -> str:
    """The lines a command adds to its output for the files it kept our hooks in."""
    return "".join(f"\nkept stashpoint's hooks in {printable(p)}" for p in kept)
