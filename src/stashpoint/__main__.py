"""``python -m stashpoint`` and the ``stashpoint`` console script: the command line.

A command the workspace's watch daemon serves is handed to it before the CLI (click, the
library) is imported: :mod:`stashpoint.watchd.client`. Anything else, or no daemon, runs the
CLI in this process. ``stashpoint --help`` is printed from its pre-rendered text
(:mod:`stashpoint._help_text`) when click would print exactly that: the console script's
name, and a terminal of 80 columns or more (or none).

The site-less launcher ``make setup`` installs (:mod:`stashpoint.watchd.launcher`) starts the
interpreter without :mod:`site` and enters at :func:`launch`: the two paths above need only the
standard library, and :func:`site.main` runs before the CLI is imported.
"""

import sys


def _prerendered_help(args: list[str]) -> bool:
    if args not in (["--help"], ["-h"]) or sys.argv[0].rpartition("/")[2] != "stashpoint":
        return False
    import shutil

    from stashpoint._help_text import HELP, WIDTH

    if min(shutil.get_terminal_size().columns, 80) - 2 != WIDTH:
        return False  # a narrower terminal: click wraps the text to it
    sys.stdout.write(HELP)
    sys.stdout.flush()
    return True


def main() -> None:
    if _prerendered_help(sys.argv[1:]):
        return
    from stashpoint.watchd.client import run_if_served

    code = run_if_served(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    _run_cli()


def _run_cli() -> None:
    """The CLI in this process, which ends when it returns (or raises).

    Then every object still tracked is frozen, so that the interpreter's shutdown, which
    collects garbage over all of them more than once, has none to look at: after a first
    snapshot of 50k files (a stat cache entry per file, kept for reuse) the shutdown took
    45-65 ms, 13-19 ms frozen (a busy 2-core machine), of a command that had already done
    its work. Objects are still freed by reference counting and atexit handlers (pending stat
    cache writes) run as before; only a reference cycle that was garbage already is left to
    the process's end, which frees everything anyway. Never for the CLI run in a longer-lived
    process (tests, an agent calling ``cli.main``): only this entry point freezes."""
    from stashpoint.cli import main as cli_main

    try:
        cli_main()
    finally:
        import gc

        gc.freeze()


def launch(package_dir: str) -> None:
    """:func:`main` for an interpreter started without :mod:`site` by the launcher, which
    appended ``package_dir`` to ``sys.path``: what the daemon does not serve first gets the
    start-up ``site`` would have done (``package_dir`` taken back out, as ``site`` puts the
    environment's directories where it was)."""
    if _prerendered_help(sys.argv[1:]):
        return
    from stashpoint.watchd.client import run_if_served

    code = run_if_served(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    if sys.flags.no_site and "site" not in sys.modules:
        if sys.path and sys.path[-1] == package_dir:
            sys.path.pop()
        import site

        site.main()
    _run_cli()


if __name__ == "__main__":
    main()
