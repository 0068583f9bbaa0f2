"""``stashpoint upgrade``: convert a store written by an older stashpoint to the current format."""

from __future__ import annotations

import click

from ._app import Ctx, emit, json_option, pass_ctx
from ._progress import StepProgress

# Library modules are imported inside the command (start-up time of every CLI run).


@click.command()
@click.option(
    "--store",
    "store_opt",
    metavar="URL",
    help="The store to upgrade (like the global --store; default: the nearest .stashpoint).",
)
@click.option("--dry-run", is_flag=True, help="Check the store and say what would change.")
@json_option
@pass_ctx
def upgrade(ctx: Ctx, store_opt: str | None, dry_run: bool) -> None:
    """Convert a store written by an older stashpoint (format 1) to the current format.

    Until then such a store can be read as it is (log, show, diff, verify, ui) but not
    written. The upgrade gives every branch head and label its sequence number and, in a
    keyed store, its MAC under the key given now (STASHPOINT_INTEGRITY_KEY, or the encryption
    key), and records the new format last. It is safe to interrupt at any instant: the store
    then still opens as the old format, and running the upgrade again finishes it. Stop
    programs that write the store first; an older stashpoint cannot open it afterwards.
    Exits 0 when the store is (now) in the current format, 1 when it cannot be upgraded as
    asked (a mirror, a newer format), 2 when its records do not verify with the key given.

    \b
    Example:
      stashpoint upgrade --dry-run
      STASHPOINT_INTEGRITY_KEY_FILE=~/.agent.key stashpoint --store postgresql://db/agents upgrade
    """
    from ..errors import UsageError
    from ..opening import open_store
    from ..stores.formats import CURRENT
    from ..upgrade import check_upgraded
    from ..upgrade import upgrade as run_upgrade

    if store_opt is not None:
        ctx.store_url = store_opt
    if ctx.mirror_url:
        raise UsageError("upgrade one store at a time: run it without --mirror, once per store")
    store = ctx.store()
    with StepProgress("upgrade", enabled=not ctx.json) as progress:
        report = run_upgrade(store, dry_run=dry_run, progress=progress)
    data = report.to_dict()
    done = report.format_after == report.format_before
    if not dry_run and not done:
        store.close()
        with open_store(store.url) as again:  # reopened: the new format, refs checked
            data["refs_checked"] = check_upgraded(again)
            data["format_after"] = again.format
    if dry_run and report.format_before < CURRENT:
        what = "MAC" if report.keyed else "sequence number"
        text = (
            f"store {store.url} is in format {report.format_before}: the upgrade would give "
            f"{report.signed} ref(s) (of {report.heads} head(s) and {report.labels} label(s)) "
            f"their {what} and record format {CURRENT}; nothing was written"
        )
    elif done:
        text = f"store {store.url} is in format {report.format_after} already: nothing to do"
    else:
        text = (
            f"store {store.url} upgraded from format {report.format_before} to "
            f"{data['format_after']}: {report.signed} ref(s) "
            + ("signed" if report.keyed else "numbered")
            + f", {data['refs_checked']} read back; `stashpoint verify` checks every record"
        )
    emit(ctx, data, text)
