"""Probe: replacing files by a rename over them vs by an exchange (``renameat2``), alone.

What a restore's writes cost when it replaces 110 files of ~8 KB (the rewind workload's
modified files), written as the restore writes them: a temp file beside each (create,
write, chmod, close), an ``O_PATH`` descriptor held on the old file (see
``stashpoint.workspace.restore._Releaser``), then either ``rename(tmp, name)`` or
``renameat2(tmp, name, RENAME_EXCHANGE)`` + ``unlink(tmp)``. The two alternate, after an
``os.sync()`` each; wall and CPU (process_time) medians and minima are printed.

On ext4 (``auto_da_alloc``, the default) a rename over an existing file allocates the new
file's blocks and starts its writeback inside the rename; an exchange does not.

Usage: ``nice -n 19 python bench/probe_exchange.py [--src /work/ws10k/pkg00] [--reps 20]``
(the directory is copied first, never modified). Linux only.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time

_RENAME_EXCHANGE = 2


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", default="/work/ws10k/pkg00")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--files", type=int, default=110)
    args = p.parse_args()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    tmp = tempfile.mkdtemp(prefix="probe-exchange-")
    root = os.path.join(tmp, "ws")
    subprocess.run(["cp", "-a", args.src, root], check=True)
    try:
        files = sorted(os.path.join(d, f) for d, _s, fs in os.walk(root) for f in fs)
        pick = random.Random(1).sample(files, args.files)
        data = {}
        for path in pick:
            with open(path, "rb") as f:
                data[path] = f.read()

        def restore(exchange: bool) -> tuple[float, float]:
            held = []
            t0, c0 = time.perf_counter(), time.process_time()
            for path in pick:
                d, n = os.path.split(path)
                name, tmpname = n.encode(), b".stashpoint-tmp-" + n.encode()
                dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(tmpname, flags, 0o600, dir_fd=dfd)
                os.write(fd, data[path])
                os.fchmod(fd, 0o644)
                os.close(fd)
                held.append(os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=dfd))
                if exchange:
                    if libc.renameat2(dfd, tmpname, dfd, name, _RENAME_EXCHANGE) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, os.strerror(err))
                    os.unlink(tmpname, dir_fd=dfd)
                else:
                    os.replace(tmpname, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                os.close(dfd)
            took = (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000
            for fd in held:  # (the restore closes these on a thread, off its path)
                os.close(fd)
            return took

        got: dict[str, list[tuple[float, float]]] = {"rename over": [], "exchange": []}
        for _rep in range(args.reps):
            for how in got:
                os.sync()
                got[how].append(restore(how == "exchange"))
        print(f"{args.files} files replaced, {args.reps} times each, load {os.getloadavg()[0]:.2f}")
        for how, xs in got.items():
            walls, cpus = [x[0] for x in xs], [x[1] for x in xs]
            print(
                f"{how:<12} wall median {statistics.median(walls):6.2f} ms  min {min(walls):6.2f}"
                f"   cpu median {statistics.median(cpus):6.2f} ms  min {min(cpus):6.2f}"
            )
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
