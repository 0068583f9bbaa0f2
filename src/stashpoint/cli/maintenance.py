"""Store upkeep: prune (retention), gc (free what nothing references), du (where bytes are)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from ._app import Ctx, emit, json_option, pass_ctx, short, size_text
from ._progress import ByteProgress

if TYPE_CHECKING:
    from .._store import Store
    from ..retention import Plan
    from ..upkeep import Upkeep

# Library modules are imported inside the commands, not here: every CLI run (``--help``
# too) imports this module (start-up time).


def _seconds(text: str) -> float:
    from ..retention import parse_duration

    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return parse_duration(text).total_seconds()


@click.command()
@click.option("--session", "session_opt", metavar="NAME", help="Prune this session.")
@click.option("--all", "all_sessions", is_flag=True, help="Prune every session of the store.")
@click.option(
    "--keep-within",
    metavar="AGE",
    help="Keep checkpoints younger than AGE (90s, 30m, 24h, 7d, 2w).",
)
@click.option(
    "--keep-last", type=click.IntRange(min=0), metavar="N", help="Keep the newest N per branch."
)
@click.option(
    "--keep-labelled/--no-keep-labelled",
    default=True,
    show_default=True,
    help="Keep labelled checkpoints and milestones.",
)
@click.option(
    "--max-size",
    metavar="SIZE",
    help="Size budget (500M, 10GiB): with --auto or --save, prune further, oldest first, "
    "until what kept checkpoints reference fits (heads, labelled ones and milestones stay).",
)
@click.option(
    "--auto",
    "auto",
    is_flag=True,
    help="Run the store's automatic upkeep now: every session by its saved policy, gc, and "
    "the size budget (it also runs by itself once a day when a store that was written closes).",
)
@click.option(
    "--save",
    is_flag=True,
    help="Record the given rules (and --max-size, --every) as the store's automatic upkeep "
    "policy instead of pruning now; with --off, turn automatic upkeep off.",
)
@click.option("--every", metavar="AGE", help="With --save: how often upkeep runs (default 1d).")
@click.option("--off", is_flag=True, help="With --save: no automatic upkeep for this store.")
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@json_option
@pass_ctx
def prune(
    ctx: Ctx,
    session_opt: str | None,
    all_sessions: bool,
    keep_within: str | None,
    keep_last: int | None,
    keep_labelled: bool,
    max_size: str | None,
    auto: bool,
    save: bool,
    every: str | None,
    off: bool,
    dry_run: bool,
) -> None:
    """Apply a retention policy: mark old checkpoints pruned, then `gc` frees their space.

    A checkpoint is kept when any rule keeps it; branch heads, the start of a live durable
    run and an interrupted rewind are always kept. With neither --keep-within nor --keep-last
    the default is --keep-within 7d --keep-last 100. Pruned records stay in the history (the
    hash chain still verifies) but their state and files can no longer be loaded.

    Retention also runs by itself: once a day, when a store that was written closes, every
    session is pruned by the store's policy (default: the rules above and a 10 GiB budget),
    then gc runs. `--save` changes that policy, `--auto` runs it now.

    \b
    Example:
      stashpoint prune --keep-within 24h --keep-last 20 --dry-run
      stashpoint prune --all --keep-last 50 && stashpoint gc
      stashpoint prune --save --keep-within 3d --keep-last 50 --max-size 2GiB
      stashpoint prune --auto --json
    """
    if save or auto:
        if save and auto:
            raise click.UsageError("--save and --auto exclude each other")
        if off and not save:
            raise click.UsageError("--off goes with --save")
        from .. import upkeep

        store = ctx.store()
        current = upkeep.load(store)
        chosen = (
            replace(current, enabled=False)
            if off
            else _with_rules(current, keep_within, keep_last, keep_labelled, max_size, every)
        )
        (_save_upkeep if save else _run_upkeep)(ctx, store, chosen, dry_run)
        return
    if max_size or every or off:
        raise click.UsageError("--max-size, --every and --off go with --save or --auto")
    from .. import retention

    if all_sessions and session_opt:
        raise click.UsageError("--session and --all exclude each other")
    if keep_within is None and keep_last is None:
        policy = retention.Policy(
            retention.DEFAULT_POLICY.keep_within, retention.DEFAULT_POLICY.keep_last, keep_labelled
        )
    else:
        policy = retention.Policy.of(keep_within, keep_last, keep_labelled)
    store = ctx.store()
    if all_sessions:
        names = store.sessions()
    else:
        _u, _root, link_session, _b = ctx.locate()
        names = [session_opt or ctx.session_name or link_session or "main"]
    plans: list[tuple[Plan, list[str], dict[str, str]]] = []
    for name in names:
        plan = retention.plan_session(store, name, policy)
        done = [] if dry_run else retention.apply(store, plan)
        plans.append((plan, done, store.session(name).labels()))
    if ctx.json:
        emit(
            ctx,
            {
                "dry_run": dry_run,
                "sessions": [
                    {
                        **p.to_dict(labels),
                        "pruned": done,
                        "skipped": sorted(set(p.remove) - set(done)),
                    }
                    for p, done, labels in plans
                ],
            },
        )
        return
    total = 0
    for p, done, labels in plans:
        click.echo(click.style(f"session {p.session}", bold=True))
        for ident, reasons in p.keep.items():
            click.echo(f"  keep   {_describe(p, ident, labels)}  [{', '.join(reasons)}]")
        for ident in p.remove:
            click.echo(click.style(f"  prune  {_describe(p, ident, labels)}", fg="red"))
        if p.already:
            click.echo(f"  ({len(p.already)} pruned earlier)")
        skipped = set(p.remove) - set(done)
        if skipped and not dry_run:
            click.echo(f"  {len(skipped)} became a branch head meanwhile and were kept")
        total += len(p.remove) if dry_run else len(done)
    if dry_run:
        click.echo(f"would prune {total} checkpoint(s); nothing changed (--dry-run)")
    else:
        click.echo(f"pruned {total} checkpoint(s); `stashpoint gc` frees what only they used")


def _with_rules(
    current: Upkeep,
    keep_within: str | None,
    keep_last: int | None,
    keep_labelled: bool,
    max_size: str | None,
    every: str | None,
) -> Upkeep:
    """The store's upkeep policy with the rules given on the command line in place."""
    from .. import retention, upkeep

    policy = current.policy
    if keep_within is not None or keep_last is not None:
        policy = retention.Policy.of(keep_within, keep_last, keep_labelled)
    elif not keep_labelled:
        policy = replace(policy, keep_labelled=False)
    return upkeep.Upkeep(
        policy,
        upkeep.parse_size(max_size) if max_size else current.max_bytes,
        upkeep.parse_every(every) if every else current.every,
        True,
    )


def _save_upkeep(ctx: Ctx, store: Store, chosen: Upkeep, dry_run: bool) -> None:
    from .. import upkeep

    if not dry_run:
        upkeep.save(store, chosen)
    emit(
        ctx,
        {"upkeep": chosen.to_dict(), "saved": not dry_run},
        f"automatic upkeep: {chosen.describe()}" + (" (not saved: --dry-run)" if dry_run else ""),
    )


def _run_upkeep(ctx: Ctx, store: Store, current: Upkeep, dry_run: bool) -> None:
    from .. import upkeep

    report = upkeep.run(store, current, dry_run=dry_run)
    data = {"upkeep": current.to_dict(), **report.to_dict()}
    pruned = sum(report.pruned.values())
    text = [f"upkeep ({current.describe()}):"]
    text.append(
        f"  {'would prune' if dry_run else 'pruned'} {pruned} checkpoint(s)"
        + (f" in {len(report.pruned)} session(s)" if report.pruned else "")
    )
    if not dry_run:
        text.append(
            f"  kept checkpoints reference {size_text(report.kept_bytes)}; freed "
            f"{size_text(report.freed_bytes)}"
            + (f"; {report.rounds} budget round(s)" if report.rounds else "")
            + (
                f"; {size_text(report.pending_bytes)} freed after gc's grace period"
                if report.pending_bytes
                else ""
            )
        )
        if report.over_budget:
            text.append("  still over budget: only heads, labelled checkpoints and milestones left")
    emit(ctx, data, "\n".join(text))


def _describe(p: Plan, ident: str, labels: dict[str, str]) -> str:
    cp = p.records.get(ident)
    if cp is None:
        return short(ident)
    label = labels.get(ident)
    text = f"{short(ident)}  {cp.branch:<10} step {cp.step:<4} {cp.kind:<10} {cp.created_at[:19]}"
    return text + (f"  [{label}]" if label else "")


@click.command()
@click.option("--dry-run", is_flag=True, help="Report what would be freed; change nothing.")
@click.option(
    "--grace",
    metavar="AGE",
    help="How long condemned blobs wait when other processes have the store open "
    "(default 10m; 0 if you know none of them is writing).",
)
@click.option("--wait", is_flag=True, help="Sleep out the grace period instead of leaving it.")
@click.option("--vacuum", is_flag=True, help="Also shrink the database file (SQLite VACUUM).")
@json_option
@pass_ctx
def gc(ctx: Ctx, dry_run: bool, grace: str | None, wait: bool, vacuum: bool) -> None:
    """Free blobs, packs and logs that no kept checkpoint references.

    Safe while agents write: unreferenced blobs are first condemned, and deleted at once only
    when no other process has the store open (else after the grace period: a later `gc`, or
    `--wait`). Interrupting it at any moment loses nothing; the next run finishes.

    \b
    Example:
      stashpoint prune --keep-last 20 && stashpoint gc
      stashpoint gc --dry-run --json
    """
    from ..gc import collect

    store = ctx.store()
    with ByteProgress("gc", enabled=not ctx.json) as progress:
        report = collect(
            store,
            grace=_seconds(grace) if grace is not None else None,
            dry_run=dry_run,
            wait=wait,
            vacuum=vacuum,
            progress=progress,
        )
    data = report.to_dict()
    if ctx.json:
        emit(ctx, data)
        return
    for problem in report.problems:
        click.echo(click.style("warning: ", fg="yellow") + problem, err=True)
    head = (
        f"{report.checkpoints} checkpoints ({report.pruned} pruned); "
        f"{report.live_blobs} blobs in use ({size_text(report.live_bytes)}); "
        f"{report.garbage_blobs} unreferenced ({size_text(report.garbage_bytes)}), "
        f"{report.garbage_logs} unreferenced logs ({size_text(report.garbage_log_bytes)})"
    )
    click.echo(head)
    if dry_run:
        click.echo("nothing changed (--dry-run)")
        return
    click.echo(
        f"freed {size_text(report.freed_bytes)}: {report.freed_blobs} blobs, {report.freed_logs} "
        f"logs, {report.packs_deleted} packs deleted, {report.packs_repacked} repacked"
        + (f", {report.temp_files} temp files" if report.temp_files else "")
    )
    if report.pending_blobs or report.pending_logs:
        click.echo(
            f"{report.pending_blobs} blobs ({size_text(report.pending_bytes)}) and "
            f"{report.pending_logs} logs are condemned but wait until "
            f"{report.collectable_after or 'the grace period ends'}: other processes have the "
            "store open and may be mid-checkpoint. Run `stashpoint gc` again then, or "
            "`stashpoint gc --wait`, or `--grace 0` if none of them is writing."
        )


@click.command()
@json_option
@pass_ctx
def du(ctx: Ctx) -> None:
    """Show where the store's bytes are: by kind, per session, and what gc would free.

    \b
    Example:
      stashpoint du
      stashpoint du --json | jq .gc
    """
    from ..gc import usage

    store = ctx.store()
    with ByteProgress("du", enabled=not ctx.json) as progress:
        u = usage(store, progress=progress)
    data: dict[str, Any] = u.to_dict()
    from ..upkeep import format_size, load

    policy = load(store)
    data["upkeep"] = policy.to_dict()
    if ctx.json:
        emit(ctx, data)
        return
    click.echo(click.style(f"{'kind':<16} {'count':>9} {'size':>11}", bold=True))
    for kind, row in u.kinds.items():
        click.echo(f"{kind:<16} {row['count']:>9} {size_text(row['bytes']):>11}")
    click.echo(click.style("\nsessions", bold=True))
    for name, s in u.sessions.items():
        click.echo(
            f"  {name}: {s['records']} checkpoints ({s['pruned']} pruned), records "
            f"{size_text(s['record_bytes'])}, messages {size_text(s['message_bytes'])}, "
            f"blobs in use {size_text(s['blob_bytes'])}"
        )
    click.echo(f"\nautomatic upkeep: {policy.describe()}")
    if policy.enabled and policy.max_bytes:
        kept = sum(s["blob_bytes"] for s in u.sessions.values())
        click.echo(f"  budget: {format_size(policy.max_bytes)}; blobs in use {format_size(kept)}")
    g = u.gc
    if "error" in g:
        click.echo(f"\ngc: {g['error']}")
    else:
        click.echo(
            f"\ngc would free {size_text(g['garbage_bytes'] + g['garbage_log_bytes'])}: "
            f"{g['garbage_blobs']} blobs, {g['garbage_logs']} logs"
            + (f" ({g['pending_blobs']} blobs already condemned)" if g["pending_blobs"] else "")
        )
