"""CPU instructions per checkpoint and per LangGraph ``put``, for several source trees.

Wall-clock and even CPU-time figures swing by tens of percent on a busy machine; the number of
instructions a process executes does not. This probe runs the ``state`` benchmark's loop
(``Session.checkpoint`` of a growing conversation, SQLite at NORMAL) or the ``langgraph``
benchmark's direct ``put`` loop under ``valgrind --tool=callgrind`` twice, for ``lo`` and
``hi`` steps, and prints ``(Ir(hi) - Ir(lo)) / (hi - lo)``: the user-space instructions of
one step around step ``(lo + hi) / 2`` (SQLite's included; the kernel's fsync not). Start-up
and imports cancel out, and both runs first pass the ``hi`` steps' messages through a
redactor (it compiles a rule when a text first calls for it: a one-time cost that would
otherwise land inside some window). Deterministic to ~1 % (ids and timestamps vary); slow: a
LangGraph run at 1,000 steps takes minutes under valgrind.

    python bench/probe_checkpoint_instructions.py state 900 1000 base=/old/src new=src
    python bench/probe_checkpoint_instructions.py lgput 90 110 base=/old/src new=src
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import shutil, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
mode, steps, warm = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
import stashpoint
from stashpoint.redact import make_redactor
from workload import conversation
conv = conversation(max(steps, warm, 1))
scrub = make_redactor(None, None)
for pair in conv[:warm]:  # the redactor compiles rules on first match: not inside the steps
    for m in pair:
        scrub(m)
conv = conv[:steps]
tmp = Path(tempfile.mkdtemp(prefix="sp-probe-ir-"))
if mode == "state":
    import bench_state
    store = bench_state._open_store(tmp / "s", "NORMAL")
    run = store.session("conv")
    run.checkpoint({"messages": []})  # first-use costs (rules, statements) out of the steps
    msgs = []
    for pair in conv:
        msgs.extend(pair)
        run.checkpoint({"messages": msgs})
    store.close()
else:
    import bench_langgraph
    saver = bench_langgraph.StashpointSaver(stashpoint.open(tmp / "l"))
    bench_langgraph._puts(saver, conv, None)
    saver.close()
shutil.rmtree(tmp)
"""


def instructions(src: str, mode: str, steps: int, warm: int) -> int:
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            CHILD,
            str(HERE),
            mode,
            str(steps),
            str(warm),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    got = re.search(r"Collected : (\d+)", proc.stderr)
    if got is None:
        raise SystemExit(f"no instruction count from valgrind:\n{proc.stderr[-2000:]}")
    return int(got.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("mode", choices=("state", "lgput"))
    p.add_argument("lo", type=int)
    p.add_argument("hi", type=int)
    p.add_argument("trees", nargs="+", help="NAME=SRC_DIR (the first is the baseline)")
    args = p.parse_args(argv)
    per_step: dict[str, float] = {}
    for name, src in (t.split("=", 1) for t in args.trees):
        lo = instructions(src, args.mode, args.lo, args.hi)
        hi = instructions(src, args.mode, args.hi, args.hi)
        per_step[name] = (hi - lo) / (args.hi - args.lo)
        print(f"{name}: {per_step[name]:,.0f} instructions per step", file=sys.stderr)
    base = next(iter(per_step.values()))
    for name, ir in per_step.items():
        print(f"{args.mode} steps {args.lo}..{args.hi} {name:>10s} {ir:14,.0f} {ir / base:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
