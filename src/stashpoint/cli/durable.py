"""Durable-execution commands: tasks, resume, approve, reject."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import click

from ._app import Ctx, emit, json_option, pass_ctx, short

if TYPE_CHECKING:
    from ..durable import Pending

# Library modules are imported inside the commands, not here: every CLI run (``--help``
# too) imports this module (start-up time).

_MARK = {
    "pending": "·",
    "in_progress": "▶",
    "completed": "✓",
    "failed": "✗",
    "skipped": "-",
}
_COLOUR = {
    "in_progress": "yellow",
    "completed": "green",
    "failed": "red",
    "skipped": "bright_black",
}


def _args_text(args: Any) -> str:
    from ..durable_surface import args_summary as _args_summary

    return _args_summary(args, limit=100)


def _pending_lines(p: Pending | None) -> list[str]:
    if p is None:
        return []
    target = p.checkpoint or p.id
    if p.kind == "approval":
        return [
            f"waiting for approval: {p.tool}{_args_text(p.args)}  (arguments {p.fingerprint[:12]})",
            f"  approve: stashpoint approve {target}",
            f"  reject:  stashpoint reject {target} --reason '…'",
        ]
    return [
        f"outcome unknown: {p.tool}{_args_text(p.args)} was running when the process died "
        f"(idempotency key {p.id})",
        f"  it happened:     stashpoint approve {target} --done [--result JSON]",
        f"  it did not:      stashpoint approve {target}   (runs it again, same key)",
        f"  give up on it:   stashpoint reject {target} --reason '…'",
    ]


@click.command()
@click.argument("ref", required=False)
@json_option
@pass_ctx
def tasks(ctx: Ctx, ref: str | None) -> None:
    """Show the run's task list with statuses (of the live run, or as of checkpoint REF).

    \b
    Example:
      stashpoint tasks            # ✓ completed  ▶ in progress  · pending  ✗ failed  - skipped
      stashpoint tasks --json | jq '.[] | select(.status != "completed")'
    """
    from ..durable import run_status

    session = ctx.session(files=False)
    if ref is not None:
        items = [t.to_dict() for t in session.tasks(ref)]
        status: dict[str, Any] = {"status": None, "pending": None}
    else:
        status = run_status(session)
        items = status["tasks"]
    if ctx.json:
        emit(ctx, items)
        return
    if status["status"] is not None:
        click.echo(f"run: {status['status']}  (session {session.name}, branch {session.branch})")
    if not items:
        click.echo("no tasks recorded")
    width = max((len(t["id"]) for t in items), default=0)
    for t in items:
        line = f"  {_MARK.get(t['status'], '?')} {t['id']:<{width}}  {t['title']}"
        if t["title"] == t["id"]:
            line = f"  {_MARK.get(t['status'], '?')} {t['id']:<{width}}"
        line += f"  [{t['status']}]" + (f"  {t['note']}" if t.get("note") else "")
        click.echo(click.style(line, fg=_COLOUR.get(t["status"])))
    if status.get("pending"):
        from ..durable import Pending

        for text in _pending_lines(Pending(**status["pending"])):
            click.echo(text)


def _decide(
    ctx: Ctx,
    ident: str | None,
    *,
    approved: bool,
    reason: str | None,
    by: str | None,
    done: bool = False,
    result: str | None = None,
) -> None:
    session = ctx.session(files=False)
    value: Any = None
    if result is not None:
        try:
            value = json.loads(result)
        except ValueError as exc:
            raise click.UsageError(f"--result must be JSON: {exc}") from None
    if approved:
        cp = session.approve(ident, reason=reason, by=by, done=done, result=value)
    else:
        cp = session.reject(ident, reason=reason, by=by)
    from ..session import checkpoint_json

    decision = cp.meta.get("decision", {})
    emit(
        ctx,
        checkpoint_json(cp, session.labels()),
        f"{decision.get('tool')}: {decision.get('decision')} ({short(cp.id)}); "
        "continue the run with: stashpoint resume",
    )


@click.command()
@click.argument("ident", metavar="ID", required=False)
@click.option("--reason", "-r", help="Why (recorded in the history).")
@click.option("--by", help="Who decides (default: $USER).")
@click.option(
    "--done",
    is_flag=True,
    help="For an effect whose outcome is unknown: it did happen; record it, do not run it again.",
)
@click.option("--result", metavar="JSON", help="With --done: the effect's result, as JSON.")
@json_option
@pass_ctx
def approve(
    ctx: Ctx, ident: str | None, reason: str | None, by: str | None, done: bool, result: str | None
) -> None:
    """Approve the tool call a paused run waits for (ID: the paused checkpoint or request id;
    default: the one pending decision). The decision is bound to that call's arguments and
    consumed once, by the next resume.

    \b
    Example:
      stashpoint tasks                     # shows what waits, with the exact command
      stashpoint approve 01JB2K… --reason "checked the diff"
      stashpoint resume
    """
    _decide(ctx, ident, approved=True, reason=reason, by=by, done=done, result=result)


@click.command()
@click.argument("ident", metavar="ID", required=False)
@click.option("--reason", "-r", help="Why (recorded; the agent receives it).")
@click.option("--by", help="Who decides (default: $USER).")
@json_option
@pass_ctx
def reject(ctx: Ctx, ident: str | None, reason: str | None, by: str | None) -> None:
    """Reject the tool call a paused run waits for: on resume the call raises ToolRejected
    in the agent (with the reason) instead of running.

    \b
    Example:
      stashpoint reject 01JB2K… --reason "never deploy on Fridays"
    """
    _decide(ctx, ident, approved=False, reason=reason, by=by)


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--dry-run", is_flag=True, help="Only say where the run stands and what would run.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@json_option
@pass_ctx
def resume(ctx: Ctx, dry_run: bool, command: tuple[str, ...]) -> None:
    """Continue the session's durable run from where it stopped: runs the agent program again
    (the command it was started with, or the one after --); recorded steps replay from the
    journal, the rest execute. Exits with the program's exit code.

    \b
    Example:
      stashpoint resume --dry-run          # status, pending decision, next task, command
      stashpoint resume                    # re-run the recorded command
      stashpoint resume -- python agent.py --fast
    """
    from ..durable import Pending, run_status

    session = ctx.session(files=False)
    status = run_status(session)
    argv = list(command) or status["command"]
    cwd = status["cwd"] if not command else None
    status["would_run"] = argv
    if dry_run:
        lines = [f"run: {status['status']}  (session {session.name}, branch {session.branch})"]
        if status["next_task"]:
            t = status["next_task"]
            lines.append(f"next task: {t['id']} [{t['status']}]")
        if status["pending"]:
            lines += _pending_lines(Pending(**status["pending"]))
        lines.append(f"journal: {status['journal']} entries, {status['steps']} steps")
        lines.append("would run: " + (" ".join(argv) if argv else "(no recorded command)"))
        emit(ctx, status, "\n".join(lines))
        return
    if status["pending"]:
        for text in _pending_lines(Pending(**status["pending"])):
            click.echo(text, err=True)
        raise click.ClickException("the run waits for a decision; approve or reject it first")
    if status["status"] == "completed" and not command:
        emit(ctx, status, "the run completed; nothing to resume")
        return
    if not argv:
        raise click.ClickException(
            "no command is recorded for this run; pass it: stashpoint resume -- python agent.py"
        )
    click.echo(f"resuming session {session.name!r}: {' '.join(argv)}", err=True)
    env = dict(os.environ, STASHPOINT_RESUME="1")
    env.setdefault("STASHPOINT_SESSION", session.name)
    session.store.close()
    import subprocess  # here, not at the top: every CLI run imports this module

    try:
        code = subprocess.call(argv, cwd=cwd, env=env)
    except OSError as exc:
        raise click.ClickException(f"cannot run {argv[0]}: {exc}") from None
    if code < 0:  # killed by a signal: a shell reports 128 + N
        code = 128 - code
    if code != 0:
        raise click.exceptions.Exit(code)
