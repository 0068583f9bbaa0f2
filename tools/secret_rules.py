"""Write ``src/stashpoint/secret_rules.json``: detect-secrets' rules as stashpoint derives them,
shipped so that a CLI command never imports detect-secrets just to learn its rules.

    python tools/secret_rules.py          # rewrite it (after upgrading detect-secrets)
    python tools/secret_rules.py --check  # exit 1 if it is stale (run by the tests)
"""

from __future__ import annotations

import sys

from stashpoint.secrets_rules import SHIPPED, derived_rules_document


def main(argv: list[str]) -> int:
    text = derived_rules_document()
    if "--check" in argv:
        if not SHIPPED.exists() or SHIPPED.read_text() != text:
            print(f"{SHIPPED} is stale: run `python tools/secret_rules.py`", file=sys.stderr)
            return 1
        return 0
    SHIPPED.write_text(text)
    print(f"wrote {SHIPPED}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
