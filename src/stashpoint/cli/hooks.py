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

import json
import sys
from pathlib import Path
from typing import Any

import click

from ..agent_hooks.recipes import (
    AGENTS,
    AIDER_BLOCK,
    JSON_HOOK_EVENTS,
    SCOPES,
    add_json_hooks,
    dump_json,
    install_aider,
    installed_in,
    read_json_object,
    remove_config,
    remove_json_hooks,
    write_atomic,
)
from . import watch_cmd
from ._app import STORE_DIR, Ctx, emit, json_option, pass_ctx, short
from ._progress import ByteProgress
from .hook_recipes import (
    AIDER_LOOP,
    LOG_NAME,
    SESSION_PREFIX,
    config_path,
    hook_command,
    notify_argv,
)

# Other library modules are imported inside the commands, not here (start-up time);
# ``agent_hooks.recipes`` imports nothing but the standard library and the errors.


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


def _baseline(ctx: Ctx, agent: str) -> Any:
    """Snapshot the project once at install time, so that the first hook call (which an agent
    may time out) is incremental: the stat cache and blobs are shared by every session. Aider's
    hooks have no session start to mark the baseline, so it goes into the aider session."""

    if agent == "aider" and not ctx.session_name:
        ctx.session_name = SESSION_PREFIX[agent]  # one fixed session: start it here
    session = ctx.session(create=True)
    with ByteProgress("baseline snapshot", enabled=not ctx.json) as progress:
        return session.checkpoint(
            message=f"baseline before {agent} hooks",
            kind="milestone",
            progress=progress.callback,
            skip_unchanged=True,
        )


@hooks.command()
@click.argument("agent", type=click.Choice(AGENTS))
@_scope_option
@click.option(
    "--command",
    "prefix",
    metavar="CMD",
    help="How the agent starts stashpoint (default: the stashpoint script beside this "
    "Python, by absolute path, else this Python with '-m stashpoint'); e.g. --command "
    "stashpoint for a shared, PATH-based entry.",
)
@click.option("--no-snapshot", is_flag=True, help="Skip the baseline snapshot of the project.")
@click.option(
    "--watch",
    "watch",
    is_flag=True,
    help="Also start the project's watch daemon (stashpoint watch start), so that each hook "
    "call is served in milliseconds; the default with $STASHPOINT_WATCH=1, which also makes "
    "a hook start it when none runs.",
)
@json_option
@pass_ctx
def install(
    ctx: Ctx, agent: str, scope: str | None, prefix: str | None, no_snapshot: bool, watch: bool
) -> None:
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
    scope, path = config_path(agent, scope, project)
    command = hook_command(ctx, agent, prefix)
    snapshots_here = scope != "user" or bool(ctx.store_url)
    if snapshots_here:
        from ..workspace import check_root

        check_root(ctx.locate(create=True)[1], force=ctx.force)  # before writing anything
    if agent == "aider":
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        new = install_aider(old, command)
        changed = new != old
        if changed:
            write_atomic(path, new)
    else:
        data = read_json_object(path)
        before = dump_json(data) if path.exists() else None
        remove_json_hooks(data, agent)
        add_json_hooks(data, agent, command)
        changed = dump_json(data) != before
        if changed:
            write_atomic(path, dump_json(data))
    baseline = None
    store_desc = "created in each project on first use"
    if snapshots_here:
        if not no_snapshot:
            baseline = _baseline(ctx, agent)
        else:
            ctx.store(create=True)
        store_desc = str(ctx.store(create=True).home or ctx.store(create=True).url)
    daemon = None
    if snapshots_here and (watch or watch_cmd.wanted()):
        daemon = watch_cmd.start_daemon(ctx)[0]["pid"]
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
        "watch_daemon": daemon,
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
    if daemon is not None:
        human.append(f"  watch daemon: {daemon} (stashpoint watch status)")
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
            "  notify = " + json.dumps(notify_argv(command)),
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
    scope, path = config_path(agent, scope, project)
    removed = 0
    deleted = False
    if path.exists():
        if agent == "aider":
            old = path.read_text(encoding="utf-8")
            new, removed = AIDER_BLOCK.subn("", old)
            if removed:
                if new.strip():
                    write_atomic(path, new)
                else:
                    deleted = remove_config(path, new)
        else:
            data = read_json_object(path)
            removed = remove_json_hooks(data, agent)
            if removed:
                if data:
                    write_atomic(path, dump_json(data))
                else:
                    deleted = remove_config(path, dump_json(data))
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
            _s, path = config_path(agent, scope, project)
            if installed_in(agent, path):
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
    from .hook_runner import run_hook  # here, not at the top: for the CLI's start-up time

    result = run_hook(ctx, agent, args)
    if ctx.json:
        emit(ctx, result)
    if then:
        import subprocess

        sys.stdout.flush()
        sys.exit(subprocess.call(then, shell=True))
