"""``stashpoint`` command line: a thin layer over the library."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from .. import __version__
from ._lazy import LazyGroup

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


# Every command, attached here and nowhere else: name -> ("module:attribute", summary). A
# command module defines plain click commands and never imports this group, so the modules
# import each other in one direction. Each module is imported when one of its commands runs,
# never for `stashpoint --help` (start-up time), which lists the summaries: the first sentence
# of each command's help, checked against it by tests/test_cli_structure.py.
COMMANDS: dict[str, tuple[str, str]] = {
    "init": (
        "commands:init",
        "Create a store (.stashpoint) in DIRECTORY (default: the current directory).",
    ),
    "snap": (
        "commands:snap",
        "Snapshot the workspace (all files, also those changed by shell commands).",
    ),
    "log": (
        "commands:log",
        "List the session's checkpoints, newest first (a child always before its parent).",
    ),
    "show": (
        "commands:show",
        "Show one checkpoint: metadata, state, a workspace summary and its artifacts.",
    ),
    "diff": (
        "commands:diff",
        "Compare two checkpoints: state, conversation and files (unified diff).",
    ),
    "rewind": (
        "commands:rewind",
        "Go back to a checkpoint: files and state (default), or only one of them.",
    ),
    "fork": (
        "commands:fork",
        "Start a new branch from a checkpoint, here or in another directory.",
    ),
    "label": ("commands:label", "Give a checkpoint a name you can use instead of its id."),
    "verify": (
        "commands:verify",
        "Check every checkpoint, hash chain, conversation and blob in the store.",
    ),
    "demo": (
        "commands:demo",
        (
            "Run a scripted agent for ~10 steps, then rewind, fork and diff its history; then a "
            "durable agent that is killed with kill -9, resumed, paused for approval and approved."
        ),
    ),
    "tasks": (
        "durable:tasks",
        "Show the run's task list with statuses (of the live run, or as of checkpoint REF).",
    ),
    "approve": (
        "durable:approve",
        (
            "Approve the tool call a paused run waits for (ID: the paused checkpoint or request id;"
            " default: the one pending decision)."
        ),
    ),
    "reject": (
        "durable:reject",
        (
            "Reject the tool call a paused run waits for: on resume the call raises ToolRejected in"
            " the agent (with the reason) instead of running."
        ),
    ),
    "resume": (
        "durable:resume",
        (
            "Continue the session's durable run from where it stopped: runs the agent program again"
            " (the command it was started with, or the one after --); recorded steps replay from "
            "the journal, the rest execute."
        ),
    ),
    "prune": (
        "maintenance:prune",
        "Apply a retention policy: mark old checkpoints pruned, then `gc` frees their space.",
    ),
    "gc": ("maintenance:gc", "Free blobs, packs and logs that no kept checkpoint references."),
    "du": (
        "maintenance:du",
        "Show where the store's bytes are: by kind, per session, and what gc would free.",
    ),
    "export": (
        "bundles:export_cmd",
        "Write the session (or the checkpoint REF with its ancestors) to one bundle file.",
    ),
    "import": (
        "bundles:import_cmd",
        (
            "Import a bundle into this store (created here if there is none), into the session it "
            "was exported from (or a new one: --as NAME)."
        ),
    ),
    "upgrade": (
        "upgrade_cmd:upgrade",
        "Convert a store written by an older stashpoint (format 1) to the current format.",
    ),
    "copy": (
        "copying:copy_cmd",
        "Copy sessions from one store to another: SQLite, PostgreSQL, Redis, memory, S3 blobs.",
    ),
    "edit": (
        "operator:edit",
        (
            "Correct the state of checkpoint REF (default HEAD) and save it as a new child "
            "checkpoint of kind `edit` (who, when, why recorded); the original is untouched."
        ),
    ),
    "chaos": (
        "operator:chaos",
        (
            "Test that an agent recovers: run COMMAND in fresh copies of this directory, kill it "
            "(SIGKILL) after each step boundary and at random instants, resume it until it "
            "finishes, and report per run whether it reached an uninterrupted run's output with no "
            "step body executed again after its result was journaled."
        ),
    ),
    "hooks": (
        "hooks:hooks",
        "Snapshot the workspace from a coding agent's hooks (Claude Code, Codex, Aider).",
    ),
    "ui": (
        "ui_cmd:ui",
        (
            "Serve the time-travel debugger: sessions, checkpoint tree, state, file diffs, restore "
            "/ fork / approve."
        ),
    ),
    "watch": (
        "watch_cmd:watch",
        (
            "A daemon per workspace that keeps the store open and watches the files (inotify), so "
            "that snap, rewind, log and agent hooks run in milliseconds."
        ),
    ),
}


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=EPILOG,
)
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
    from ._app import (
        Ctx,
    )  # here, not at the top: `stashpoint --help` never runs this (start-up time)

    c.obj = Ctx(store_url, session_name, json_out, workspace, force, mirror_url)


def _show_warning(
    message: Warning | str, category: type[Warning], *_args: object, **_kw: object
) -> None:
    click.echo(f"warning: {message}", err=True)


def _exit_user() -> NoReturn:
    from ._app import EXIT_USER  # here, not at the top: `--help` does not import _app (start-up)

    sys.exit(EXIT_USER)


def _cwd_gone(exc: OSError) -> bool:
    """Whether ``exc`` is the current directory having been removed under the shell (the
    error names no file: only "No such file or directory")."""
    import os

    if not isinstance(exc, FileNotFoundError) or exc.filename is not None:
        return False
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


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
        _exit_user()
    except click.ClickException as exc:
        exc.show()
        _exit_user()
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        from ..errors import StashpointError

        if isinstance(exc, StashpointError):
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        if isinstance(exc, OSError):  # a full disk, a permission: a message, not a traceback
            if _cwd_gone(exc):
                click.echo(
                    "error: the current directory no longer exists (it was deleted or moved); "
                    "cd to a directory that exists and run the command again",
                    err=True,
                )
                _exit_user()
            where = f" ({exc.filename})" if exc.filename else ""
            click.echo(f"error: {exc.strerror or exc}{where}", err=True)
            _exit_user()
        raise
    sys.exit(0)
