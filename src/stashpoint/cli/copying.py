"""``stashpoint copy``: sessions from one store to another, of any kind, verified after."""

from __future__ import annotations

from pathlib import Path

import click

from . import cli
from ._app import Ctx, emit, json_option
from ._progress import ByteProgress
from .bundles import _size

pass_ctx = click.make_pass_decorator(Ctx)


def _existing(url: str) -> str:
    """A source that is a path must exist: opening it would create an empty store."""
    path = url
    for scheme in ("sqlite://", "file://"):
        if url.startswith(scheme):
            path = url[len(scheme) :]
    path = path.split("?", 1)[0]
    if "://" not in path and not Path(path).expanduser().exists():
        raise click.UsageError(f"no store at {url}")
    return url


@cli.command("copy")
@click.option("--from", "source", required=True, metavar="URL", help="Store to copy from.")
@click.option("--to", "dest", required=True, metavar="URL", help="Store to copy into (created).")
@click.option(
    "--session",
    "sessions",
    multiple=True,
    metavar="NAME",
    help="Copy this session (repeatable; default: every session, or the global --session).",
)
@json_option
@pass_ctx
def copy_cmd(ctx: Ctx, source: str, dest: str, sessions: tuple[str, ...]) -> None:
    """Copy sessions from one store to another: SQLite, PostgreSQL, Redis, memory, S3 blobs.

    Checkpoints keep their ids and hash chain; heads, labels, pruned marks, conversation and
    journal logs and every file and value they reference come along. Records the destination
    already has are skipped, so re-running is harmless (and finishes an interrupted copy). A
    record, log or branch the destination holds with other contents stops the copy (exit 3)
    before anything of that session is written. The copied sessions are then verified in the
    destination (exit 2 if they do not verify).

    \b
    Example:
      stashpoint copy --from .stashpoint --to postgresql://db/agents
      stashpoint copy --from postgresql://db/agents --to redis://cache:6379/0 --session fix-42
      stashpoint copy --from .stashpoint --to 'sqlite:///backup?blobs=s3://bucket/agents'
    """
    from .._store import open_store
    from ..copy import copy_sessions, raise_if_unverified

    names = list(sessions) or ([ctx.session_name] if ctx.session_name else None)
    with (
        open_store(_existing(source)) as src,
        open_store(dest) as dst,
        ByteProgress("copy", enabled=not ctx.json) as progress,
    ):
        report = copy_sessions(src, dst, sessions=names, progress=progress)
    emit(
        ctx,
        report.to_dict(),
        f"copied {len(report.sessions)} session(s) ({', '.join(report.sessions)}): "
        f"{report.checkpoints} checkpoint(s)"
        + (f" ({report.present} already there)" if report.present else "")
        + f", {report.blobs} objects ({_size(report.bytes)}) from {report.source} to "
        f"{report.dest}; "
        + ("verified" if report.verified else f"{len(report.problems)} problem(s)"),
    )
    raise_if_unverified(report)
