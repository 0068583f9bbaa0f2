"""One first snapshot, timed: ``python bench/first.py STORE_DIR WORKSPACE``.

Prints wall, user and sys time of opening a new store, one session checkpoint of the
workspace and closing it, then the CPU of the calling thread and of each other thread (from
/proc, Linux only): the scanning thread is the critical path, the others compress and write.
"""

from __future__ import annotations

import os
import resource
import sys
import time

import stashpoint


def _threads() -> dict[int, float]:
    """CPU seconds of each thread of this process, by thread id."""
    out: dict[int, float] = {}
    if not os.path.isdir("/proc/self/task"):
        return out
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def main() -> None:
    store, root = sys.argv[1], sys.argv[2]
    before = _threads()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0, c0 = time.perf_counter(), time.thread_time()
    with stashpoint.open(store) as s:
        s.session("bench", workspace=root).checkpoint(message="first")
    wall, main_cpu = time.perf_counter() - t0, time.thread_time() - c0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    others = sorted(
        (cpu - before.get(tid, 0.0) for tid, cpu in _threads().items() if tid != os.getpid()),
        reverse=True,
    )
    user, sys_ = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    print(
        f"wall {wall:.3f}s user {user:.3f} sys {sys_:.3f} main {main_cpu:.3f} "
        f"threads {' '.join(f'{c:.2f}' for c in others if c >= 0.005)}"
    )


if __name__ == "__main__":
    main()
