"""``stashpoint copy``: sessions from one store to another, of any kind, verified after."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ._app import Ctx, emit, json_option, missing_local_store, pass_ctx, size_text
from ._progress import ByteProgress

if TYPE_CHECKING:
    from .._store import Store

# Library modules are imported inside the commands, not here: every CLI run (``--help``
# too) imports this module (start-up time).


def _existing(url: str) -> str:
    """A source that is a path must exist: opening it would create an empty store."""
    if missing_local_store(url):
        raise click.UsageError(f"no store at {url}")
    return url


def _open_source(url: str, *, plain_ok: bool) -> Store:
    """The source store. The CLI's one key ($STASHPOINT_KEY) is the destination's when a
    session is copied --as a new one into an encrypted store: a plain source is then opened
    without it (opening it with a key is refused: its rows are not encrypted)."""
    from ..crypto import key_from_env
    from ..errors import EncryptionKeyError
    from ..opening import open_store

    try:
        return open_store(url)
    except EncryptionKeyError as exc:
        if key_from_env() is None:
            raise
        if not plain_ok:
            raise EncryptionKeyError(
                f"{exc}; to copy one of its sessions into an encrypted store: --session S --as NEW"
            ) from None
        try:
            return open_store(url, encryption_key=b"")
        except EncryptionKeyError:
            raise exc from None  # encrypted under another key: the first error says so


@click.command("copy")
@click.option("--from", "source", required=True, metavar="URL", help="Store to copy from.")
@click.option("--to", "dest", required=True, metavar="URL", help="Store to copy into (created).")
@click.option(
    "--session",
    "sessions",
    multiple=True,
    metavar="NAME",
    help="Copy this session (repeatable; default: every session, or the global --session).",
)
@click.option(
    "--as",
    "as_name",
    metavar="NEW",
    help="Copy the one --session as a new session NEW, sealed again under the destination's "
    "key with new ids (between a plain and an encrypted store, or two keys).",
)
@json_option
@pass_ctx
def copy_cmd(
    ctx: Ctx, source: str, dest: str, sessions: tuple[str, ...], as_name: str | None
) -> None:
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
      STASHPOINT_KEY=… stashpoint copy --from .stashpoint --to vault --session fix-42 --as fix-42
    """
    from ..copy import copy_sessions, raise_if_unverified
    from ..opening import open_store

    names = list(sessions) or ([ctx.session_name] if ctx.session_name else None)
    with (
        _open_source(_existing(source), plain_ok=as_name is not None) as src,
        open_store(dest) as dst,
        ByteProgress("copy", enabled=not ctx.json) as progress,
    ):
        report = copy_sessions(src, dst, sessions=names, as_session=as_name, progress=progress)
    emit(
        ctx,
        report.to_dict(),
        f"copied {len(report.sessions)} session(s) ({', '.join(report.sessions)}): "
        f"{report.checkpoints} checkpoint(s)"
        + (f" ({report.present} already there)" if report.present else "")
        + f", {report.blobs} objects ({size_text(report.bytes)}) from {report.source} to "
        f"{report.dest}; "
        + ("verified" if report.verified else f"{len(report.problems)} problem(s)"),
    )
    raise_if_unverified(report)
