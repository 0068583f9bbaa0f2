"""What pre-sizing the SQLite WAL saves: LangGraph saver puts with and without it, same run.

The SQLite store writes its WAL file full of zeros once a connection commits its third
checkpoint (``stores/sqlite.py``, ``WAL_GROW_AFTER``): until then every fsynced commit also
journals the file's growth. This probe runs ``bench_langgraph``'s direct ``put`` loop on a new
store with pre-sizing off (``WAL_GROW_AFTER`` set out of reach) and on, alternating, and prints
the median put and the floor (one bare WAL commit of a 1 KB row, sampled before each put) over
steps 5-15, 90-110 and 200-300.

    python bench/probe_wal_presize.py [STEPS]     # default 300 steps, 2 rounds
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stashpoint
import stashpoint.stores.sqlite as sqlite_store
from _common import Floor
from bench_langgraph import _puts
from stashpoint.integrations.langgraph import StashpointSaver
from workload import conversation

WINDOWS = ((5, 15), (90, 110), (200, 300))


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    conv = conversation(steps)
    default = sqlite_store.WAL_GROW_AFTER
    print("put / floor in ms (ratio), median over the steps named; fsync per commit")
    for _round in range(2):
        for name, after in (("growing WAL", 10**9), ("pre-sized", default)):
            sqlite_store.WAL_GROW_AFTER = after
            tmp = Path(tempfile.mkdtemp(prefix="sp-probe-wal-"))
            try:
                floor = Floor(tmp / "floor.db")
                saver = StashpointSaver(stashpoint.open(tmp / "store"))
                puts = _puts(saver, conv, floor)
                saver.close()
                floor.close()
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            cells = []
            for lo, hi in WINDOWS:
                if hi > len(puts):
                    continue
                p = statistics.median(puts[lo:hi]) * 1e3
                f = statistics.median(floor.times[lo:hi]) * 1e3
                cells.append(f"{lo}-{hi}: {p:.3f}/{f:.3f} ({p / f:.2f}x)")
            print(f"{name:<12} " + " | ".join(cells))
    sqlite_store.WAL_GROW_AFTER = default


if __name__ == "__main__":
    main()
