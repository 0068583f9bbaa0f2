"""The docs say what the code does: every code block in README.md and docs/ runs, and the CLI
reference is the commands' own ``--help``.

Blocks run as a user would run them: Python blocks in a fresh interpreter, shell blocks in
bash with ``stashpoint`` on the PATH, each in an empty directory holding a small project
(``my-project/`` and ``repo/``). A block's info string may add one word after the language:
``no-run`` for install commands and servers (only those), ``fragment`` for code that needs a
framework's model or a server and is only compiled here (its full version runs in the tests
named beside it in the docs). ``pip install`` lines are not run: the test environment has
every extra already.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.S | re.M)
NO_RUN_OK = re.compile(r"^\s*(#.*)?$|^\s*(pip install|make (demo|test|setup)|stashpoint ui)\b")


def _blocks() -> list[tuple[str, str, str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            words = m.group(1).split()
            lang = words[0] if words else ""
            mode = words[1] if len(words) > 1 else "run"
            line = text.count("\n", 0, m.start()) + 1
            found.append((f"{doc.relative_to(ROOT)}:{line}", lang, mode, m.group(2)))
    return found


BLOCKS = _blocks()


def _project(tmp: Path) -> None:
    for name in ("my-project", "repo"):
        d = tmp / name
        (d / "src").mkdir(parents=True)
        (d / "app.py").write_text("def main():\n    return 'old'\n")
        (d / "notes.txt").write_text("todo: refactor\n")
        (d / "src" / "util.py").write_text("X = 1\n")


@pytest.mark.parametrize(("where", "lang", "mode", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_code_block_runs(where: str, lang: str, mode: str, code: str, tmp_path: Path) -> None:
    assert lang in ("python", "sh", "bash", "text", "toml", "json"), f"{where}: say the language"
    assert mode in ("run", "no-run", "fragment"), f"{where}: unknown mode {mode!r}"
    if lang in ("text", "toml", "json"):
        return  # output shown to the reader, not a program
    if mode == "no-run":
        bad = [line for line in code.splitlines() if not NO_RUN_OK.match(line)]
        assert not bad, f"{where}: only install commands and servers may be no-run: {bad}"
        return
    if mode == "fragment":
        assert lang == "python", f"{where}: only Python blocks may be fragments"
        compile(code, where, "exec", flags=0x2000)  # PyCF_ALLOW_TOP_LEVEL_AWAIT
        return
    _project(tmp_path)
    (tmp_path / "home").mkdir()
    env = dict(os.environ, HOME=str(tmp_path / "home"), NO_COLOR="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.pop("STASHPOINT_STORE", None)
    env.pop("STASHPOINT_SESSION", None)
    if lang == "python":
        cmd = [sys.executable, "-c", code]
    else:
        code = re.sub(r"(?m)^\s*pip install\b.*$", ":", code)
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{where} failed:\n{done.stdout}\n{done.stderr}"


def generated_file_is_current(tool: str) -> None:
    """``python tools/TOOL.py --check``: the committed output equals what the tool writes."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / f"{tool}.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_cli_reference_is_current() -> None:
    generated_file_is_current("cli_reference")


def test_shipped_secret_rules_are_current() -> None:
    """The detect-secrets rules shipped in the package are what the pinned release gives."""
    generated_file_is_current("secret_rules")
