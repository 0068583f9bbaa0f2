"""Portable bundles: export and import throughput beside ``tar --zstd`` of the same data.

The history: the 10k-file workspace, then ``CHECKPOINTS`` checkpoints, each
after appending to 3 files (an agent's edit), each adding a user and an assistant message to
the conversation (``--quick``: 1k files, 30 checkpoints).

What is compared, and how it is kept honest:

- export: the whole session (every checkpoint, the conversation log, every file version) to
  one bundle file; peer: ``tar --zstd -cf`` of the workspace's tracked files (node_modules/
  excluded, as the snapshots exclude it). The bundle carries slightly more (history), so the
  throughput rows divide each tool's own input bytes by its time; the time rows say the rest.
- import: check everything, then write into a fresh store (SQLite ``synchronous=FULL``, pack and
  chunk files fsynced); peers: ``tar --zstd -xf`` into a fresh directory, as shipped (no fsync)
  and followed by ``sync`` (durable, like the import).
- Both run in this process's machine one after the other, order rotated per repetition,
  ``os.sync()`` before each timed step; stashpoint is measured through its API (in-process),
  tar as a subprocess (the only way to run it).
- Every imported store is verified and a fork of its head compared with the workspace
  (untimed), so a fast wrong import cannot pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import stashpoint
from _common import Config, median, row, timed
from stashpoint.bundle import export_bundle, import_bundle, read_bundle
from stashpoint.verify import verify_store
from workload import conversation, fingerprint, make_workspace, modify_files

MIB = 1 << 20
CHECKPOINTS = 300
CHANGED = 3


def _tar(*args: str) -> None:
    subprocess.run(["tar", *args], check=True, capture_output=True)


def _mibs(nbytes: int, seconds: list[float]) -> list[float]:
    return [nbytes / MIB / s for s in seconds]


def run(cfg: Config) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sp-bench-bundle-", dir=cfg.tmp))
    steps = CHECKPOINTS if cfg.files >= 10_000 else 30
    try:
        return _run(cfg, tmp, steps)
    finally:
        if not cfg.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(cfg: Config, tmp: Path, steps: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    ws = make_workspace(tmp / "ws", cfg.files)
    store = stashpoint.open(tmp / "src")
    session = store.session("bench", workspace=ws.root)
    msgs: list[dict[str, Any]] = []
    for i, pair in enumerate(conversation(steps)):
        if i:
            modify_files(ws, CHANGED, seed=10_000 + i)
        msgs = [*msgs, *pair]
        session.checkpoint({"messages": msgs}, message=f"step {i}")
    head = session.head
    assert head is not None
    setup = time.perf_counter() - t0
    want = fingerprint(ws.root)
    tracked = ws.total_bytes

    s: dict[str, list[float]] = {}
    info: dict[str, Any] = {}

    def export(rep: int) -> None:
        path = tmp / f"b{rep}.spb"
        s.setdefault("export", []).append(
            timed(lambda: info.__setitem__("export", export_bundle(store, path, session="bench")))
        )

    def tar_create(rep: int) -> None:
        out = tmp / f"t{rep}.tar.zst"
        args = ["--zstd", "-cf", str(out), "--exclude=./node_modules", "-C", str(ws.root), "."]
        s.setdefault("tar_c", []).append(timed(lambda: _tar(*args)))
        info["tar_size"] = out.stat().st_size

    def import_(rep: int) -> None:
        dst = stashpoint.open(tmp / f"imp{rep}")

        def go() -> None:
            with read_bundle(tmp / f"b{rep}.spb", hasher=dst.hasher) as bundle:
                import_bundle(dst, bundle)

        s.setdefault("import", []).append(timed(go))
        _check(dst, head.id, tmp / f"fork{rep}", want)
        dst.close()
        shutil.rmtree(tmp / f"imp{rep}")

    def tar_extract(rep: int, durable: bool) -> None:
        dest = tmp / f"x{rep}{'s' if durable else ''}"
        dest.mkdir()

        def go() -> None:
            _tar("--zstd", "-xf", str(tmp / f"t{rep}.tar.zst"), "-C", str(dest))
            if durable:
                os.sync()

        s.setdefault("tar_xs" if durable else "tar_x", []).append(timed(go))
        shutil.rmtree(dest)

    reps = max(1, cfg.reps if cfg.files >= 10_000 else min(cfg.reps, 3))
    for rep in range(reps):
        jobs = [
            lambda r=rep: export(r),
            lambda r=rep: tar_create(r),
        ]
        for job in jobs[rep % 2 :] + jobs[: rep % 2]:
            os.sync()
            job()
        jobs = [
            lambda r=rep: import_(r),
            lambda r=rep: tar_extract(r, False),
            lambda r=rep: tar_extract(r, True),
        ]
        for job in jobs[rep % 3 :] + jobs[: rep % 3]:
            os.sync()
            job()
    one = tmp / "head.spb"
    os.sync()
    s["export_one"] = [
        timed(
            lambda: info.__setitem__(
                "one", export_bundle(store, one, session="bench", checkpoint=head.id)
            )
        )
    ]
    store.close()
    rep_all, rep_one = info["export"], info["one"]
    bundle_bytes = rep_all.bytes
    rows = [
        row(
            f"export, session of {steps} checkpoints",
            median(_mibs(bundle_bytes, s["export"])),
            "MiB/s",
            peer=median(_mibs(tracked, s["tar_c"])),
            peer_name="tar --zstd -c",
            samples=_mibs(bundle_bytes, s["export"]),
            peer_samples=_mibs(tracked, s["tar_c"]),
        ),
        row(
            "import (check + write, fsynced)",
            median(_mibs(bundle_bytes, s["import"])),
            "MiB/s",
            peer=median(_mibs(tracked, s["tar_x"])),
            peer_name="tar --zstd -x",
            samples=_mibs(bundle_bytes, s["import"]),
            peer_samples=_mibs(tracked, s["tar_x"]),
        ),
        row(
            "import (check + write, fsynced)",
            median(_mibs(bundle_bytes, s["import"])),
            "MiB/s",
            peer=median(_mibs(tracked, s["tar_xs"])),
            peer_name="tar -x && sync",
            peer_samples=_mibs(tracked, s["tar_xs"]),
        ),
        row(
            "export time",
            median(s["export"]),
            "s",
            peer=median(s["tar_c"]),
            peer_name="tar --zstd -c",
            samples=s["export"],
            peer_samples=s["tar_c"],
        ),
        row(
            "import time",
            median(s["import"]),
            "s",
            peer=median(s["tar_x"]),
            peer_name="tar --zstd -x",
            samples=s["import"],
            peer_samples=s["tar_x"],
        ),
        row(
            "import time",
            median(s["import"]),
            "s",
            peer=median(s["tar_xs"]),
            peer_name="tar -x && sync",
            peer_samples=s["tar_xs"],
        ),
        row(
            "bundle size, whole session",
            rep_all.size / MIB,
            "MiB",
            peer=info["tar_size"] / MIB,
            peer_name="tar.zst of head",
        ),
        row(
            "bundle size, head checkpoint + ancestry",
            rep_one.size / MIB,
            "MiB",
            peer=info["tar_size"] / MIB,
            peer_name="tar.zst of head",
        ),
        row("export time, head checkpoint + ancestry", s["export_one"][0], "s"),
    ]
    notes = [
        f"history: {ws.files:,} tracked files ({tracked / MIB:.1f} MiB), then {steps} "
        f"checkpoints each after appending to {CHANGED} files, conversation +2 messages per "
        f"checkpoint; built in {setup:.1f} s",
        f"bundle: {rep_all.checkpoints} records, {rep_all.logs} log(s), {rep_all.objects:,} "
        f"objects, {bundle_bytes / MIB:.1f} MiB of entries; tar input: the {tracked / MIB:.1f} "
        "MiB of tracked files at the head",
        "throughput = each tool's own input bytes / its time; ratio > 1 means faster than tar "
        "on MiB/s rows, slower on time rows",
        "durability: import writes a fsynced pack, fsynced chunk files and SQLite commits with "
        "synchronous=FULL; 'tar -x' fsyncs nothing, 'tar -x && sync' flushes the page cache",
        "a single-checkpoint bundle carries its ancestors' records and contents (every record "
        "in a store is verified with its contents); the size row shows what that costs",
        f"every import verified (verify_store) and its head forked and fingerprinted; "
        f"{reps} repetitions, medians",
    ]
    return {
        "name": "bundle",
        "rows": rows,
        "notes": notes,
        "env": {"python": sys.version.split()[0]},
    }


def _check(dst: stashpoint.Store, head: str, into: Path, want: str) -> None:
    report = verify_store(dst)
    if not report.ok:
        raise AssertionError(f"imported store does not verify: {report.problems[:3]}")
    dst.session("bench").fork(head, "check", into=into)
    (into / ".stashpoint").unlink()
    if fingerprint(into) != want:
        raise AssertionError("a fork of the imported head differs from the workspace")
    shutil.rmtree(into)


if __name__ == "__main__":
    from run_all import main

    main(["--only", "bundle", *sys.argv[1:]])
