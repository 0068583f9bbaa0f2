"""Time and peak memory of ``stashpoint import`` (and ``fork --into``) on each hostile bundle
at full size: a script, not a unit test.

    PYTHONPATH=src:. python -m tests.hostile.measure [--keep DIR]

Each command runs as a user types it, in a child process; its peak RSS is the child's
``ru_maxrss`` (``/usr/bin/time``'s ``%M``). Bundles are built first (untimed): values
and bombs are zstd frames of RLE blocks, padded with random bytes where the row's bundle was
that large (so that the 1000x rule alone does not decide it).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from stashpoint.bundle import BLOB, RawEntry

from . import bundles as hb
from .bundles import GIB, MIB, TIB

STASHPOINT = [sys.executable, "-m", "stashpoint"]


def run(args: list[str], cwd: Path, home: Path) -> tuple[int, float, float, str]:
    """(exit code, seconds, peak RSS MiB, last line of stderr) of ``stashpoint ARGS``."""
    env = {**os.environ, "HOME": str(home)}
    for var in ("STASHPOINT_STORE", "STASHPOINT_SESSION", "STASHPOINT_KEY"):
        env.pop(var, None)
    stats = cwd / "time.txt"
    # /usr/bin/time, not this process's wait4: a child forked from this (large) process
    # would count the pages it had before exec in its peak.
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%e %M", "-o", str(stats), *STASHPOINT, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    seconds, kib = stats.read_text().split()[-2:]
    err = proc.stderr.strip().splitlines() or [""]
    return proc.returncode, float(seconds), int(kib) / 1024, err[-1][:150]


def padded(
    base: Path, out: Path, pad: int, values: dict[str, bytes], added: list[RawEntry]
) -> Path:
    digest, entry = hb.raw(BLOB, random.Random(pad).randbytes(pad))
    return hb.forge(base, out, values={**values, "pad": digest}, added=[*added, entry])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, help="Build in this directory and keep it.")
    opts = ap.parse_args()
    root = opts.keep or Path(tempfile.mkdtemp(prefix="sp-hostile-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        measure(root)
    finally:
        if opts.keep is None:
            shutil.rmtree(root, ignore_errors=True)


def measure(root: Path) -> None:
    base = hb.base_bundle(root / "base")
    print("building bundles ...", file=sys.stderr)
    one_gib = hb.run_digest(GIB)
    value = RawEntry(BLOB, one_gib.hex(), 1, GIB, hb.rle_frame(GIB))
    rows: list[tuple[str, Path, list[list[str]]]] = [
        (
            "1 GiB zero run as a state value (1.1 MB)",
            padded(base, root / "value.spb", 1_100_000, {"plan": one_gib}, [value]),
            [[]],
        ),
        (
            "40 unreferenced 1 GiB bombs (41 MB)",
            padded(
                base,
                root / "bombs.spb",
                41_000_000,
                {},
                list(_bombs(40)),
            ),
            [[], ["--max-size", "64GiB"]],
        ),
        (
            "1 TiB chunk list, wrong digest (1 MB)",
            _chunked(base, root / "tib.spb", TIB),
            [[]],
        ),
        (
            "2 GiB file (1 MB)",
            _chunked(base, root / "file.spb", 2 * GIB, true_digest=True),
            [[]],
        ),
        (
            "1 M-entry directory (665 KB)",
            hb.wide_tree(base, root / "wide.spb", 1_000_000),
            [[]],
        ),
        ("10^6 fan-out (2.3 KB)", hb.fan_out(base, root / "fan.spb", 6, 10), [[]]),
        (
            "255 levels x 200-character names",
            hb.long_path(base, root / "long.spb", 255, 200),
            [[], ["--max-path", "100000"]],
        ),
    ]
    print(f"{'bundle':42} {'size':>10}  {'flags':22} {'exit':>4} {'s':>6} {'MiB':>6}  message")
    for title, bundle, variants in rows:
        for flags in variants:
            cwd = root / f"t-{bundle.stem}-{len(flags)}"
            cwd.mkdir()
            code, secs, rss, msg = run(["import", str(bundle), *flags], cwd, root)
            size = bundle.stat().st_size
            print(
                f"{title:42} {size:>10,}  {' '.join(flags):22} {code:>4} {secs:6.1f} "
                f"{rss:6.0f}  {msg}"
            )
            if code == 0 and bundle.stem in ("long", "file"):
                dest = root / f"fork-{bundle.stem}"
                ident = _head(cwd)
                code, secs, rss, msg = run(["fork", ident, "--into", str(dest)], cwd, root)
                left = "absent" if not dest.exists() else f"{sum(1 for _ in dest.rglob('*'))} paths"
                print(
                    f"{'  fork --into of it':42} {'':>10}  {'':22} {code:>4} {secs:6.1f} "
                    f"{rss:6.0f}  {msg or 'ok'} (directory {left})"
                )
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"(this script, building: {own:.0f} MiB peak)", file=sys.stderr)


def _bombs(count: int) -> list[RawEntry]:
    import hashlib

    size = GIB - count  # up to 1 GiB each: the entry limit does not decide it
    h = hashlib.sha256(bytes(size % (4 * MIB)))
    piece = bytes(4 * MIB)
    for _ in range(size // len(piece)):
        h.update(piece)
    out = []
    for i in range(count):
        d = h.copy()
        d.update(bytes(i))
        out.append(RawEntry(BLOB, d.hexdigest(), 1, size + i, hb.rle_frame(size + i)))
    return out


def _chunked(base: Path, out: Path, size: int, *, true_digest: bool = False) -> Path:
    """As :func:`hb.chunked_zeros`, padded to 1 MB like the measured bundles."""
    plain = hb.chunked_zeros(base, out.with_suffix(".tmp"), size, true_digest=true_digest)
    from stashpoint.bundle import iter_entries

    entries = list(iter_entries(plain))
    pad, pad_entry = hb.raw(BLOB, random.Random(1).randbytes(1_000_000))
    plain.unlink()
    rebased = out.with_suffix(".base")
    hb.save(entries, rebased)
    return hb.forge(rebased, out, values={"pad": pad}, added=[pad_entry])


def _head(cwd: Path) -> str:
    import stashpoint

    with stashpoint.open(cwd / ".stashpoint") as store:
        head = store.session("main").head
        assert head is not None
        return head.id


if __name__ == "__main__":
    main()
