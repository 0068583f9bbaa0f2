"""``stashpoint`` command line: a thin layer over the library."""

from __future__ import annotations

import sys

import click

from .. import __version__
from . import bundles, commands, copying, durable, hooks, maintenance, operator, ui_cmd
from ._app import EXIT_USER, Ctx

__all__ = ["cli", "main"]

EPILOG = """\b
Exit codes: 0 ok, 1 usage or user error, 2 integrity failure, 3 conflict or lease lost.
Environment: STASHPOINT_STORE (like --store), STASHPOINT_SESSION (like --session),
STASHPOINT_MIRROR (like --mirror).
STASHPOINT_KEY or STASHPOINT_KEY_FILE (encryption key; see `stashpoint init --new-key`).
STASHPOINT_INTEGRITY_KEY or STASHPOINT_INTEGRITY_KEY_FILE (key of a keyed hash chain).
STASHPOINT_DURABILITY: fsync (default), group[:N][,Tms] or exit (see `stashpoint init`).
STASHPOINT_ACCEPT_ROLLBACK=1 (like --accept-rollback); STASHPOINT_WITNESS_DIR (where the
rollback witness is kept; default $XDG_STATE_HOME/stashpoint/witness), STASHPOINT_WITNESS=off.
"""


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.option(
    "--store",
    "store_url",
    envvar="STASHPOINT_STORE",
    metavar="URL",
    help="Store URL or path (default: nearest .stashpoint above the current directory).",
)
@click.option(
    "--session",
    "session_name",
    envvar="STASHPOINT_SESSION",
    metavar="NAME",
    help="Session name (default: main).",
)
@click.option("--json", "json_out", is_flag=True, help="Print machine-readable JSON.")
@click.option(
    "-C",
    "--workspace",
    metavar="DIR",
    help="Workspace directory (default: the store's project directory, or the current one).",
)
@click.option("--force", is_flag=True, help="Allow a workspace at / or $HOME.")
@click.option(
    "--mirror",
    "mirror_url",
    envvar="STASHPOINT_MIRROR",
    metavar="URL",
    help="Also write every checkpoint to this store; reads fall back to it.",
)
@click.option(
    "--accept-rollback",
    is_flag=True,
    help="Open a store that is older than the newest state you saw of it (restored from a "
    "backup on purpose); without it that is refused, exit 2.",
)
@click.version_option(version=__version__, prog_name="stashpoint")
@click.pass_context
def cli(
    c: click.Context,
    store_url: str | None,
    session_name: str | None,
    json_out: bool,
    workspace: str | None,
    force: bool,
    mirror_url: str | None,
    accept_rollback: bool,
) -> None:
    """Save, restore, rewind and fork an AI agent's workspace and state.

    \b
    Quick start, in a project directory:
      stashpoint snap -m "before refactor"   # snapshot the whole workspace
      stashpoint log --graph                 # history as a tree
      stashpoint diff HEAD~1 HEAD            # what changed
      stashpoint rewind HEAD~1               # go back (undoable)
    """
    if accept_rollback:  # every store this command opens (some open more than one)
        import os

        from ..witness import ACCEPT_ENV

        os.environ[ACCEPT_ENV] = "1"
    c.obj = Ctx(store_url, session_name, json_out, workspace, force, mirror_url)


# Every command, attached here and nowhere else: a command module defines plain click
# commands and never imports this group, so the modules import each other in one direction.
COMMANDS: tuple[click.Command, ...] = (
    commands.init,
    commands.snap,
    commands.log,
    commands.show,
    commands.diff,
    commands.rewind,
    commands.fork,
    commands.label,
    commands.verify,
    commands.demo,
    durable.tasks,
    durable.approve,
    durable.reject,
    durable.resume,
    maintenance.prune,
    maintenance.gc,
    maintenance.du,
    bundles.export_cmd,
    bundles.import_cmd,
    copying.copy_cmd,
    operator.edit,
    operator.chaos,
    hooks.hooks,
    ui_cmd.ui,
)
for _command in COMMANDS:
    cli.add_command(_command)


def _show_warning(
    message: Warning | str, category: type[Warning], *_args: object, **_kw: object
) -> None:
    click.echo(f"warning: {message}", err=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point: maps every failure to the documented exit code."""
    import warnings

    warnings.showwarning = _show_warning  # one readable line, not a source excerpt
    try:
        code = cli.main(args=argv, prog_name="stashpoint", standalone_mode=False)
        if isinstance(code, int) and code:  # click returns Exit's code in this mode
            sys.exit(code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_USER)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USER)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        from ..errors import StashpointError

        if isinstance(exc, StashpointError):
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        if isinstance(exc, OSError):  # a full disk, a permission: a message, not a traceback
            where = f" ({exc.filename})" if exc.filename else ""
            click.echo(f"error: {exc.strerror or exc}{where}", err=True)
            sys.exit(EXIT_USER)
        raise
    sys.exit(0)
