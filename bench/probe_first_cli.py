"""First snapshot through the CLI (as bench_workspace runs it) and the API, two trees
alternating: ``python bench/probe_first_cli.py OLD_TREE NEW_TREE WORKSPACE [RUNS] [cli,api]``.

Each run gets a new store in a temporary directory, after ``sync``; the workspace is only
read. The CLI row is the console script next to this interpreter with ``cli_env`` (the
tree's ``src`` first on ``PYTHONPATH``); the API row is ``bench/first.py`` of the tree in a
fresh process. Prints the median wall and CPU (user + sys of the process tree) of each, and
the load: on a shared machine CPU is the figure to compare, wall only when it was idle.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import cli_env, stashpoint_cmd


def main() -> None:
    old, new, ws = sys.argv[1], sys.argv[2], sys.argv[3]
    runs = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    modes = sys.argv[5].split(",") if len(sys.argv) > 5 else ["cli", "api"]
    trees = {"old": old, "new": new}
    sp = stashpoint_cmd()
    res: dict[tuple[str, str], list[tuple[float, float]]] = {}
    loads: list[float] = []
    tmp = Path(tempfile.mkdtemp(prefix="probe-first-cli-"))
    try:
        for i in range(runs):
            for mode in modes:
                for name, tree in trees.items():
                    env = cli_env()
                    env["PYTHONPATH"] = str(Path(tree) / "src")
                    store = tmp / f"{mode}-{name}-{i}"
                    os.sync()
                    loads.append(os.getloadavg()[0])
                    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t0 = time.perf_counter()
                    if mode == "cli":
                        cmd = [*sp, "--store", str(store), "-C", ws, "--session", "bench", "snap"]
                    else:
                        cmd = [
                            sys.executable,
                            str(Path(tree) / "bench" / "first.py"),
                            str(store),
                            ws,
                        ]
                    subprocess.run(cmd, check=True, capture_output=True, env=env)
                    wall = time.perf_counter() - t0
                    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
                    res.setdefault((mode, name), []).append((wall, cpu))
                    shutil.rmtree(store)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for (mode, name), rows in sorted(res.items()):
        wall = statistics.median(r[0] for r in rows)
        cpu = statistics.median(r[1] for r in rows)
        print(f"{mode} {name}: n={len(rows)} wall {wall:.3f} s, cpu {cpu:.3f} s")
    print(f"load (1 min) at the runs: {min(loads):.2f}-{max(loads):.2f}")


if __name__ == "__main__":
    main()
