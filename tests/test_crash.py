"""Crash harness: ``kill -9`` of ``stashpoint snap`` and ``stashpoint rewind`` at random instants.

A crash at any instant leaves either the whole checkpoint or none of it visible;
afterwards the store opens without repair, ``verify`` passes, every acknowledged checkpoint is
there and loads, and an interrupted rewind is completed (or, if it had not started touching the
workspace, not applied at all) by the next command, with no temp files left behind.

Kill instants are drawn with a seeded RNG, uniformly over the measured duration of the operation
on this machine, so they land in start-up, scanning, blob writes, the commit and the restore
alike. Nothing here asserts on timing: a slower or faster machine only moves where kills land.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import stashpoint

from .conftest import STASHPOINT, Result, snapshot_tree

Tree = dict[str, tuple[str, int, bytes]]
Sp = Callable[..., Result]

SEED = 20261122
SNAP_KILLS = 140  # kills that land while the process runs (some instants fall after its exit)
REWIND_KILLS = 30
TMP_MARK = ".stashpoint-tmp-"
BIG = 1024 * 1024 + 256 * 1024


# -- the workspace -------------------------------------------------------------------------


def source_text(rng: random.Random, n: int) -> str:
    return "".join(
        f"def f{n}_{j}(x):\n    return x * {rng.randint(0, 10**9)}\n"
        for j in range(rng.randint(10, 60))
    )


@dataclass
class Project:
    """A source-like workspace that a seeded RNG keeps changing a little at a time."""

    root: Path
    rng: random.Random
    files: list[Path] = field(default_factory=list)
    created: int = 0

    def populate(self, n_files: int) -> None:
        for i in range(n_files):
            self.add(self.root / f"pkg{i % 16:02d}" / f"mod{i % 5}" / f"file{i:04d}.py")
        # > 1 MiB: stored as chunk files; step() rewrites the small last chunk.
        (self.root / "big.bin").write_bytes(self.rng.randbytes(BIG))
        (self.root / ".gitignore").write_text("node_modules/\n*.pyc\n")
        dep = self.root / "node_modules" / "dep"
        dep.mkdir(parents=True)
        (dep / "index.js").write_text("module.exports = 1\n")
        (self.root / "pkg00" / "cache.pyc").write_bytes(b"\0ignored")

    def add(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source_text(self.rng, len(self.files)))
        self.files.append(path)

    def edit(self, n: int) -> None:
        for path in self.rng.sample(self.files, n):
            with path.open("a") as f:
                f.write(f"# edit {self.rng.random()}\n")

    def step(self, i: int) -> None:
        """A few changes, as between two checkpoints of an agent run."""
        self.edit(4)
        for _ in range(2):
            self.created += 1
            self.add(self.root / f"new{self.created % 7}" / f"created{self.created}.py")
        victim = self.files.pop(self.rng.randrange(len(self.files)))
        victim.unlink()
        if i % 4 == 0:
            with (self.root / "big.bin").open("r+b") as f:
                f.seek(self.rng.randrange(1024 * 1024, BIG - 4096))
                f.write(self.rng.randbytes(4096))

    def big_change(self) -> None:
        """Many changed, created, deleted and re-moded files: a rewind has lots to do."""
        self.edit(len(self.files) * 3 // 5)
        for path in self.rng.sample(self.files, 100):
            self.files.remove(path)
            path.unlink()
        for path in self.rng.sample(self.files, 50):
            path.chmod(0o755)
        for i in range(100):
            self.add(self.root / f"added{i % 4}" / f"sub{i % 3}" / f"added{i}.py")
        with (self.root / "big.bin").open("r+b") as f:
            f.write(self.rng.randbytes(4096))


# -- running and killing the CLI -----------------------------------------------------------


def cli_env(home: Path) -> dict[str, str]:
    """The environment the ``sp`` fixture uses, for processes this file has to kill."""
    env = dict(os.environ)
    env.pop("STASHPOINT_STORE", None)
    env.pop("STASHPOINT_SESSION", None)
    env["HOME"] = str(home)
    return env


def run_killed(args: list[str], cwd: Path, env: dict[str, str], delay: float) -> tuple[int, str]:
    """Start ``stashpoint ARGS``, SIGKILL it after ``delay`` seconds; (exit code, stdout).

    If it finished first, the exit code is its own; otherwise it is ``-SIGKILL``.
    """
    proc = subprocess.Popen(
        [*STASHPOINT, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, -signal.SIGKILL), f"exit {proc.returncode}:\n{err}"
    return proc.returncode, out


NARROW = 0.8
"""Factor of the kill window after a run that finished before its kill."""


def measure(run: Callable[[], object], times: int, reset: Callable[[], object] = list) -> float:
    """Longest wall time of ``times`` runs of ``run`` (``reset`` runs untimed in between):
    kill delays are drawn uniformly from [0, this), so they cover a whole run, exit included.
    The loops narrow it (:data:`NARROW`) each time a run finishes before its kill: measured
    while the machine was busier, it would let most runs finish first."""
    longest = 0.0
    for _ in range(times):
        start = time.monotonic()
        run()
        longest = max(longest, time.monotonic() - start)
        reset()
    return longest


def cli_json(sp: Sp, cwd: Path, *args: str) -> Any:
    return json.loads(sp(*args, "--json", cwd=cwd).out)


def temp_files(root: Path, *, store: bool = True) -> list[Path]:
    """Temp files under ``root``, in the store (``.stashpoint/``) too unless ``store=False``."""
    found = sorted(root.rglob(f"{TMP_MARK}*"))
    if not store:
        found = [p for p in found if ".stashpoint" not in p.relative_to(root).parts]
    return found


def assert_tree_in(actual: Tree, allowed: dict[str, Tree], what: str) -> None:
    """``actual`` equals one of the ``allowed`` trees exactly (a short report if not)."""
    if any(actual == tree for tree in allowed.values()):
        return
    report = []
    for name, tree in allowed.items():
        paths = sorted(p for p in actual.keys() | tree.keys() if actual.get(p) != tree.get(p))
        report.append(f"{len(paths)} path(s) differ from {name}, e.g. {paths[:8]}")
    raise AssertionError(f"{what}: " + "; ".join(report))


def run_together(env: dict[str, str], cwd: Path, *commands: list[str]) -> list[Any]:
    """Run read-only commands side by side (two cores: the harness stays within its time);
    each must exit 0 and print JSON."""
    procs = [
        subprocess.Popen(
            [*STASHPOINT, *args, "--json"],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in commands
    ]
    out = []
    for args, proc in zip(commands, procs, strict=True):
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, (
            f"stashpoint {' '.join(args)} exited {proc.returncode}:\n{stderr}"
        )
        out.append(json.loads(stdout))
    return out


def check_store(sp: Sp, env: dict[str, str], ws: Path, acked: list[str], loaded: set[str]) -> None:
    """The store after a crash: verifies, keeps every acknowledged checkpoint, shows no partial
    one. ``loaded`` holds the ids already opened with ``show``; new ones are opened now."""
    report, entries = run_together(env, ws, ["verify"], ["log"])  # verify exits 2 on damage
    assert report["ok"], report
    ids = {e["id"] for e in entries}
    assert len(ids) == len(entries) == report["checkpoints"]
    missing = [i for i in acked if i not in ids]
    assert not missing, f"acknowledged checkpoints lost: {missing}"
    for e in entries:
        assert e["parent"] is None or e["parent"] in ids, f"{e['id']} has a dangling parent"
        assert e["workspace"] is not None, f"{e['id']} has no workspace"
    for ident in sorted(ids - loaded):
        shown = cli_json(sp, ws, "show", ident)
        assert shown["id"] == ident and shown["manifest"]["tree"], shown
        loaded.add(ident)
    assert not temp_files(ws), f"left after verify: {temp_files(ws)}"


# -- the harnesses -------------------------------------------------------------------------


@pytest.mark.slow
def test_snap_killed_at_random_instants_loses_nothing_acknowledged(sp: Sp, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    ws = tmp_path / "ws"
    ws.mkdir()
    project = Project(ws, rng)
    project.populate(400)
    env = cli_env(tmp_path)
    acked = [cli_json(sp, ws, "snap", "-m", "initial")["id"]]
    loaded: set[str] = set()

    def one_snap() -> None:
        project.step(0)
        acked.append(cli_json(sp, ws, "snap")["id"])

    duration = measure(one_snap, 5)
    completed = killed = 0
    for i in range(3 * SNAP_KILLS):
        if killed == SNAP_KILLS:
            break
        project.step(i)
        code, out = run_killed(
            ["snap", "--json", "-m", f"try {i}"], ws, env, rng.uniform(0, duration)
        )
        if code == 0:
            acked.append(json.loads(out)["id"])
            completed += 1
            duration *= NARROW
        else:
            killed += 1
        if i % 20 == 19:  # the store accepts new checkpoints right after a crash
            acked.append(cli_json(sp, ws, "snap", "-m", f"after {i}")["id"])
        check_store(sp, env, ws, acked, loaded)

    assert killed == SNAP_KILLS, f"only {killed} of {i + 1} snaps were killed mid-way"
    print(f"snap kills: {killed} killed, {completed} completed first; {len(acked)} acknowledged")
    # The newest acknowledged checkpoint restores the workspace exactly as it was snapshotted.
    before = snapshot_tree(ws)
    newest = cli_json(sp, ws, "snap", "-m", "final")["id"]
    project.step(1)
    cli_json(sp, ws, "rewind", newest)
    assert_tree_in(snapshot_tree(ws), {"the final snapshot": before}, "after rewind")
    check_store(sp, env, ws, [*acked, newest], loaded)


@pytest.mark.slow
def test_rewind_killed_at_random_instants_is_completed_by_the_next_command(
    sp: Sp, tmp_path: Path
) -> None:
    rng = random.Random(SEED + 1)
    ws = tmp_path / "ws"
    ws.mkdir()
    project = Project(ws, rng)
    project.populate(1000)
    env = cli_env(tmp_path)
    a = cli_json(sp, ws, "snap", "-m", "A")
    tree_a = snapshot_tree(ws)
    project.big_change()
    b = cli_json(sp, ws, "snap", "-m", "B")
    tree_b = snapshot_tree(ws)

    duration = measure(
        lambda: sp("rewind", a["id"], cwd=ws), 3, reset=lambda: sp("rewind", b["id"], cwd=ws)
    )
    assert_tree_in(snapshot_tree(ws), {"B": tree_b}, "after measuring")

    next_commands: list[tuple[str, ...]] = [
        ("log",),
        ("show", "HEAD"),
        ("snap", "-m", "after a crash"),
        ("rewind", b["id"]),
    ]
    outcomes = {"not started": 0, "partial": 0, "restored": 0}
    killed = 0
    for i in range(3 * REWIND_KILLS):
        if killed == REWIND_KILLS:
            break
        code, _out = run_killed(["rewind", a["id"], "--json"], ws, env, rng.uniform(0, duration))
        killed += code != 0
        duration *= NARROW if code == 0 else 1
        mid = snapshot_tree(ws)
        # The journal is written before the workspace is touched: once anything changed, the
        # rewind must be completed; if nothing changed it may or may not have been journalled.
        started = code == 0 or mid != tree_b
        if code == 0:
            assert_tree_in(mid, {"A": tree_a}, f"kill {i}: after an acknowledged rewind")
        outcomes["restored" if mid == tree_a else "partial" if started else "not started"] += 1

        command = next_commands[i % len(next_commands)]
        res = cli_json(sp, ws, *command)
        allowed = {"A": tree_a} if started else {"A": tree_a, "B": tree_b}
        if command[0] == "rewind":
            # Its safety checkpoint shows what the interrupted rewind had been completed to.
            trees = {a["workspace"]["tree"]: "A", b["workspace"]["tree"]: "B"}
            got = trees.get(res["safety"]["workspace"]["tree"], "a half-done rewind")
            assert got in allowed, f"kill {i}: {command} found {got}, expected {set(allowed)}"
        else:
            assert_tree_in(snapshot_tree(ws), allowed, f"kill {i}: after {command}")
            if command[0] == "show" and started:
                assert res["id"] == a["id"], f"kill {i}: HEAD is not the rewind target"
            sp("rewind", b["id"], cwd=ws)
        assert_tree_in(snapshot_tree(ws), {"B": tree_b}, f"kill {i}: after resetting to B")
        assert not temp_files(ws, store=False), f"kill {i}: {temp_files(ws)}"
        sp("verify", cwd=ws)
        assert not temp_files(ws), f"kill {i}: left after verify: {temp_files(ws)}"

    assert killed == REWIND_KILLS, f"only {killed} of {i + 1} rewinds were killed mid-way"
    print(f"rewind kills: {killed} killed; workspace right after the kill: {outcomes}")


IMPORT_KILLS = 40


@pytest.mark.slow
def test_import_killed_at_random_instants_leaves_a_store_that_verifies(
    sp: Sp, tmp_path: Path
) -> None:
    """``kill -9`` of ``stashpoint import`` at random instants. The destination then
    opens without repair, verifies, holds no temp files, only records of the source and no
    head but the source's own; running the same import again completes it, with the source's
    ids and heads."""
    rng = random.Random(SEED + 2)
    ws = tmp_path / "ws"
    ws.mkdir()
    project = Project(ws, rng)
    project.populate(300)
    for i in range(4):
        cli_json(sp, ws, "snap", "-m", f"s{i}")
        project.step(i)
    source = [e["id"] for e in cli_json(sp, ws, "log")]
    bundle = tmp_path / "run.spb"
    sp("export", "-o", str(bundle), cwd=ws)
    env = cli_env(tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()

    def fresh() -> None:
        import shutil

        shutil.rmtree(dest / ".stashpoint", ignore_errors=True)

    duration = measure(lambda: sp("import", str(bundle), cwd=dest), 3, reset=fresh)
    killed = completed = 0
    for _i in range(3 * IMPORT_KILLS):
        if killed == IMPORT_KILLS:
            break
        fresh()
        code, _out = run_killed(["import", str(bundle)], dest, env, rng.uniform(0, duration))
        killed += code != 0
        completed += code == 0
        duration *= NARROW if code == 0 else 1
        if (dest / ".stashpoint").exists():
            report = cli_json(sp, dest, "verify")
            assert report["ok"], report
            with stashpoint.open(dest / ".stashpoint") as store:
                branches = store.meta.branches("main")
                present = {row.id for row in store.meta.list_checkpoints("main")}
            # Records land first, heads last: a head, if any, is the source's own.
            assert branches in ({}, {"main": source[0]}), branches
            assert present <= set(source), present - set(source)
        assert not temp_files(dest), f"left behind: {temp_files(dest)}"
        sp("import", str(bundle), cwd=dest)  # the same import again completes it
        assert [e["id"] for e in cli_json(sp, dest, "log")] == source
        assert cli_json(sp, dest, "verify")["ok"]
    assert killed == IMPORT_KILLS, f"only {killed} imports were killed mid-way"
    print(f"import kills: {killed} killed, {completed} completed first")
