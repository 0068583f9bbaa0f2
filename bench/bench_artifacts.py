"""Artifacts: a 1 GiB file attached, changed, fetched; beside fixed-size chunking.

The file is dense random data (the worst case: nothing compresses, every byte is hashed and
cut), 1 GiB (``--quick``: 256 MiB). Measured through the API in this process:

- attach: first ``checkpoint(artifacts=...)`` of the file, and after a 4 MiB overwrite in the
  middle; stored bytes added each time (blob directory + database rows, from ``du``);
- insert: 100 bytes inserted 1 MiB into the file, attached again; bytes stored. The peer is the
  same file kept *in the workspace*, where files are cut in fixed 1 MiB chunks: an insertion
  shifts every later chunk, so almost the whole file is stored again;
- fetch: ``fetch_artifact`` of the first version to a new file (fsynced, verified).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import stashpoint
from _common import Config, median, row, timed
from stashpoint.gc import usage

MIB = 1 << 20


def _stored(store: stashpoint.Store) -> int:
    kinds = usage(store).kinds
    return sum(kinds[k]["bytes"] for k in ("loose chunks", "inline blobs", "packed blobs"))


def _write_random(path: Path, size: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    with open(path, "wb") as f:
        for _ in range(size // (8 * MIB)):
            f.write(rng.randbytes(8 * MIB))


def run(cfg: Config) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sp-bench-artifacts-", dir=cfg.tmp))
    try:
        return _run(cfg, tmp)
    finally:
        if not cfg.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(cfg: Config, tmp: Path) -> dict[str, Any]:
    size = (1 << 30) if cfg.files >= 10_000 else (256 * MIB)
    reps = max(1, min(3, cfg.reps_first))
    attach, change, fetch, insert_cdc, insert_fixed, delta_change = [], [], [], [], [], []
    for rep in range(reps):
        d = tmp / f"r{rep}"
        (d / "ws").mkdir(parents=True)
        art = d / "weights.bin"
        _write_random(art, size, rep)
        with stashpoint.open(d / "store") as store:
            run = store.session("bench")
            os.sync()
            attach.append(timed(partial(run.checkpoint, artifacts={"w": art})))
            first = run.head
            assert first is not None
            s0 = _stored(store)
            with open(art, "r+b") as f:
                f.seek(size // 2)
                f.write(os.urandom(4 * MIB))
            os.sync()
            change.append(timed(partial(run.checkpoint, artifacts={"w": art})))
            s1 = _stored(store)
            delta_change.append(s1 - s0)
            with open(art, "r+b") as f:  # insert 100 bytes at 1 MiB: rewrite the tail shifted
                f.seek(MIB)
                rest = f.read()
                f.seek(MIB)
                f.write(os.urandom(100) + rest)
            del rest
            run.checkpoint(artifacts={"w": art})
            insert_cdc.append(_stored(store) - s1)
            out = d / "fetched.bin"
            os.sync()
            fetch.append(timed(partial(run.fetch_artifact, first.id, "w", out)))
            out.unlink()
        # The peer: the same edit to a workspace file (fixed 1 MiB chunks).
        ws = d / "ws"
        shutil.copyfile(art, ws / "weights.bin")
        with stashpoint.open(d / "store-ws") as store:
            run = store.session("bench", workspace=ws)
            run.checkpoint()
            s0 = _stored(store)
            with open(ws / "weights.bin", "r+b") as f:
                f.seek(MIB)
                rest = f.read()
                f.seek(MIB)
                f.write(os.urandom(100) + rest)
            del rest
            run.checkpoint()
            insert_fixed.append(_stored(store) - s0)
        shutil.rmtree(d)
    gib = size / (1 << 30)
    rows = [
        row(f"attach {gib:g} GiB (first)", median(attach), "s", samples=attach),
        row("attach again after a 4 MiB change", median(change), "s", samples=change),
        row(
            "stored after a 4 MiB change",
            median(delta_change) / MIB,
            "MiB",
            bar=8,
            bar_kind="abs",
            samples=[x / MIB for x in delta_change],
        ),
        row(
            "stored after inserting 100 B at 1 MiB",
            median(insert_cdc) / MIB,
            "MiB",
            peer=median(insert_fixed) / MIB,
            peer_name="workspace file (fixed 1 MiB chunks)",
            samples=[x / MIB for x in insert_cdc],
            peer_samples=[x / MIB for x in insert_fixed],
        ),
        row(f"fetch {gib:g} GiB (fsynced, verified)", median(fetch), "s", samples=fetch),
    ]
    return {
        "name": "artifacts",
        "rows": rows,
        "notes": [
            f"dense random {gib:g} GiB file (incompressible); FastCDC 512 KiB average chunks; "
            "SQLite store with a local blob directory, fsync on",
        ],
        "env": {"python": sys.version.split()[0]},
    }
