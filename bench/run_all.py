"""Run the benchmarks, print one table each, write ``bench/results/<name>.json``.

    python bench/run_all.py                 # full sizes (10k files, 1,000 steps): a few minutes
    python bench/run_all.py --quick         # smoke test: 1k files, 200 steps, fewer repetitions
    python bench/run_all.py --only state --only cli
    python bench/run_all.py --files 50000   # the 1k / 10k / 50k workspaces

Peers run in the same run as stashpoint, one after the other (never concurrently),
so the ratios compare like with like on this machine.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Config

BENCHES = {
    "workspace": "bench_workspace",
    "state": "bench_state",
    "cli": "bench_cli",
    "durable": "bench_durable",
    "bundle": "bench_bundle",
    "scale": "bench_scale",
    "scale-graph": "bench_scale_graph",
    "langgraph": "bench_langgraph",
    "artifacts": "bench_artifacts",
    "mirror": "bench_mirror",
    "durability": "bench_durability",
    "secrets": "bench_secrets",
    "treesearch": "bench_treesearch",
}
RESULTS = Path(__file__).resolve().parent / "results"


def _num(x: float | None, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    a = abs(x)
    text = f"{x:.3f}" if a < 1 else f"{x:.2f}" if a < 10 else f"{x:.1f}" if a < 100 else f"{x:,.0f}"
    return f"{text} {unit}".strip()


def _ratio(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def _bar(r: dict[str, Any]) -> str:
    if r["bar"] is None:
        return ""
    if r["bar_kind"] == "ratio":
        return f"<= {r['bar']:g}x"
    return f"<= {_num(r['bar'], r['unit'])}"


def table(result: dict[str, Any]) -> str:
    """A pipe table (readable as text, renders as Markdown) plus the notes."""
    head = ["figure", "stashpoint", "peer", "peer median", "ratio", "bar", "result"]
    lines = [head]
    for r in result["rows"]:
        ratio = _ratio(r["ratio"])
        lines.append(
            [
                r["figure"],
                _num(r["stashpoint"], r["unit"]),
                r["peer_name"],
                _num(r["peer"], r["unit"]) if r["peer"] is not None else "",
                ratio,
                _bar(r),
                r["status"],
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = [f"## {result['name']}", ""]
    for n, line in enumerate(lines):
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("| " + " | ".join(cells) + " |")
        if n == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    out += ["", *(f"- {note}" for note in result.get("notes", []))]
    return "\n".join(out)


def _busy_cpu() -> float | None:
    """Machine-wide busy CPU seconds so far (Linux /proc/stat), to see who else was running."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _revision() -> str:
    """The commit stashpoint's sources are at (``+dirty`` with uncommitted changes in src/)."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _config(args: argparse.Namespace) -> Config:
    cfg = Config.quick() if args.quick else Config()
    for name in ("files", "reps", "reps_first", "steps", "lg_steps", "cli_runs"):
        value = getattr(args, name)
        if value is not None:
            setattr(cfg, name, value)
    cfg.tmp = Path(args.tmp) if args.tmp else None
    cfg.keep = args.keep
    return cfg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    p.add_argument("--only", action="append", choices=sorted(BENCHES), help="run only these")
    p.add_argument("--files", type=int, help="tracked files in the workspace (default 10,000)")
    p.add_argument("--reps", type=int, help="repetitions of incremental/rewind/list measurements")
    p.add_argument("--reps-first", type=int, help="repetitions of the first snapshot")
    p.add_argument("--steps", type=int, help="conversation steps for stashpoint (default 1,000)")
    p.add_argument("--lg-steps", type=int, help="conversation steps for LangGraph (default 1,000)")
    p.add_argument("--cli-runs", type=int, help="runs of `stashpoint --help` (default 10)")
    p.add_argument("--tmp", help="scratch directory (default: the system temp dir)")
    p.add_argument("--keep", action="store_true", help="keep scratch files")
    p.add_argument("--out", default=str(RESULTS), help="where to write <name>.json")
    args = p.parse_args(argv)
    cfg = _config(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    missed = 0
    revision = _revision()
    print(f"stashpoint sources at {revision}\n")
    for name in args.only or list(BENCHES):
        module = importlib.import_module(BENCHES[name])
        busy0, own0 = _busy_cpu(), _own_cpu()
        t0 = time.perf_counter()
        result = module.run(cfg)
        result["seconds"] = round(time.perf_counter() - t0, 1)
        result["config"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(cfg).items()}
        result["machine"] = {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        }
        busy1, own1 = _busy_cpu(), _own_cpu()
        others = None if busy0 is None or busy1 is None else (busy1 - busy0) - (own1 - own0)
        result["machine"]["other_cpu_seconds"] = others
        result["revision"] = revision
        result["when"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
        (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
        extra = (
            "" if others is None else f"; other processes used {max(others, 0):.1f} CPU-s meanwhile"
        )
        print(table(result) + f"\n- took {result['seconds']} s{extra}\n", flush=True)
        missed += sum(r["status"] == "MISS" for r in result["rows"])
    print(f"{missed} bar(s) missed; JSON in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
