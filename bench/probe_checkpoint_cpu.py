"""CPU time of the state and LangGraph benchmarks' per-step rows, for several source trees.

The ``state`` and ``langgraph`` benchmarks time each checkpoint and ``put`` with the wall
clock, which a busy machine inflates at random. This probe runs their very workloads
(``bench_state.bench_stashpoint`` at NORMAL and FULL, ``bench_langgraph._puts`` and one graph
run) with ``time.process_time`` in place of the wall clock, once per tree and run, the trees
interleaved (base, new, base, new, ...) so that both see the machine alike, and prints the
median over runs of each row (the rows' own medians over the steps around step s) and the
ratio of each tree to the first one.

    python bench/probe_checkpoint_cpu.py base=/path/to/old/src new=src [--runs 3] [--steps N]

Each tree is a ``src`` directory put first on the child's PYTHONPATH. CPU time counts what
the process computes; at FULL it also counts the kernel's part of each fsync, not the wait.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, shutil, statistics, sys, tempfile, time, types
from pathlib import Path
sys.path.insert(0, sys.argv[1])
steps = int(sys.argv[2])
import bench_langgraph, bench_state, stashpoint
from workload import conversation

cpu = types.SimpleNamespace(perf_counter=time.process_time)
bench_state.time = bench_langgraph.time = cpu  # the timed sections count CPU, not wall time


class NoFloor:  # the floor row is a wall-clock peer: not sampled here
    times: list = []
    def sample(self): pass
    def close(self): pass


def windows(xs):
    return {s: statistics.median(v) * 1e3 for s, v in bench_state._windows(xs, len(xs)).items()}


conv = conversation(steps)
out = {"tree": stashpoint.__file__}
tmp = Path(tempfile.mkdtemp(prefix="sp-probe-cpu-"))
try:
    for sync in ("NORMAL", "FULL"):
        sp = bench_state.bench_stashpoint(tmp, conv, sync, 1, NoFloor())
        for s, v in windows(sp["times"]).items():
            out[f"state [{sync}] checkpoint at step {s:,}"] = v
    saver = bench_langgraph.StashpointSaver(stashpoint.open(tmp / "direct"))
    for s, v in windows(bench_langgraph._puts(saver, conv, None)).items():
        out[f"langgraph put at step {s:,}"] = v
    saver.close()
    saver = bench_langgraph.StashpointSaver(stashpoint.open(tmp / "graph"))
    timed = bench_langgraph.Timed(saver)
    bench_langgraph._run(saver, conv, timed)
    for s, v in windows(timed.steps([])).items():
        out[f"langgraph graph step at {s:,}"] = v
    out["langgraph put_writes, median"] = statistics.median(timed.writes) * 1e3
    saver.close()
finally:
    shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("trees", nargs="+", help="NAME=SRC_DIR (the first is the baseline)")
    p.add_argument("--runs", type=int, default=3, help="runs per tree (default 3)")
    p.add_argument("--steps", type=int, default=1000, help="steps per workload (default 1,000)")
    p.add_argument("--json", help="also write the medians here")
    args = p.parse_args(argv)
    trees = [t.split("=", 1) for t in args.trees]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for i in range(args.runs):
        for name, src in trees:
            env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, str(HERE), str(args.steps)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"run {i + 1} {name}: {got.pop('tree')}", file=sys.stderr)
            runs[name].append(got)
    rows = list(runs[trees[0][0]][0])
    med = {n: {r: statistics.median(x[r] for x in runs[n]) for r in rows} for n in runs}
    base = trees[0][0]
    head = f"{'CPU ms, median of ' + str(args.runs) + ' runs':45s}" + "".join(
        f"{n:>10s}" for n in runs
    )
    print(head + "".join(f"{n + '/' + base:>14s}" for n in list(runs)[1:]))
    for r in rows:
        line = f"{r:45s}" + "".join(f"{med[n][r]:10.3f}" for n in runs)
        line += "".join(f"{med[n][r] / med[base][r]:14.3f}" for n in list(runs)[1:])
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "medians": med}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
