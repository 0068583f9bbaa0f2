"""Keep stashpoint's own agent hooks through a restore of the workspace's files.

Why: the agent's settings file (``.claude/settings.local.json``, ``.codex/hooks.json``,
``.aider.conf.yml``) lives in the workspace, so a rewind to a checkpoint taken before
``stashpoint hooks install`` deletes it (or puts back a version without our entries), and
from then on the agent's actions are silently no longer checkpointed. Whether stashpoint
snapshots the agent is a setting of the tool, not part of the project's history: after a
restore, our entries are merged back into whatever the restored file holds, exactly as
``hooks install`` merges them. Everything else in the file is the checkpoint's. Only the files
in the project are looked at: a user-scope install lives in the home directory, which no
restore writes.

The restore records what :func:`installed` finds in its journal before it writes a file, and
calls :func:`put_back` with that record once the files are the checkpoint's, before the journal
is cleared: a restore that a crash interrupts, finished by the next session opened on the
workspace, keeps them too.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from .._killpoints import kill_point
from ..errors import StashpointError, StashpointWarning
from .recipes import (
    AGENTS,
    SCOPES,
    add_json_hooks,
    dump_json,
    install_aider,
    our_command,
    read_json_object,
    remove_json_hooks,
    settings_path,
    write_atomic,
)


def installed(root: Path) -> list[dict[str, str]]:
    """Our hooks installed in the project at ``root``, in each agent's project-side settings
    files (every scope but the user's), as a restore journal records them: the agent, the
    scope and the command the hooks run."""
    found = []
    for agent in AGENTS:
        for scope in SCOPES[agent]:
            if scope == "user":
                continue
            command = our_command(agent, settings_path(agent, scope, root))
            if command is not None:
                found.append({"agent": agent, "scope": scope, "command": command})
    return found


def put_back(root: Path, recorded: Any) -> tuple[list[str], list[str]]:
    """Merge our hooks back where the restore removed or changed them: (the files written,
    relative to ``root``; for each file they could not be merged into, the command that
    installs them again, also said in a :class:`~stashpoint.errors.StashpointWarning`: a
    settings file the checkpoint holds that is not JSON fails this, not the restore).
    Running it again changes nothing."""
    kill_point("rewind-hooks")
    kept: list[str] = []
    failed: list[str] = []
    for hook in recorded if isinstance(recorded, list) else ():
        agent, scope, command = (
            hook.get(k) if isinstance(hook, dict) else None for k in ("agent", "scope", "command")
        )
        if agent not in AGENTS or scope not in SCOPES[agent] or scope == "user":
            continue  # not a record this version wrote
        if not isinstance(command, str):
            continue
        path = settings_path(agent, scope, root)
        if our_command(agent, path) == command:
            continue  # the restore left them as they were
        where = str(path.relative_to(root))
        try:
            _merge(agent, path, command)
        except (StashpointError, OSError) as exc:
            again = f"stashpoint hooks install {agent}"
            if scope != SCOPES[agent][0]:
                again += f" --scope {scope}"
            warnings.warn(
                f"stashpoint's {agent} hooks were not put back into {where}: {exc}; the agent "
                f"is not checkpointed until you run `{again}`",
                StashpointWarning,
                stacklevel=2,
            )
            failed.append(again)
            continue
        kept.append(where)
    return kept, failed


def _merge(agent: str, path: Path, command: str) -> None:
    if agent == "aider":
        old = path.read_text(encoding="utf-8") if path.is_file() else ""
        write_atomic(path, install_aider(old, command))
        return
    data = read_json_object(path) if path.is_file() else {}
    remove_json_hooks(data, agent)  # an older install the checkpoint held
    add_json_hooks(data, agent, command)
    write_atomic(path, dump_json(data))
