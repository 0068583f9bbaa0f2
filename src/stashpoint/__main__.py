"""``python -m stashpoint`` and the ``stashpoint`` console script: the command line.

A command the workspace's watch daemon serves is handed to it before the CLI (click, the
library) is imported: :mod:`stashpoint.watchd.client`. Anything else, or no daemon, runs the
CLI in this process. ``stashpoint --help`` is printed from its pre-rendered text
(:mod:`stashpoint._help_text`) when click would print exactly that: the console script's
name, and a terminal of 80 columns or more (or none).
"""

import os
import sys


def _prerendered_help(args: list[str]) -> bool:
    if args not in (["--help"], ["-h"]) or os.path.basename(sys.argv[0]) != "stashpoint":
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
    from stashpoint.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
