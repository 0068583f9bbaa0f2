"""``python -m stashpoint``: the command line."""

from stashpoint.cli import main

main()
