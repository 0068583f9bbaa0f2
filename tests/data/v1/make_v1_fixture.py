"""Make the format-v1 fixtures in this directory with the code that defined format v1.

Format v1 is what stashpoint wrote at commit 71a6899 (SQLite schema 3: heads and labels
without an ``auth`` column, no format marker). The upgrade tests need stores that code really
wrote, not a guess at its layout, so this script runs *that* code::

    git archive 71a6899 | tar -x -C /tmp/v1src
    PYTHONPATH=/tmp/v1src/src python tests/data/v1/make_v1_fixture.py tests/data/v1

It writes, next to itself:

- ``plain/``: an unkeyed SQLite store (``store.db`` + ``blobs/``): two sessions, a fork,
  labels, a conversation, workspace files (one large enough to be chunked) and an artifact;
- ``keyed/``: the same history in a store whose hash chain is keyed with :data:`KEY`;
- ``files/``: the same history in a file store (``file://``: JSON documents and blob files);
- ``encrypted/``: a small history in a store encrypted with :data:`ENCRYPTION_KEY`;
- ``empty/``: a SQLite store opened once and never written (the suites' starting point);
- ``main.spb``: a bundle of the plain store's ``main`` session.

Ids and times differ on every run; the tests only rely on what the stores hold.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import stashpoint

STORES = ("plain", "keyed", "files", "encrypted", "empty")
KEY = bytes(range(32))
"""The integrity key of ``keyed/`` (a test key, published here on purpose)."""
ENCRYPTION_KEY = bytes(range(1, 33))
"""The encryption key of ``encrypted/`` (a test key too)."""


def encrypted(store_dir: Path) -> None:
    with stashpoint.open(store_dir, encryption_key=ENCRYPTION_KEY) as store:
        s = store.session("main")
        s.checkpoint({"messages": [{"role": "user", "content": "secret plan"}]}, label="a")
        s.checkpoint(append_messages=[{"role": "assistant", "content": "noted"}])


def history(store_dir: Path | str, work: Path, key: bytes | None) -> None:
    ws = work / "ws"
    ws.mkdir(parents=True)
    (ws / "app.py").write_text("print('hello')\n")
    (ws / "notes.txt").write_text("first notes\n")
    # Large enough to be stored in content-defined chunks, small enough to check in: repetitive.
    (ws / "data.bin").write_bytes(b"0123456789abcdef" * 70_000)
    artifact = work / "weights.bin"
    artifact.write_bytes(b"w" * 5000)
    with stashpoint.open(store_dir, key=key) as store:
        s = store.session("main", workspace=ws)
        messages = [{"role": "user", "content": "fix the bug"}]
        first = s.checkpoint({"messages": messages, "step": 1}, message="start", label="start")
        (ws / "app.py").write_text("print('hello, world')\n")
        messages = [*messages, {"role": "assistant", "content": "edited app.py"}]
        s.checkpoint(
            {"messages": messages, "step": 2},
            message="edit",
            artifacts={"weights": artifact},
        )
        (ws / "notes.txt").write_text("second notes\n")
        s.checkpoint(append_messages=[{"role": "user", "content": "thanks"}], message="more")
        s.label("HEAD", "done")
        alt = s.fork(first.id, "alt", into=work / "alt")
        alt.checkpoint({"messages": [{"role": "user", "content": "other way"}], "step": 9})
        other = store.session("other")
        other.checkpoint({"n": 1}, message="state only")
        other.checkpoint({"n": 2})


def main() -> None:
    for var in [v for v in os.environ if v.startswith("STASHPOINT_")]:
        del os.environ[var]  # no key, store or durability from the caller's environment
    out = Path(sys.argv[1]).resolve()
    scratch = out / "_scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    for name in STORES:
        shutil.rmtree(out / name, ignore_errors=True)
    (out / "main.spb").unlink(missing_ok=True)
    try:
        history(out / "plain", scratch / "plain", None)
        history(out / "keyed", scratch / "keyed", KEY)
        history(f"file://{out / 'files'}", scratch / "files", None)
        encrypted(out / "encrypted")
        stashpoint.open(out / "empty").close()
        from stashpoint.bundle import export_bundle

        with stashpoint.open(out / "plain") as store:
            export_bundle(store, out / "main.spb", session="main")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name in STORES:
        # Only the store itself: caches, lock files and the store's "never commit me"
        # .gitignore are made again by whoever opens a copy.
        for sub in ("cache", "locks"):
            shutil.rmtree(out / name / sub, ignore_errors=True)
        for leftover in ("store.db-writers", "store.db-wal", "store.db-shm", ".gitignore"):
            (out / name / leftover).unlink(missing_ok=True)
        (out / name / "blobs" / "gc.lock").unlink(missing_ok=True)
        (out / name / "lock").unlink(missing_ok=True)  # the file store's


if __name__ == "__main__":
    main()
