"""Tree search: 1,000 trials of "fork, change 1-10 files, checkpoint, roll back" from one node.

The loop of test-time tree search and RL rollouts, on the 10k-file workspace of
bench_workspace: every trial starts from the same checkpoint (``Session.trial``), changes
1-10 files (mostly edits, some files created and deleted), checkpoints what it reached (the
new node a search records) and rolls back. In-process, one open store, as a search loop
runs it.

- stashpoint in watch mode (the mode for this loop: an inotify watcher tells which
  directories changed) for every trial; in scan mode (no watcher: every rollback's safety
  checkpoint stats all 10k files) for a few;
- half the trials roll back right after their checkpoint (nothing changed since: the
  rollback reuses it as its undo point), half roll back without one (the rollback records
  the trial's state first: a safety checkpoint). Both are reported;
- peers, fewer trials (each costs a subprocess or a directory walk): a shadow git repository
  (``add -A && commit``, then ``reset --hard`` + ``clean -fd``, run as subprocesses like
  bench_workspace's peers) and a plain directory copy (``rsync -a --delete``, the snapshot
  hard-linking unchanged files to the node's copy; ``shutil.copytree`` where there is no rsync);
- every peer and stashpoint see the same changes (same seeds); the workspace is checked
  against the node (fingerprint of every path, mode and content) after every 100th trial
  and at the end of each phase.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import stashpoint
from _common import Config, ShadowGit, git_env, git_version, median, row, timed
from workload import Workspace, fingerprint, make_workspace, mutate_for_rewind

BAR_CHECKPOINT_MS = 5.0
BAR_ROLLBACK_MS = 10.0
DELTABOX = {"checkpoint": 10.83, "rollback": 1.86}
"""Published by DeltaBox (arXiv:2605.22781v2, abstract): checkpoint work 10.83 ms (hidden
under inference), rollback 1.86 ms, for the whole sandbox (files and processes), with OS
support (a layered file system, CRIU). Quoted, not measured here."""


def _p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.9 * len(s)))] if s else float("nan")


def _change(ws: Workspace, seed: int) -> None:
    """1-10 files: edits, and from 5 up one created and one deleted per 5."""
    k = random.Random(seed).randint(1, 10)
    extra = k // 5
    mutate_for_rewind(ws, seed=seed, modified=k - 2 * extra, created=extra, deleted=extra)


class _Phase:
    def __init__(self, ws: Workspace, want: str) -> None:
        self.ws, self.want = ws, want
        self.samples: dict[str, list[float]] = {}

    def add(self, key: str, seconds: float) -> None:
        self.samples.setdefault(key, []).append(seconds * 1000)

    def measure(self, key: str, fn: Callable[[], object]) -> None:
        """Wall and CPU time (this process, all threads) of ``fn()``: on a loaded machine
        the CPU time is what stashpoint itself spent, the wall time adds the fsyncs' wait
        and everybody else's turn."""
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        self.add(key, time.perf_counter() - t0)
        self.add(f"cpu {key}", time.process_time() - c0)

    def check(self, what: str) -> None:
        if fingerprint(self.ws.root) != self.want:
            raise AssertionError(f"{what}: the workspace is not the node's tree after rollback")


def _stashpoint(p: _Phase, store_dir: Path, trials: int, *, watch: bool, tag: str) -> None:
    with stashpoint.open(store_dir) as store:
        run = store.session(f"tree-{tag}", workspace=p.ws.root, watch=watch)
        node = run.checkpoint(message="node")
        for i in range(trials):
            t = run.trial(node)
            p.measure(f"{tag}/fork", t.__enter__)
            try:
                _change(p.ws, seed=10_000 + i)
                if i % 2 == 0:
                    p.measure(f"{tag}/checkpoint", lambda: run.checkpoint(message="child"))
                    p.measure(f"{tag}/rollback", t.rollback)
                else:
                    p.measure(f"{tag}/rollback+safety", t.rollback)
            finally:
                t.__exit__(None, None, None)
            if i % 100 == 99:
                p.check(f"stashpoint {tag} trial {i}")
        p.check(f"stashpoint {tag}")


def _git(p: _Phase, tmp: Path, trials: int) -> None:
    git = ShadowGit(tmp / "git", p.ws.root, git_env(tmp))
    git.init()
    git.commit()
    node = git.head()
    for i in range(trials):
        _change(p.ws, seed=10_000 + i)
        p.add("git/checkpoint", timed(git.commit))
        p.add("git/rollback", timed(lambda: git.restore(node, "reset")))
    p.check("git")
    shutil.rmtree(git.git_dir)


def _copy(p: _Phase, tmp: Path, trials: int) -> str:
    """A node is a copy of the directory; rollback copies it back over the workspace."""
    root, node = p.ws.root, tmp / "node"
    rsync = shutil.which("rsync")
    if rsync is not None:
        subprocess.run([rsync, "-a", f"{root}/", f"{node}/"], check=True)
        name = "rsync"

        def checkpoint(dest: Path) -> None:
            cmd = [rsync, "-a", "--delete", f"--link-dest={node}", f"{root}/", f"{dest}/"]
            subprocess.run(cmd, check=True)

        def rollback() -> None:
            subprocess.run([rsync, "-a", "--delete", f"{node}/", f"{root}/"], check=True)

    else:
        shutil.copytree(root, node, symlinks=True)
        name = "copytree"

        def checkpoint(dest: Path) -> None:
            shutil.copytree(root, dest, symlinks=True)

        def rollback() -> None:
            shutil.rmtree(root)
            shutil.copytree(node, root, symlinks=True)

    for i in range(trials):
        _change(p.ws, seed=10_000 + i)
        dest = tmp / f"child-{i}"
        p.add("copy/checkpoint", timed(lambda d=dest: checkpoint(d)))
        p.add("copy/rollback", timed(rollback))
        shutil.rmtree(dest)
    p.check(name)
    shutil.rmtree(node)
    return name


def _ms_row(
    fig: str, xs: list[float], peer: list[float] | None, name: str, bar: float | None
) -> dict[str, Any]:
    return row(
        fig,
        median(xs),
        "ms",
        peer=median(peer) if peer else None,
        peer_name=name,
        bar=bar,
        bar_kind="abs",
        samples=xs,
        peer_samples=peer or [],
    )


def run(cfg: Config) -> dict[str, Any]:
    trials = cfg.steps  # 1,000 (200 with --quick)
    peer_trials = max(10, min(trials, 10 * cfg.reps))
    tmp = Path(tempfile.mkdtemp(prefix="sp-bench-tree-", dir=cfg.tmp))
    try:
        t0 = time.perf_counter()
        ws = make_workspace(tmp / "ws", cfg.files)
        gen = time.perf_counter() - t0
        p = _Phase(ws, fingerprint(ws.root))
        phases: list[tuple[str, Callable[[], object]]] = [
            ("watch", lambda: _stashpoint(p, tmp / "sp-w", trials, watch=True, tag="watch")),
            ("scan", lambda: _stashpoint(p, tmp / "sp-s", peer_trials, watch=False, tag="scan")),
            ("git", lambda: _git(p, tmp, peer_trials)),
            ("copy", lambda: _copy(p, tmp, peer_trials)),
        ]
        copy_name = "copy"
        for name, fn in phases:
            os.sync()
            got = fn()
            if name == "copy":
                copy_name = str(got)
    finally:
        if not cfg.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    s = p.samples
    rows = []
    for peer, label in (("git", "git"), ("copy", copy_name)):
        rows.append(
            _ms_row(
                "checkpoint after 1-10 changed [watch]",
                s["watch/checkpoint"],
                s[f"{peer}/checkpoint"],
                label,
                BAR_CHECKPOINT_MS if peer == "git" else None,
            )
        )
        rows.append(
            _ms_row(
                "rollback, 1-10 changed [watch]",
                s["watch/rollback"],
                s[f"{peer}/rollback"],
                label,
                BAR_ROLLBACK_MS if peer == "git" else None,
            )
        )
    rows.append(
        _ms_row(
            "rollback + its safety checkpoint [watch]",
            s["watch/rollback+safety"],
            s["git/rollback"],
            "git",
            BAR_ROLLBACK_MS,
        )
    )
    rows.append(_ms_row("fork (enter a trial) [watch]", s["watch/fork"], None, "", None))
    for key, label in (
        ("scan/checkpoint", "checkpoint [scan mode]"),
        ("scan/rollback", "rollback [scan mode]"),
        ("scan/rollback+safety", "rollback + safety checkpoint [scan mode]"),
    ):
        rows.append(_ms_row(label, s[key], None, "", None))
    for key in ("watch/checkpoint", "watch/rollback", "watch/rollback+safety", "watch/fork"):
        rows.append(_ms_row(f"CPU time of {key}", s[f"cpu {key}"], None, "", None))
    for key in sorted(k for k in s if not k.startswith("cpu ")):
        rows.append(row(f"p90 {key}", _p90(s[key]), "ms"))
    notes = [
        f"workspace: {ws.files:,} tracked files, {ws.total_bytes / 2**20:.1f} MiB (generated in "
        f"{gen:.1f} s); one node, every trial forks from it",
        f"trials: stashpoint watch mode x{trials} (half with a checkpoint before the rollback, "
        f"half without); scan mode, git and {copy_name} x{peer_trials}",
        "stashpoint in-process, one open store, fsync per commit (SQLite synchronous=FULL); "
        "git as shipped (no fsync), each command a subprocess; "
        f"{copy_name}: checkpoint = a copy of the directory"
        + (" hard-linking unchanged files to the node's copy" if copy_name == "rsync" else "")
        + ", rollback = the node's copy synced back over the workspace",
        "a rollback after a checkpoint reuses it as its undo point (nothing changed since); "
        "'rollback + its safety checkpoint' first records the trial's state (scan and commit)",
        f"DeltaBox (arXiv:2605.22781v2, quoted, not measured here): checkpoint "
        f"{DELTABOX['checkpoint']} ms (hidden under inference), rollback "
        f"{DELTABOX['rollback']} ms, whole sandbox including processes, with a layered file "
        "system and CRIU",
        "bars: median checkpoint <= 5 ms, rollback <= 10 ms (absolute, wall clock); 'CPU time' "
        "rows: process_time of the same calls (all of this process's threads), which a loaded "
        "machine inflates far less than wall time; a rollback commits 3 fsynced transactions "
        "(restore journal, branch head, journal cleared), one more with its safety checkpoint",
        "every phase checked: fingerprint of the workspace equal to the node's every 100 trials "
        "and at its end",
    ]
    return {
        "name": "treesearch",
        "rows": rows,
        "notes": notes,
        "env": {"git": ".".join(map(str, git_version())), "python": sys.version.split()[0]},
    }


if __name__ == "__main__":
    from run_all import main

    main(["--only", "treesearch", *sys.argv[1:]])
