"""What one state checkpoint writes to SQLite: transactions, SQL statements, WAL pages.

The ``state`` benchmark's workload (two new ~500 B messages per checkpoint, the whole list
handed over) on a SQLite store at ``synchronous=FULL``: after ``WARM`` checkpoints, automatic
WAL checkpoints are turned off and the WAL emptied, then ``N`` checkpoints run with SQLite's
trace callback on. Printed per checkpoint: BEGINs and COMMITs, statements by kind, and the
WAL frames written, by the B-tree each page belongs to (``dbstat``), beside the floor (one
bare 1 KB row per commit, as the benchmark's floor writes).

    python bench/probe_checkpoint_writes.py [N] [--no-floor]      # N default 200

fsyncs are counted from outside, without the floor, e.g. (N = 0 runs the start-up and
warm-up alone: its counts are to subtract):

    strace -f -c -e trace=fsync,fdatasync,pwrite64 \
        python bench/probe_checkpoint_writes.py 200 --no-floor
"""

from __future__ import annotations

import shutil
import sqlite3
import struct
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import conversation

WARM = 20


def wal_frames(wal: Path) -> list[tuple[int, int]]:
    """(page number, commit marker) of every valid frame of a WAL file."""
    data = wal.read_bytes()
    if len(data) < 32:
        return []
    page = struct.unpack(">I", data[8:12])[0]
    salt, out, off = data[16:24], [], 32
    while off + 24 + page <= len(data) and data[off + 8 : off + 16] == salt:
        out.append(struct.unpack(">II", data[off : off + 8]))
        off += 24 + page
    return out


def by_tree(db: Path, frames: list[tuple[int, int]]) -> Counter[str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        owner = dict((p, name) for name, p in conn.execute("SELECT name, pageno FROM dbstat"))
    return Counter(owner.get(p, "?") for p, _ in frames)


def stashpoint_writes(tmp: Path, n: int) -> None:
    import stashpoint

    conv = conversation(WARM + n)
    store = stashpoint.open(tmp / "s")
    run = store.session("conv")
    msgs: list[Any] = []
    for pair in conv[:WARM]:
        msgs.extend(pair)
        run.checkpoint({"messages": msgs})
    if n == 0:  # the start-up and warm-up alone, for an strace count to subtract
        store.close()
        return
    meta: Any = store.meta
    while hasattr(meta, "inner"):
        meta = meta.inner
    db: sqlite3.Connection = meta._db
    db.execute("PRAGMA wal_autocheckpoint=0")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    seen: list[str] = []
    db.set_trace_callback(seen.append)
    for pair in conv[WARM:]:
        msgs.extend(pair)
        run.checkpoint({"messages": msgs})
    db.set_trace_callback(None)
    frames = wal_frames(Path(f"{meta.path}-wal"))
    trees = by_tree(meta.path, frames)
    store.close()
    kinds = Counter(" ".join(s.split()[:2]) for s in seen)
    print(f"stashpoint, {n} state checkpoints:")
    print(f"  statements {len(seen) / n:.2f}, transactions {kinds['BEGIN IMMEDIATE'] / n:.2f}")
    for kind, count in kinds.most_common():
        print(f"    {count / n:5.2f} {kind}")
    print(f"  WAL frames {len(frames) / n:.2f}")
    for tree, count in trees.most_common():
        print(f"    {count / n:5.2f} {tree}")


def floor_writes(tmp: Path, n: int) -> None:
    import os

    conn = sqlite3.connect(tmp / "floor.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
    payload = os.urandom(1024)
    for i in range(WARM + n):
        if i == WARM:
            conn.execute("PRAGMA wal_autocheckpoint=0")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t(data) VALUES (?)", (payload,))
        conn.execute("COMMIT")
    frames = wal_frames(tmp / "floor.db-wal")
    conn.close()
    print(f"floor (1 KB row per commit): WAL frames {len(frames) / n:.2f}")


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--no-floor"]
    n = int(args[0]) if args else 200
    tmp = Path(tempfile.mkdtemp(prefix="sp-probe-writes-"))
    try:
        stashpoint_writes(tmp, n)
        if n and "--no-floor" not in sys.argv:
            floor_writes(tmp, n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
