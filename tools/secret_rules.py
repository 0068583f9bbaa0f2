"""Write ``src/stashpoint/secret_rules.json``: detect-secrets' rules as stashpoint derives them,
shipped so that a CLI command never imports detect-secrets just to learn its rules.

    python tools/secret_rules.py          # rewrite it (after upgrading detect-secrets)
    python tools/secret_rules.py --check  # exit 1 if it is stale (run by the tests)
"""

from __future__ import annotations

import sys

from _generated import write_or_check  # tools/ is on sys.path when a tool runs

from stashpoint.secrets_rules import SHIPPED, derived_rules_document


def main(argv: list[str]) -> int:
    return write_or_check(SHIPPED, derived_rules_document(), argv, "python tools/secret_rules.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
