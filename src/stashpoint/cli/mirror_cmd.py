"""``stashpoint verify --mirror``: compare a store with its mirror."""

from __future__ import annotations

import click

from ._app import EXIT_INTEGRITY, Ctx, emit


def verify_mirror(ctx: Ctx, url: str) -> None:
    """Verify both stores and print their differences; exit 2 on damage."""
    from ..errors import UsageError
    from ..mirror import MirroredStore, compare_stores
    from ..opening import open_store

    url = url or ctx.mirror_url or ""
    if not url:
        raise UsageError("verify --mirror needs a URL, or the global --mirror / STASHPOINT_MIRROR")
    store = ctx.store()
    if isinstance(store, MirroredStore) and store.mirror is not None and url == store.mirror_url:
        report = compare_stores(store, store.mirror)
    else:
        with open_store(url) as mirror:
            report = compare_stores(store, mirror)
    emit(ctx, report.to_dict())
    if not ctx.json:
        for p in report.damaged:
            click.echo(click.style("damaged: ", fg="red") + p.message, err=True)
        for p in report.behind:
            click.echo(click.style("behind: ", fg="yellow") + p.message, err=True)
        if report.behind_since is not None:
            since = report.behind_since
            click.echo(f"mirror behind since {since.get('since')}: {since.get('error')}", err=True)
        click.echo(
            f"{report.checkpoints} checkpoints compared between {report.primary} and "
            f"{report.mirror}: "
            + (f"{len(report.damaged)} damaged" if report.damaged else "no damage")
            + (f", mirror behind by {len(report.behind)}" if report.behind else "")
        )
    if not report.ok:
        raise SystemExit(EXIT_INTEGRITY)
