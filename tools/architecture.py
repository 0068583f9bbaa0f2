"""Write docs/architecture.md: the package's layers (from pyproject.toml, which import-linter
checks) and one line per module (its docstring's first sentence), so the page cannot drift.

    python tools/architecture.py          # rewrite docs/architecture.md
    python tools/architecture.py --check  # exit 1 if it is stale (run by the tests)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import tomllib
from _generated import write_or_check  # tools/ is on sys.path when a tool runs

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "stashpoint"
OUT = ROOT / "docs" / "architecture.md"

NAMES = [
    "entry points: the command line's, the watch daemon's",
    "command line",
    "faces: the web UI, framework integrations, the async API, test helpers, the watch "
    "daemon's client",
    "opening a store",
    "operations on whole stores",
    "the engine: sessions, durable runs, diffs, the store facade",
    "content: workspace files, blobs, artifacts, redaction",
    "metadata backends",
    "encryption",
    "foundations: errors, records, encoding, hashing, settings",
]

HEADER = """# Architecture

stashpoint is one package in layers. A module imports only from its own layer or from a lower
one, so each layer can be read, tested and changed knowing only what is below it: the
backends know nothing of sessions, the engine nothing of the CLI or the web UI, and an
operation such as `gc` or `copy` is built from the engine's public parts. Modules joined in one
layer may import each other. The layers are declared once, in `[tool.importlinter]` of
`pyproject.toml`; `lint-imports` checks them (imports inside functions included) in `.ci/run`
and in `tests/test_architecture.py`, which also keeps every module under 800 lines (the few
older ones still above it may only shrink). This page is generated from those layers and the
modules' docstrings by `python tools/architecture.py`, and the tests check it is current.

Every exception and warning lives in `stashpoint.errors`, drawn there as a tree with its exit
code; every store meta key is named in `stashpoint.metakeys`; every setting is resolved in
`stashpoint.config`; where a restore may write is decided in `stashpoint.restore_target`.
"""


def _layers() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [c for c in config["contracts"] if c["type"] == "layers"]
    return [re.split(r"\s*[:|]\s*", layer.strip()) for layer in contract["layers"]]


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    first = re.split(r"(?<=\.)\s", text, maxsplit=1)[0] if text else ""
    return first.replace("|", "\\|") or "(no docstring)"


def _modules(name: str) -> list[tuple[str, Path]]:
    path = PACKAGE / name
    if path.is_dir():
        found = [(f"stashpoint.{name}", path / "__init__.py")]
        for sub in sorted(path.rglob("*.py")):
            if sub == path / "__init__.py" or "__pycache__" in sub.parts:
                continue
            # a package inside (integrations.langgraph) is listed by its __init__'s docstring
            rel = sub.parent if sub.name == "__init__.py" else sub.with_suffix("")
            dotted = rel.relative_to(PACKAGE).as_posix().replace("/", ".")
            found.append((f"stashpoint.{dotted}", sub))
        return found
    return [(f"stashpoint.{name}", PACKAGE / f"{name}.py")]


def render() -> str:
    parts = [HEADER]
    layers = _layers()
    for n, (layer, title) in enumerate(zip(layers, NAMES, strict=True)):
        heading = f"{len(layers) - n}. {title[0].upper()}{title[1:]}"
        parts.append(f"\n## {heading}\n\n| module | what it is |\n|---|---|")
        for name in layer:
            for module, path in _modules(name):
                parts.append(f"| `{module}` | {_summary(path)} |")
    return "\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    return write_or_check(OUT, render(), argv, "python tools/architecture.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
