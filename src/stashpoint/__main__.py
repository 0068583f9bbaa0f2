"""``python -m stashpoint`` and the ``stashpoint`` console script: the command line.

A command the workspace's watch daemon serves is handed to it before the CLI (click, the
library) is imported: :mod:`stashpoint.watchd.client`. Anything else, or no daemon, runs the
CLI in this process.
"""

import sys


def main() -> None:
    from stashpoint.watchd.client import run_if_served

    code = run_if_served(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from stashpoint.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
