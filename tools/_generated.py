"""What every generator under tools/ does with its output: write it, or with ``--check`` say
whether the committed file is current (the tests run the check, so generated files cannot
drift from what they are generated from)."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(out: Path, text: str, argv: list[str], command: str) -> int:
    """Exit code: 1 when ``--check`` finds ``out`` stale, else 0 (after writing it)."""
    if "--check" in argv:
        if not out.exists() or out.read_text() != text:
            print(f"{out} is stale: run `{command}`", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"wrote {out}")
    return 0
