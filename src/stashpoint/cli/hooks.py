"""Hooks for CLI coding agents: ``stashpoint hooks install|uninstall|status|run AGENT``.

Why: a coding agent's own undo (Claude Code's rewind, Codex's undo) restores what its edit tools
wrote, not what the shell commands it ran did (``rm``, ``mv``, ``sed -i``, a code generator).
A hook that snapshots the whole workspace at each prompt and after each tool call closes that
gap: ``stashpoint rewind`` puts back every file, whoever changed it.

``hooks run`` is what the agent executes. It must never get in the agent's way: it reads the
payload the agent sends, records a checkpoint only if a file changed, prints nothing (Claude
Code and Codex feed a hook's stdout back to the model for some events) and exits 0 whatever
happens; failures go to ``hooks.log`` in the store directory. It imports the storage stack only
when it runs, like every command, so the CLI's cold start stays small.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ._app import STORE_DIR, Ctx, emit, json_option, short

if TYPE_CHECKING:
    from .._store import Store

pass_ctx = click.make_pass_decorator(Ctx)

AGENTS = ("claude-code", "codex", "aider")
SESSION_PREFIX = {"claude-code": "claude", "codex": "codex", "aider": "aider"}
SCOPES = {
    "claude-code": ("local", "project", "user"),
    "codex": ("project", "user"),
    "aider": ("project", "user"),
}
HOOK_TIMEOUT = 120  # seconds; a killed snapshot leaves nothing behind (atomic commits)
LOG_NAME = "hooks.log"
LOG_MAX_BYTES = 1 << 20

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
AIDER_LOOP = (
    'while sleep 30; do stashpoint snap --if-changed -m "aider: periodic" >/dev/null; done &'
)


@click.group()
def hooks() -> None:
    """Snapshot the workspace from a coding agent's hooks (Claude Code, Codex, Aider).

    After `hooks install`, every prompt and every tool call that can change files records a
    checkpoint (only when something changed), in session claude-<session id>,
    codex-<session id> or aider. Then `stashpoint rewind` restores what the agent's shell
    commands did too.

    \b
    Example:
      stashpoint hooks install claude-code
      stashpoint hooks status              # the agent sessions recorded so far
      stashpoint --session claude-<id> log
      stashpoint --session claude-<id> rewind HEAD~2
    """


# -- install / uninstall ------------------------------------------------------------------


def _scope_option(f: Any) -> Any:
    return click.option(
        "--scope",
        type=click.Choice(["local", "project", "user"]),
        help="Where to install: local (Claude Code only: .claude/settings.local.json, not "
        "committed; its default), project (.claude/settings.json, .codex/hooks.json, "
        ".aider.conf.yml; default for codex and aider) or user (in your home directory).",
    )(f)


def _config_path(agent: str, scope: str | None, project: Path) -> tuple[str, Path]:
    scope = scope or SCOPES[agent][0]
    if scope not in SCOPES[agent]:
        raise click.UsageError(
            f"{agent} has no {scope!r} scope; use one of: {', '.join(SCOPES[agent])}"
        )
    base = Path.home() if scope == "user" else project
    if agent == "claude-code":
        name = "settings.local.json" if scope == "local" else "settings.json"
        return scope, base / ".claude" / name
    if agent == "codex":
        return scope, base / ".codex" / "hooks.json"
    return scope, base / ".aider.conf.yml"


def _hook_command(ctx: Ctx, agent: str, prefix: str | None) -> str:
    """The command line the agent runs. By default the absolute path of this interpreter, so
    the hook works whatever PATH the agent's shell has (a virtualenv that is not activated)."""
    import shlex

    from ..urls import parse_store_url  # here, not at the top: for the CLI's start-up time

    parts = [prefix or f"{shlex.quote(sys.executable)} -m stashpoint"]
    if ctx.store_url:
        url = ctx.store_url
        if not parse_store_url(url).explicit:  # a plain path: absolute, links resolved
            url = str(Path(url).expanduser().resolve())
        parts.append(f"--store {shlex.quote(url)}")
    if ctx.session_name:
        parts.append(f"--session {shlex.quote(ctx.session_name)}")
    parts.append(f"hooks run {agent}")
    return " ".join(parts)


def _is_ours(command: Any, agent: str) -> bool:
    return (
        isinstance(command, str)
        and re.search(rf"\bhooks\s+run\s+{agent}(\s|$)", command) is not None
    )


def _read_json_object(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise click.ClickException(
            f"cannot merge into {path}: it is not readable JSON ({exc}); fix or move it, "
            "then run this again (nothing was changed)"
        ) from exc
    if not isinstance(data, dict):
        raise click.ClickException(f"cannot merge into {path}: it is not a JSON object")
    if not isinstance(data.get("hooks", {}), dict):
        raise click.ClickException(f"cannot merge into {path}: its 'hooks' is not an object")
    return data


def _remove_json_hooks(data: dict[str, Any], agent: str) -> int:
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
                if not (isinstance(h, dict) and _is_ours(h.get("command"), agent))
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


def _add_json_hooks(data: dict[str, Any], agent: str, command: str) -> None:
    hooks_obj = data.setdefault("hooks", {})
    for event, matcher in JSON_HOOK_EVENTS[agent]:
        groups = hooks_obj.setdefault(event, [])
        if not isinstance(groups, list):
            raise click.ClickException(f"cannot merge: hooks.{event} is not a list")
        group: dict[str, Any] = {"matcher": matcher} if matcher else {}
        group["hooks"] = [{"type": "command", "command": command, "timeout": HOOK_TIMEOUT}]
        groups.append(group)


def _write_atomic(path: Path, text: str) -> None:
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


def _remove_config(path: Path, empty: str) -> bool:
    """Delete a settings file that only held our hooks (True); a symlinked one is left in place
    with ``empty`` written through it instead, so that the user's link (and its target, which
    another machine may share) keeps existing (False)."""
    if path.is_symlink():
        _write_atomic(path, empty)
        return False
    path.unlink()
    return True


def _dump_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


_AIDER_BLOCK = re.compile(
    rf"^{re.escape(AIDER_BEGIN)}\n.*?^{re.escape(AIDER_END)}\n?", re.MULTILINE | re.DOTALL
)


def _aider_key(text: str, key: str) -> str | None:
    m = re.search(rf"^{key}\s*:(.*)$", text, re.MULTILINE)
    return m.group(1).strip() if m else None


def _install_aider(text: str, command: str) -> str:
    """Add (or refresh) our marked block in .aider.conf.yml, refusing to override the user's
    own test command: wrapping it is a one-line edit we show instead of guessing at YAML.

    Two aider settings run our command: ``test-cmd`` (with ``auto-test``) after each reply
    that edited files, and ``notifications-command`` when a reply is finished and aider waits
    for input, which also covers replies that only ran shell commands. The second is added
    only when the user has no notification settings of their own."""
    outside = _AIDER_BLOCK.sub("", text)
    own_cmd = _aider_key(outside, "test-cmd")
    if own_cmd is not None:
        raise click.ClickException(
            "your .aider.conf.yml already sets test-cmd; wrap it so it snapshots first, e.g.\n"
            f"  test-cmd: {json.dumps(command + ' --exec ' + _yaml_scalar(own_cmd))}\n"
            "  auto-test: true"
        )
    auto_test = _aider_key(outside, "auto-test")
    if auto_test is not None and auto_test.lower() not in ("true", "yes", "on"):
        raise click.ClickException(
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
    if _AIDER_BLOCK.search(text):
        return _AIDER_BLOCK.sub(lambda _m: block, text, count=1)
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
    import shlex

    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return shlex.quote(value)


def _baseline(ctx: Ctx, agent: str) -> Any:
    """Snapshot the project once at install time, so that the first hook call (which an agent
    may time out) is incremental: the stat cache and blobs are shared by every session. Aider's
    hooks have no session start to mark the baseline, so it goes into the aider session."""
    from ._progress import ByteProgress

    if agent == "aider" and not ctx.session_name:
        ctx.session_name = SESSION_PREFIX[agent]  # one fixed session: start it here
    session = ctx.session(create=True)
    with ByteProgress("baseline snapshot", enabled=not ctx.json) as progress:
        return session.checkpoint(
            message=f"baseline before {agent} hooks",
            kind="milestone",
            progress=progress,
            skip_unchanged=True,
        )


@hooks.command()
@click.argument("agent", type=click.Choice(AGENTS))
@_scope_option
@click.option(
    "--command",
    "prefix",
    metavar="CMD",
    help="How the agent starts stashpoint (default: this Python, absolute path, "
    "'-m stashpoint'); e.g. --command stashpoint for a shared, PATH-based entry.",
)
@click.option("--no-snapshot", is_flag=True, help="Skip the baseline snapshot of the project.")
@json_option
@pass_ctx
def install(ctx: Ctx, agent: str, scope: str | None, prefix: str | None, no_snapshot: bool) -> None:
    """Install hooks that snapshot the workspace as AGENT works.

    Merges into the agent's settings file (other settings and hooks are kept; running it
    again changes nothing). Claude Code and Codex get real hooks (each prompt, each
    Bash/edit tool call, end of turn); Aider has no hook system, so its documented
    --auto-test/--test-cmd recipe is installed instead.

    \b
    Example:
      stashpoint hooks install claude-code            # .claude/settings.local.json
      stashpoint hooks install codex --scope user     # ~/.codex/hooks.json
      stashpoint hooks install aider                  # .aider.conf.yml
    """
    project = Path(ctx.workspace or ".").resolve()
    scope, path = _config_path(agent, scope, project)
    command = _hook_command(ctx, agent, prefix)
    snapshots_here = scope != "user" or bool(ctx.store_url)
    if snapshots_here:
        from ..workspace import check_root

        check_root(ctx.locate(create=True)[1], force=ctx.force)  # before writing anything
    if agent == "aider":
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        new = _install_aider(old, command)
        changed = new != old
        if changed:
            _write_atomic(path, new)
    else:
        data = _read_json_object(path)
        before = _dump_json(data) if path.exists() else None
        _remove_json_hooks(data, agent)
        _add_json_hooks(data, agent, command)
        changed = _dump_json(data) != before
        if changed:
            _write_atomic(path, _dump_json(data))
    baseline = None
    store_desc = "created in each project on first use"
    if snapshots_here:
        if not no_snapshot:
            baseline = _baseline(ctx, agent)
        else:
            ctx.store(create=True)
        store_desc = str(ctx.store(create=True).home or ctx.store(create=True).url)
    notes = _notes(agent, ctx.session_name, command, store_desc)
    events = [e for e, _m in JSON_HOOK_EVENTS.get(agent, ())]
    data_out = {
        "agent": agent,
        "scope": scope,
        "path": str(path),
        "changed": changed,
        "command": command,
        "events": events,
        "store": store_desc,
        "baseline": baseline.id if baseline is not None else None,
        "notes": notes,
    }
    verb = "installed" if changed else "already installed (nothing changed)"
    what = (
        "the --auto-test/--test-cmd recipe" if agent == "aider" else "hooks on " + ", ".join(events)
    )
    human = [
        f"{agent}: {verb}: {what} in {path}",
        f"  command: {command}",
        f"  store: {store_desc}",
    ]
    if baseline is not None:
        human.append(f"  baseline snapshot: {short(baseline.id)}")
    emit(ctx, data_out, "\n".join([*human, "", *notes]))


def _notes(agent: str, session: str | None, command: str, store: str) -> list[str]:
    prefix = SESSION_PREFIX[agent]
    session = session or (f"{prefix}-<session id>" if agent != "aider" else prefix)
    log = f"{store}/{LOG_NAME}" if store.startswith("/") else f"{STORE_DIR}/{LOG_NAME}"
    out = [
        f"Each snapshot goes to session {session!r} (only when a file changed). To go back:",
        "  stashpoint hooks status                      # the agent sessions recorded",
        f"  stashpoint --session {session} log",
        f"  stashpoint --session {session} rewind <id>   # also undoes shell changes",
        f"The hook never interrupts {agent}: it exits 0 and logs failures to {log}.",
    ]
    if agent == "claude-code":
        out.append("Claude Code reads hooks at start-up: restart it (or check with /hooks).")
    elif agent == "codex":
        out += [
            "Codex runs project hooks only in a trusted project, and only once you have reviewed",
            "and trusted them: open /hooks in Codex. Older Codex without hooks: put this in",
            "~/.codex/config.toml instead (snapshots at the end of each turn):",
            "  notify = " + json.dumps(_notify_argv(command)),
        ]
    else:
        out += [
            "aider has no hook system. This recipe makes aider run the snapshot as its test",
            "command after each reply that edited files, and as its notifications-command when",
            "a reply is done (also one that only ran shell commands; left out if your config",
            "sets notifications itself).",
            "To keep running your own tests: test-cmd: "
            + json.dumps(command + " --exec 'pytest -q'"),
            "aider snapshots only after its own edits; for changes made in between, run a loop:",
            f"  {AIDER_LOOP}",
        ]
    return out


def _notify_argv(command: str) -> list[str]:
    import shlex

    return shlex.split(command)


@hooks.command()
@click.argument("agent", type=click.Choice(AGENTS))
@_scope_option
@json_option
@pass_ctx
def uninstall(ctx: Ctx, agent: str, scope: str | None) -> None:
    """Remove stashpoint's hooks for AGENT, and nothing else.

    Other settings and other hooks stay as they are; a settings file left empty is deleted.
    Checkpoints already recorded are kept.

    \b
    Example:
      stashpoint hooks uninstall claude-code
    """
    project = Path(ctx.workspace or ".").resolve()
    scope, path = _config_path(agent, scope, project)
    removed = 0
    deleted = False
    if path.exists():
        if agent == "aider":
            old = path.read_text(encoding="utf-8")
            new, removed = _AIDER_BLOCK.subn("", old)
            if removed:
                if new.strip():
                    _write_atomic(path, new)
                else:
                    deleted = _remove_config(path, new)
        else:
            data = _read_json_object(path)
            removed = _remove_json_hooks(data, agent)
            if removed:
                if data:
                    _write_atomic(path, _dump_json(data))
                else:
                    deleted = _remove_config(path, _dump_json(data))
    human = (
        f"{agent}: removed stashpoint's hooks from {path}"
        + (" (now empty: deleted)" if deleted else "")
        if removed
        else f"{agent}: no stashpoint hooks in {path}; nothing changed"
    )
    emit(
        ctx,
        {"agent": agent, "scope": scope, "path": str(path), "removed": removed, "deleted": deleted},
        human,
    )


@hooks.command()
@json_option
@pass_ctx
def status(ctx: Ctx) -> None:
    """Show where hooks are installed and the agent sessions recorded in this store.

    \b
    Example:
      stashpoint hooks status
    """
    project = Path(ctx.workspace or ".").resolve()
    installed = []
    for agent in AGENTS:
        for scope in SCOPES[agent]:
            _s, path = _config_path(agent, scope, project)
            if _installed_in(agent, path):
                installed.append({"agent": agent, "scope": scope, "path": str(path)})
    sessions: list[dict[str, Any]] = []
    store_url = None
    try:
        store = ctx.store()
        store_url = str(store.home or store.url)
    except click.ClickException:
        store = None
    if store is not None:
        prefixes = tuple(f"{p}-" for p in SESSION_PREFIX.values()) + tuple(SESSION_PREFIX.values())
        for name in store.sessions():
            if not name.startswith(prefixes):
                continue
            head = store.session(name).head
            if head is not None:
                sessions.append(
                    {
                        "session": name,
                        "head": head.id,
                        "at": head.created_at,
                        "message": head.message,
                    }
                )
        sessions.sort(key=lambda s: s["at"], reverse=True)
    if ctx.json:
        emit(ctx, {"installed": installed, "store": store_url, "sessions": sessions})
        return
    if not installed:
        click.echo("no stashpoint hooks installed here (stashpoint hooks install AGENT)")
    for i in installed:
        click.echo(f"{i['agent']:<12} {i['scope']:<8} {i['path']}")
    if store is None:
        click.echo("no store yet: the first hook call creates .stashpoint in the project")
        return
    click.echo(f"store: {store_url}")
    for s in sessions[:20]:
        click.echo(
            f"  {s['session']:<48} {s['at'][:19].replace('T', ' ')}  "
            f"{short(s['head'])}  {s['message'] or ''}"[:160]
        )
    if sessions:
        click.echo(f"rewind with: stashpoint --session {sessions[0]['session']} rewind <id>")


def _installed_in(agent: str, path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return False
    if agent == "aider":
        return _AIDER_BLOCK.search(text) is not None
    return re.search(rf"hooks\s+run\s+{agent}\b", text) is not None


# -- run: what the agent executes -----------------------------------------------------------


@hooks.command("run")
@click.argument("agent", type=click.Choice(AGENTS))
@click.argument("args", nargs=-1)
@click.option(
    "--exec",
    "then",
    metavar="CMD",
    help="After the snapshot, run CMD and exit with its status (to wrap aider's own test command).",
)
@pass_ctx
def run(ctx: Ctx, agent: str, args: tuple[str, ...], then: str | None) -> None:
    """Snapshot the workspace for AGENT's hook; never fails the agent.

    Reads the JSON payload the agent sends (Claude Code and Codex hooks: on stdin; Codex
    `notify`: as the last argument), maps the agent's session id to the stashpoint session
    <agent>-<id>, and records a checkpoint if any file changed, with a message naming the
    event and tool. Prints nothing and exits 0 even when it fails (see hooks.log in the
    store directory); with --exec, exits with CMD's status.

    \b
    Example (what the installed hooks run):
      echo '{"session_id": "abc", "hook_event_name": "Stop"}' | stashpoint hooks run claude-code
    """
    import time

    from ..urls import parse_store_url  # here, not at the top: for the CLI's start-up time

    started = time.monotonic()
    hook = _HookRun(ctx, agent)
    # Library logging (psycopg_pool retrying a connection ...) would reach stderr through
    # Python's last-resort handler: into hooks.log instead, until the command has closed
    # the store (callbacks run last-registered first, and the store's is registered later).
    # Only for a server's store: a local one logs nothing, and a hook imports no logging.
    if ctx.store_url and parse_store_url(ctx.store_url).server:
        click.get_current_context().call_on_close(_capture_logging(hook))
    try:
        with _time_budget(_budget_seconds()):
            hook.snapshot(args)
    except Exception as exc:  # the agent must never see a failure: log it and carry on
        hook.fail(exc)
    hook.finish(time.monotonic() - started)
    if ctx.json:
        emit(ctx, hook.result)
    if then:
        import subprocess

        sys.stdout.flush()
        sys.exit(subprocess.call(then, shell=True))


BUDGET_S = 30.0
"""How long a hook may take before it gives up (``STASHPOINT_HOOK_TIMEOUT``; 0: no limit).
Below the agents' own hook timeouts (Claude Code: 60 s), so a store held by a garbage
collection or a stuck writer costs the agent a logged, skipped snapshot, not a killed hook."""
MAX_BUDGET_S = 3600.0
"""The most ``STASHPOINT_HOOK_TIMEOUT`` is taken to mean (``inf`` or ``1e300`` included): far
beyond any agent's hook timeout, and within what the interval timer accepts."""
LOG_CAPTURE_MAX = 50
"""Library log records kept per hook run (a retrying connection pool repeats itself)."""


def _capture_logging(hook: _HookRun) -> Callable[[], None]:
    """Route every log record (the root logger, and the last-resort handler that a logger
    which does not propagate falls back to) to the hook's log; the function that undoes it."""
    import logging

    class _LogCapture(logging.Handler):
        """Library log records of one hook run: lines of its hooks.log entry while it runs, then
        appended to hooks.log directly (records emitted while the store closes)."""

        def __init__(self, hook: _HookRun) -> None:
            super().__init__(logging.WARNING)
            self.hook = hook
            self.kept = 0

        def emit(self, record: logging.LogRecord) -> None:
            try:
                if self.kept >= LOG_CAPTURE_MAX:
                    return
                self.kept += 1
                text = record.getMessage().replace("\n", "\n        ")
                line = f"log {record.levelname.lower()} {record.name}: {text}"
                if self.kept == LOG_CAPTURE_MAX:
                    line += " (further log records dropped)"
                if self.hook.finished is None:
                    self.hook.log.append(line)
                else:
                    _append_log(self.hook.finished, f"    {line}\n")
            except Exception:  # never let a log record reach the agent, nor fail the hook
                pass

    handler = _LogCapture(hook)
    root = logging.getLogger()
    previous_last_resort = logging.lastResort
    root.addHandler(handler)
    logging.lastResort = handler

    def restore() -> None:
        root.removeHandler(handler)
        logging.lastResort = previous_last_resort

    return restore


class HookTimeout(Exception):
    """The hook's time budget ran out; the snapshot it was taking is abandoned (a checkpoint
    not committed yet leaves nothing behind, as after a crash)."""


def _budget_seconds() -> float:
    raw = os.environ.get("STASHPOINT_HOOK_TIMEOUT", "")
    try:
        seconds = float(raw) if raw else BUDGET_S
    except ValueError:
        return BUDGET_S
    if math.isnan(seconds):
        return BUDGET_S
    return min(max(0.0, seconds), MAX_BUDGET_S)


@contextlib.contextmanager
def _time_budget(seconds: float) -> Iterator[None]:
    """Raise :class:`HookTimeout` in this thread after ``seconds`` (SIGALRM: it also ends a
    wait in ``flock`` or ``sleep``); where there is no such signal, no budget."""
    if not seconds or not hasattr(signal, "setitimer") or not _in_main_thread():
        yield
        return

    def expire(_signum: int, _frame: Any) -> None:
        raise HookTimeout(
            f"gave up after {seconds:g} s: the store stayed busy (a garbage collection or "
            "another writer held it); set STASHPOINT_HOOK_TIMEOUT to wait longer"
        )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


class _HookRun:
    """One hook invocation: payload -> session, workspace, message -> checkpoint -> log line."""

    def __init__(self, ctx: Ctx, agent: str) -> None:
        self.ctx = ctx
        self.agent = agent
        self.store: Store | None = None
        self.event = "run"
        self.result: dict[str, Any] = {"agent": agent, "ok": False}
        self.log: list[str] = []
        self.finished: Path | None = None
        """The log file once :meth:`finish` wrote this run's entry."""

    def snapshot(self, args: tuple[str, ...]) -> None:
        import warnings

        payload = self._payload(args)
        self.event = _text(payload.get("hook_event_name") or payload.get("type")) or "run"
        agent_session = _text(
            payload.get("session_id") or payload.get("thread-id") or payload.get("thread_id")
        )
        prefix = SESSION_PREFIX[self.agent]
        name = self.ctx.session_name or (
            f"{prefix}-{_safe(agent_session)}" if agent_session else prefix
        )
        self.ctx.session_name = name
        self.result["session"] = name
        if self.ctx.workspace is None:
            self.ctx.workspace = self._workspace(payload)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                from ..workspace import check_root

                # refuse $HOME and / before a store directory is created there
                check_root(self.ctx.locate(create=True)[1], force=self.ctx.force)
                self.store = self.ctx.store(create=True)
                session = self.ctx.session(create=True)
                before = session.head
                cp = session.checkpoint(
                    message=_message(self.agent, self.event, payload, args, session.root),
                    kind="auto",
                    meta={"hook": _meta(self.agent, self.event, payload, agent_session)},
                    skip_unchanged=True,
                )
            finally:
                self.log += [f"warning: {w.message}" for w in caught]
        created = before is None or cp.id != before.id
        self.result.update(ok=True, checkpoint=cp.id, created=created)
        self._hand_off_upkeep()

    def _hand_off_upkeep(self) -> None:
        """Once a day a written store's close runs retention and GC, which takes as long as
        the store is big: in a hook that would stall the agent (or be killed by its hook
        timeout, every day). When it is due, a detached ``stashpoint prune --auto`` does it;
        it is marked as run first, so the hooks that follow do not start another."""
        store = self.store
        if store is None:
            return
        store.upkeep_on_close = False
        from .. import upkeep

        try:
            if not upkeep.due(store):
                return
            store.meta.set_meta(upkeep.LAST_META, repr(time.time()))
            import subprocess

            url, root, _s, _b = self.ctx.locate()
            argv = [sys.executable, "-m", "stashpoint", "--store", url]
            if self.ctx.mirror_url:
                argv += ["--mirror", self.ctx.mirror_url]
            with open(self._log_path(), "ab") as log:
                subprocess.Popen(
                    [*argv, "prune", "--auto"],
                    cwd=root,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,  # its failures land in hooks.log
                    start_new_session=True,  # outlives the hook; the agent's signals miss it
                )
            self.log.append("upkeep due: started `stashpoint prune --auto` in the background")
        except Exception as exc:  # upkeep is retried later; the snapshot has succeeded
            self.log.append(f"warning: upkeep not started: {exc}")

    def _payload(self, args: tuple[str, ...]) -> dict[str, Any]:
        """Codex ``notify`` passes JSON as the last argument; hooks write it to stdin."""
        raw = ""
        if args and args[-1].lstrip().startswith("{"):
            raw = args[-1]
        elif self.agent != "aider":
            raw = _read_stdin()
        if not raw.strip():
            return {}
        try:
            data = json.loads(raw)
        except ValueError as exc:
            self.log.append(f"bad payload (not JSON: {exc}); snapshotting anyway: {raw[:200]!r}")
            return {}
        if not isinstance(data, dict):
            self.log.append(f"bad payload (not a JSON object); snapshotting anyway: {raw[:200]!r}")
            return {}
        return data

    def _workspace(self, payload: dict[str, Any]) -> str:
        candidates = [os.environ.get("CLAUDE_PROJECT_DIR")] if self.agent == "claude-code" else []
        candidates.append(_text(payload.get("cwd")))
        start = next((c for c in candidates if c and os.path.isdir(c)), os.getcwd())
        return str(_project_root(Path(start).resolve()))

    def fail(self, exc: Exception) -> None:
        text = str(exc) or type(exc).__name__
        if isinstance(exc, click.ClickException):
            text = exc.format_message()
        self.result.update(ok=False, error=f"{type(exc).__name__}: {text}")

    def finish(self, seconds: float) -> None:
        from datetime import datetime, timezone

        r = self.result
        if r.get("ok"):
            what = f"{'created' if r['created'] else 'unchanged'} {r['checkpoint']}"
        else:
            what = f"FAILED {r.get('error')}"
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        lines = [
            f"{now} {self.agent} {self.event} session={r.get('session', '-')} {what} "
            f"({seconds * 1000:.0f} ms)",
            *(f"    {line}" for line in self.log),
        ]
        path = self._log_path()
        r["log"] = str(path)
        _append_log(path, "\n".join(lines) + "\n")
        self.finished = path

    def _log_path(self) -> Path:
        """hooks.log in the store directory; found without opening the store, so that a
        store that cannot be opened still gets its failure logged."""
        if self.store is not None and self.store.home is not None:
            return self.store.home / LOG_NAME
        url: str | None = self.ctx.store_url
        if url is None:
            try:
                url = self.ctx.locate(create=True)[0]
            except Exception:
                url = None
        from ..urls import parse_store_url  # here, not at the top: for the CLI's start-up time

        home = parse_store_url(url).home if url else None
        if home is not None and home.is_dir():
            return home / LOG_NAME
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return Path(base) / "stashpoint" / LOG_NAME


def _project_root(start: Path) -> Path:
    """Where a hook installed for the user (not per project) should snapshot: the directory
    with the nearest store above ``start``, else the enclosing git repository, else ``start``
    itself (an agent may run from a subdirectory)."""
    from ._app import discover

    if discover(start) is not None:
        return start  # the store's own directory is found from here
    home = Path.home().resolve()
    here = start
    while here != home and here.parent != here:
        if (here / ".git").exists():
            return here
        here = here.parent
    return start


def _append_log(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if path.stat().st_size > LOG_MAX_BYTES:
                os.replace(path, path.with_name(path.name + ".1"))
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, text.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass  # nowhere left to report to; the agent still must not notice


def _read_stdin(timeout: float = 3.0) -> str:
    """The payload on stdin, or "" for a terminal; never waits more than ``timeout`` for an
    agent that leaves the pipe open."""
    import select
    import time

    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):
        return ""
    if os.isatty(fd):
        return ""
    deadline = time.monotonic() + timeout
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _w, _x = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _safe(ident: str) -> str:
    """The agent's session id as part of a session name. An id that had to change (other
    characters, over 80 long) gets a digest of the original, so two ids never share a
    session (``a/b`` and ``a_b``); the UUIDs agents send pass unchanged."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", ident)
    if safe == ident and len(ident) <= 80:
        return ident
    import hashlib

    tag = hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{safe[:67]}-{tag}"


def _excerpt(value: Any, n: int = 120) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _tool_detail(tool: str | None, tool_input: Any, root: Path | None) -> str | None:
    if not isinstance(tool_input, dict):
        return None
    command = tool_input.get("command")
    if tool == "apply_patch" and isinstance(command, str):
        files = re.findall(r"^\*\*\* (?:Add|Update|Delete) File: (.+)$", command, re.MULTILINE)
        return ", ".join(files) if files else None
    for key in ("command", "file_path", "notebook_path", "path"):
        value = tool_input.get(key)
        if isinstance(value, str):
            if key != "command" and root is not None and os.path.isabs(value):
                rel = os.path.relpath(value, root)
                value = value if rel.startswith("..") else rel
            return value
    return None


def _message(
    agent: str, event: str, payload: dict[str, Any], args: tuple[str, ...], root: Path | None
) -> str:
    head = f"{SESSION_PREFIX[agent]} {event}"
    tool = _text(payload.get("tool_name"))
    detail: Any = None
    if tool:
        head += f" {tool}"
        detail = _tool_detail(tool, payload.get("tool_input"), root)
    elif _text(payload.get("prompt")):
        detail = payload["prompt"]
    elif _text(payload.get("source")):
        detail = payload["source"]
    elif isinstance(payload.get("input-messages"), list) and payload["input-messages"]:
        detail = payload["input-messages"][-1]
    elif _text(payload.get("reason")):
        detail = payload["reason"]  # SessionEnd: clear, logout, prompt_input_exit, other
    elif agent == "aider":
        words = [a for a in args if not a.lstrip().startswith("{")]
        if words[:1] == [AIDER_REPLY_END]:
            return "aider end of reply"
        head = "aider after edit"
        detail = " ".join(words) or None
    return f"{head}: {_excerpt(detail)}" if detail else head


def _meta(agent: str, event: str, payload: dict[str, Any], agent_session: str | None) -> Any:
    meta: dict[str, Any] = {"agent": agent, "event": event}
    if agent_session:
        meta["agent_session"] = agent_session
    for key in ("tool_name", "transcript_path", "turn_id", "turn-id", "model", "source", "reason"):
        value = payload.get(key)
        if isinstance(value, str | int | float | bool):
            meta[key.replace("-", "_")] = value
    return meta
