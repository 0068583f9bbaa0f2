"""CLI cold start: ``stashpoint --help`` in a fresh process, as an agent hook pays it.

Context rows: the bare interpreter (``python -c pass``, the floor nobody can beat from
Python), the same ``--help`` without a bytecode cache (what an editable install under
``PYTHONDONTWRITEBYTECODE=1`` pays), and ``stashpoint snap`` of a one-file workspace: the fixed
cost every storage command adds on top of its work. The ``-X importtime`` summary names the
modules that cost the most, which is where to look when the bar is missed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import Config, cli_env, median, row, stashpoint_cmd, timed, warm_bytecode

BAR_MS = 60.0


def _runs(cmd: list[str], n: int, env: dict[str, str]) -> list[float]:
    subprocess.run(cmd, check=True, capture_output=True, env=env)  # warm-up (page cache)

    def once() -> None:
        subprocess.run(cmd, check=True, capture_output=True, env=env)

    return [timed(once) * 1000 for _ in range(n)]


def import_costs(env: dict[str, str], top: int = 8, runs: int = 5) -> list[tuple[str, float]]:
    """The costliest imports of ``stashpoint --help``: cumulative ms from ``-X importtime``,
    down to two levels of nesting, median over a few runs (single runs are noisy)."""
    code = "import sys; from stashpoint.cli import main; sys.argv=['stashpoint','--help']; main()"
    seen: dict[str, list[float]] = {}
    for _ in range(runs):
        cmd = [sys.executable, "-X", "importtime", "-c", code]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        for line in proc.stderr.splitlines():
            m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
            if m and len(m.group(2)) <= 5:  # two levels of nesting at most
                seen.setdefault(m.group(3), []).append(int(m.group(1)) / 1000)
    costs = [(name, median(ms)) for name, ms in seen.items() if len(ms) == runs]
    return sorted(costs, key=lambda c: -c[1])[:top]


def run(cfg: Config) -> dict[str, Any]:
    sp = stashpoint_cmd()
    n = cfg.cli_runs
    env, no_cache = cli_env(), cli_env(bytecode=False)
    warm_bytecode(env)
    helps = _runs([*sp, "--help"], n, env)
    tmp = Path(tempfile.mkdtemp(prefix="sp-bench-cli-", dir=cfg.tmp))
    try:
        (tmp / "ws").mkdir()
        (tmp / "ws" / "a.txt").write_text("hello\n")
        snap = _runs([*sp, "--store", str(tmp / "st"), "-C", str(tmp / "ws"), "snap"], n, env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [
        row(
            "stashpoint --help (cold process)",
            median(helps),
            "ms",
            bar=BAR_MS,
            bar_kind="abs",
            samples=helps,
        ),
        row(
            "stashpoint --help, no bytecode cache",
            median(h := _runs([*sp, "--help"], n, no_cache)),
            "ms",
            samples=h,
        ),
        row(
            "stashpoint --version", median(v := _runs([*sp, "--version"], n, env)), "ms", samples=v
        ),
        row("stashpoint snap, 1-file workspace", median(snap), "ms", samples=snap),
        row(
            "python -c pass (interpreter floor)",
            median(b := _runs([sys.executable, "-c", "pass"], n, env)),
            "ms",
            samples=b,
        ),
    ]
    costs = import_costs(env)
    notes = [
        f"median of {n} runs each, after one warm-up run; wall time of the whole subprocess; "
        "bytecode cached (PYTHONPYCACHEPREFIX) unless said otherwise",
        "costliest imports of `stashpoint --help` (cumulative, -X importtime): "
        + ", ".join(f"{name} {ms:.1f} ms" for name, ms in costs),
    ]
    return {"name": "cli", "rows": rows, "notes": notes, "imports": costs}


if __name__ == "__main__":
    from run_all import main

    main(["--only", "cli", *sys.argv[1:]])
