"""Each coding agent's hook recipe: the events that run ``stashpoint hooks run``, where the
agent's settings file is, and merging the recipe into that file and out of it again without
touching anything else in it (JSON hooks for Claude Code and Codex; for Aider, which has no
hooks, a marked block of ``.aider.conf.yml`` settings that run the snapshot as its test and
notification commands)."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from ..errors import UsageError

AGENTS = ("claude-code", "codex", "aider")
SCOPES = {
    "claude-code": ("local", "project", "user"),
    "codex": ("project", "user"),
    "aider": ("project", "user"),
}
HOOK_TIMEOUT = 120  # seconds; a killed snapshot leaves nothing behind (atomic commits)

# (event, matcher): a prompt (captures the user's own edits and gives a point to rewind to
# "before I asked that"), each tool that can change files, the end of a turn as a catch-all,
# and the session start as the baseline. Claude Code reports a tool call that failed (a Bash
# command exiting non-zero, which may well have changed files first) as PostToolUseFailure,
# not PostToolUse, and a session that ends without a last Stop (an interrupt, then /exit) only
# as SessionEnd: both are snapshotted too.
_CLAUDE_TOOLS = "Bash|Edit|MultiEdit|Write|NotebookEdit"
JSON_HOOK_EVENTS = {
    "claude-code": (
        ("SessionStart", None),
        ("UserPromptSubmit", None),
        ("PostToolUse", _CLAUDE_TOOLS),
        ("PostToolUseFailure", _CLAUDE_TOOLS),
        ("Stop", None),
        ("SessionEnd", None),
    ),
    "codex": (
        ("SessionStart", None),
        ("UserPromptSubmit", None),
        ("PostToolUse", "Bash|apply_patch|Edit|Write"),
        ("Stop", None),
    ),
}

AIDER_BEGIN = "# >>> stashpoint hooks (remove with: stashpoint hooks uninstall aider) >>>"
AIDER_END = "# <<< stashpoint hooks <<<"
AIDER_REPLY_END = "end-of-reply"
"""Argument of the command aider runs as its notifications-command (when a reply is done)."""
AIDER_BLOCK = re.compile(
    rf"^{re.escape(AIDER_BEGIN)}\n.*?^{re.escape(AIDER_END)}\n?", re.MULTILINE | re.DOTALL
)


def settings_path(agent: str, scope: str, project: Path) -> Path:
    """The settings file of ``agent`` for ``scope`` (one of ``SCOPES[agent]``); every scope
    but the user's is inside ``project``."""
    base = Path.home() if scope == "user" else project
    if agent == "claude-code":
        name = "settings.local.json" if scope == "local" else "settings.json"
        return base / ".claude" / name
    if agent == "codex":
        return base / ".codex" / "hooks.json"
    return base / ".aider.conf.yml"


def is_ours(command: Any, agent: str) -> bool:
    return (
        isinstance(command, str)
        and re.search(rf"\bhooks\s+run\s+{agent}(\s|$)", command) is not None
    )


def read_json_object(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(
            f"cannot merge into {path}: it is not readable JSON ({exc}); fix or move it, "
            "then run this again (nothing was changed)"
        ) from exc
    if not isinstance(data, dict):
        raise UsageError(f"cannot merge into {path}: it is not a JSON object")
    if not isinstance(data.get("hooks", {}), dict):
        raise UsageError(f"cannot merge into {path}: its 'hooks' is not an object")
    return data


def remove_json_hooks(data: dict[str, Any], agent: str) -> int:
    """Drop our handlers, and the groups, events and ``hooks`` object that only held them."""
    hooks_obj = data.get("hooks")
    if not isinstance(hooks_obj, dict):
        return 0
    removed = 0
    for event in list(hooks_obj):
        groups = hooks_obj[event]
        if not isinstance(groups, list):
            continue
        kept_groups = []
        for group in groups:
            handlers = group.get("hooks") if isinstance(group, dict) else None
            if not isinstance(handlers, list):
                kept_groups.append(group)
                continue
            kept = [
                h
                for h in handlers
                if not (isinstance(h, dict) and is_ours(h.get("command"), agent))
            ]
            removed += len(handlers) - len(kept)
            if kept or not handlers:
                group["hooks"] = kept
                kept_groups.append(group)
        if kept_groups or not groups:
            hooks_obj[event] = kept_groups
        else:
            del hooks_obj[event]
    if removed and not hooks_obj:
        del data["hooks"]
    return removed


def add_json_hooks(data: dict[str, Any], agent: str, command: str) -> None:
    hooks_obj = data.setdefault("hooks", {})
    for event, matcher in JSON_HOOK_EVENTS[agent]:
        groups = hooks_obj.setdefault(event, [])
        if not isinstance(groups, list):
            raise UsageError(f"cannot merge: hooks.{event} is not a list")
        group: dict[str, Any] = {"matcher": matcher} if matcher else {}
        group["hooks"] = [{"type": "command", "command": command, "timeout": HOOK_TIMEOUT}]
        groups.append(group)


def write_atomic(path: Path, text: str) -> None:
    """Temp file + rename: an agent reading its settings never sees half a file. A symlinked
    settings file (``~/.claude/settings.json`` -> a dotfiles repository) is written through:
    the link stays, its target is replaced atomically, in the target's own directory."""
    target = _link_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = target.stat().st_mode & 0o777 if target.exists() else 0o644
    tmp = target.with_name(f".{target.name}.stashpoint-tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, target)


def _link_target(path: Path) -> Path:
    """The file ``path`` stands for: itself, or the end of its chain of symlinks."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def remove_config(path: Path, empty: str) -> bool:
    """Delete a settings file that only held our hooks (True); a symlinked one is left in place
    with ``empty`` written through it instead, so that the user's link (and its target, which
    another machine may share) keeps existing (False)."""
    if path.is_symlink():
        write_atomic(path, empty)
        return False
    path.unlink()
    return True


def dump_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _aider_key(text: str, key: str) -> str | None:
    m = re.search(rf"^{key}\s*:(.*)$", text, re.MULTILINE)
    return m.group(1).strip() if m else None


def install_aider(text: str, command: str) -> str:
    """Add (or refresh) our marked block in .aider.conf.yml, refusing to override the user's
    own test command: wrapping it is a one-line edit we show instead of guessing at YAML.

    Two aider settings run our command: ``test-cmd`` (with ``auto-test``) after each reply
    that edited files, and ``notifications-command`` when a reply is finished and aider waits
    for input, which also covers replies that only ran shell commands. The second is added
    only when the user has no notification settings of their own."""
    outside = AIDER_BLOCK.sub("", text)
    own_cmd = _aider_key(outside, "test-cmd")
    if own_cmd is not None:
        raise UsageError(
            "your .aider.conf.yml already sets test-cmd; wrap it so it snapshots first, e.g.\n"
            f"  test-cmd: {json.dumps(command + ' --exec ' + _yaml_scalar(own_cmd))}\n"
            "  auto-test: true"
        )
    auto_test = _aider_key(outside, "auto-test")
    if auto_test is not None and auto_test.lower() not in ("true", "yes", "on"):
        raise UsageError(
            f"your .aider.conf.yml sets auto-test: {auto_test}; the stashpoint recipe needs "
            "auto-test: true (aider runs test-cmd after each edit only then)"
        )
    lines = [AIDER_BEGIN]
    if auto_test is None:
        lines.append("auto-test: true")
    lines.append(f"test-cmd: {json.dumps(command)}")
    if not _aider_owns_notifications(outside):
        lines += [
            "notifications: true",
            f"notifications-command: {json.dumps(command + ' ' + AIDER_REPLY_END)}",
        ]
    lines.append(AIDER_END)
    block = "\n".join(lines) + "\n"
    if AIDER_BLOCK.search(text):
        return AIDER_BLOCK.sub(lambda _m: block, text, count=1)
    if text and not text.endswith("\n"):
        text += "\n"
    return text + block


def _aider_owns_notifications(text: str) -> bool:
    """Whether the user configured aider's notifications themselves (we leave them alone)."""
    return _aider_key(text, "notifications-command") is not None or (
        _aider_key(text, "notifications") is not None
    )


def _yaml_scalar(value: str) -> str:
    """The plain text of a one-line YAML scalar (quoted or not), for the hint above."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return shlex.quote(value)


def installed_in(agent: str, path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return False
    if agent == "aider":
        return AIDER_BLOCK.search(text) is not None
    return re.search(rf"hooks\s+run\s+{agent}\b", text) is not None


def our_command(agent: str, path: Path) -> str | None:
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
