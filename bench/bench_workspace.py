"""Workspace snapshots and rewind, stashpoint vs a shadow git repository.

How the comparison is kept fair and honest:

- Both tools see exactly the same changes: each round edits K files, stashpoint snapshots at
  once (as an agent hook would), then git commits the same edit.
- The previous stashpoint snapshot is at least 0.1 s old when a round starts (``Gap``), never
  older on purpose. Files edited right before a snapshot fall in the stat cache's racy
  window, so stashpoint re-hashes them once more at the next snapshot: that is the steady state
  of a hook, and the "files read" row shows it.
- ``os.sync()`` before every timed operation, so no one pays for an earlier writer's writeback;
  the page cache is warm for everyone (the workspace was just written).
- Durability differs by default: stashpoint fsyncs every checkpoint (SQLite ``synchronous=FULL``,
  fsynced chunk files); git fsyncs nothing a commit writes. So git runs twice: as it ships, and
  with ``core.fsync=all`` + ``core.fsyncMethod=batch`` (equal durability). Bars apply to both.
- Each git sample is a subprocess (that is the only way to drive git); stashpoint is measured
  in-process (API) and as the ``stashpoint`` command (CLI: interpreter start included).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import stashpoint
from _common import (
    GIT_RESTORES,
    Config,
    Gap,
    ShadowGit,
    cli_env,
    git_env,
    git_version,
    median,
    row,
    served_cmd,
    stashpoint_cmd,
    timed,
    warm_bytecode,
)
from workload import Workspace, count_files, fingerprint, make_workspace, modify_files
from workload import mutate_for_rewind as mutate

BARS = {"first": 0.15, "inc1": 0.75, "inc100": 0.5, "rewind": 0.75}
WATCH_BARS = {"inc1": 0.15, "inc100": 0.5, "rewind": 0.75}  # watch mode, 1 changed
DAEMON_BARS = {"inc1": 0.5, "inc100": 0.5, "rewind": 0.75}  # the CLI served by `watch start`
GIT, GIT_FS = "git", "git fsync=all"


class _Bench:
    def __init__(self, cfg: Config, tmp: Path) -> None:
        self.cfg = cfg
        self.tmp = tmp
        self.ws: Workspace = make_workspace(tmp / "ws", cfg.files)
        self.root = self.ws.root
        self.env = git_env(tmp)
        self.sp = stashpoint_cmd()
        self.cli_env = cli_env()
        warm_bytecode(self.cli_env)
        # The CLI rows run without a daemon; the daemon rows through the entry point a
        # console script installed from this tree runs (stashpoint.__main__:main).
        self.daemon_env = dict(self.cli_env)
        self.cli_env["STASHPOINT_NO_DAEMON"] = "1"
        self.served = served_cmd(tmp)
        self.served_kind = _served_kind(self.served)
        # A stashpoint without the watch daemon (an older tree compared against this one)
        # runs every row but the daemon's.
        self.has_daemon = importlib.util.find_spec("stashpoint.watchd") is not None
        self.gap = Gap(0.1)
        self.samples: dict[str, list[float]] = {}
        self.reads: dict[str, list[int]] = {}
        self.seed = 1000

    def add(self, key: str, seconds: float) -> None:
        self.samples.setdefault(key, []).append(seconds)

    def next_seed(self) -> int:
        self.seed += 1
        return self.seed

    def cli(self, store: Path, *args: str) -> None:
        cmd = [*self.sp, "--store", str(store), "-C", str(self.root), *args]
        subprocess.run(cmd, check=True, capture_output=True, env=self.cli_env)

    def daemon(self, store: Path, *args: str) -> str:
        cmd = [*self.served, "--store", str(store), "-C", str(self.root), *args]
        return subprocess.run(
            cmd, check=True, capture_output=True, env=self.daemon_env, text=True
        ).stdout

    def daemon_requests(self, store: Path) -> int:
        """Requests the daemon served so far (a row that fell back would not count)."""
        import json

        status = json.loads(self.daemon(store, "watch", "status", "--json"))
        if not status.get("running"):
            raise AssertionError("the watch daemon is not running")
        return int(status["requests"])

    def git(self, name: str) -> ShadowGit:
        return ShadowGit(self.tmp / name, self.root, self.env)

    # -- (a) first snapshot -------------------------------------------------------------
    def first(self) -> tuple[Path, ShadowGit]:
        last = self.cfg.reps_first - 1
        for rep in range(self.cfg.reps_first):
            store, cli_store = self.tmp / f"sp-{rep}", self.tmp / f"spcli-{rep}"
            gits = {GIT: self.git(f"git-{rep}"), GIT_FS: self.git(f"gitfs-{rep}")}
            for g in gits.values():
                g.init()

            def api(store: Path = store) -> None:
                with stashpoint.open(store) as s:
                    s.session("bench", workspace=self.root).checkpoint(message="first")

            jobs: list[tuple[str, Callable[[], None]]] = [
                ("first/api", api),
                ("first/cli", lambda d=cli_store: self.cli(d, "--session", "bench", "snap")),
                ("first/" + GIT, gits[GIT].commit),
                ("first/" + GIT_FS, lambda g=gits[GIT_FS]: g.commit(fsync=True)),
            ]
            for key, fn in jobs[rep % 4 :] + jobs[: rep % 4]:  # rotate who goes first
                os.sync()
                self.add(key, timed(fn))
            # Keep the last stashpoint store and git repo for the incremental rounds.
            drop = [cli_store, gits[GIT_FS].git_dir]
            if rep != last:
                drop += [store, gits[GIT].git_dir]
            for path in drop:
                shutil.rmtree(path)
        self.gap.mark()
        return self.tmp / f"sp-{last}", self.git(f"git-{last}")

    # -- (b, c) incremental -------------------------------------------------------------
    def incremental(self, store_dir: Path, git: ShadowGit) -> None:
        store = stashpoint.open(store_dir)
        run = store.session("bench", workspace=self.root)
        reads = _count_reads(run)
        # Watch mode: an in-process inotify watcher; its own session, baseline untimed.
        wrun = store.session("bench-watch", workspace=self.root, watch=True)
        wrun.checkpoint(message="watch baseline")
        # All API rounds back to back (the steady state of an in-process agent: files edited
        # just before the previous snapshot were racy then and are re-read now), then all CLI
        # rounds. Each git durability gets every other round.
        n = 2 * self.cfg.reps
        rounds = [("api", i % 2 == 1) for i in range(n)] + [("cli", i % 2 == 0) for i in range(n)]
        rounds += [("watch", i % 2 == 1) for i in range(n)]
        if self.has_daemon:
            rounds += [("daemon", i % 2 == 0) for i in range(n)]
            self.daemon(store_dir, "watch", "start")  # untimed: its first full scan
            served = self.daemon_requests(store_dir)
        for k in (1, 100):
            for iface, fsync in rounds:
                self.gap.wait()
                os.sync()
                modify_files(self.ws, k, seed=self.next_seed())
                if iface == "api":
                    self.add(f"inc{k}/api", timed(lambda: run.checkpoint(message="inc")))
                    self.reads.setdefault(f"inc{k}", []).append(reads[-1])
                elif iface == "watch":
                    self.add(f"inc{k}/watch", timed(lambda: wrun.checkpoint(message="inc")))
                elif iface == "daemon":
                    self.add(f"inc{k}/daemon", timed(lambda: self.daemon(store_dir, "snap")))
                else:
                    self.add(f"inc{k}/cli", timed(lambda: self.cli(store_dir, "snap")))
                self.gap.mark()
                peer = GIT_FS if fsync else GIT
                took = timed(lambda f=fsync: git.commit(fsync=f))
                self.add(f"inc{k}/{peer}", took)
                self.add(f"inc{k}/{peer}@{iface}", took)  # the git rounds beside this one's
        if self.has_daemon and self.daemon_requests(store_dir) != served + 2 * n:
            raise AssertionError("a daemon row was not served by the daemon")
        store.close()

    # -- (d) rewind ---------------------------------------------------------------------
    def rewind(self, store_dir: Path, git: ShadowGit) -> dict[str, Any]:
        store = stashpoint.open(store_dir)
        self.gap.wait()
        base = store.session("bench", workspace=self.root).checkpoint(message="base").id
        wsess = store.session("bench-watch", workspace=self.root, watch=True)
        wbase = wsess.checkpoint(message="base").id  # same tree as base
        self.gap.mark()
        git.commit()
        commit = git.head()
        want, n_ignored = fingerprint(self.root), count_files(self.root / "node_modules")
        seed = self.next_seed()
        changes = mutate(self.ws, seed=seed)
        assert fingerprint(self.root) != want
        git.restore(commit, "checkout")
        assert fingerprint(self.root) == want

        sessions: list[Any] = []

        def api_prepare() -> None:  # a fresh session (untimed): the CLI moved the head meanwhile
            sessions[:] = [store.session("bench", workspace=self.root)]

        def api() -> None:
            sessions[0].rewind(base)

        def cli() -> None:
            self.cli(store_dir, "--session", "bench", "rewind", base)

        def daemon() -> None:
            self.daemon(store_dir, "--session", "bench", "rewind", base)

        jobs: dict[str, tuple[Callable[[], None], Callable[[], None] | None]] = {
            "rewind/api": (api, api_prepare),
            "rewind/cli": (cli, _nothing),
            "rewind/watch": (lambda: wsess.rewind(wbase), _nothing),
        }
        if self.has_daemon:
            jobs["rewind/daemon"] = (daemon, _nothing)
            served = self.daemon_requests(store_dir)
        for how in GIT_RESTORES:
            for fsync in (False, True):
                key = f"rewind/{GIT_FS if fsync else GIT} {how}"
                jobs[key] = (lambda h=how, f=fsync: git.restore(commit, h, fsync=f), None)
        for rep in range(self.cfg.reps):
            order = list(jobs.items())
            order = order[rep % len(order) :] + order[: rep % len(order)]
            for key, (fn, prep) in order:
                self._one_rewind(key, fn, prep, seed, want, n_ignored)
        best = min(GIT_RESTORES, key=lambda h: median(self.samples[f"rewind/{GIT} {h}"]))
        # After a safety commit the new files are tracked, so `checkout C -- .` would keep them:
        # only reset / read-tree (which drop index entries missing from C) are correct here.
        safe = min(("reset", "read-tree"), key=lambda h: median(self.samples[f"rewind/{GIT} {h}"]))

        def git_with_safety() -> None:  # what stashpoint does: snapshot first, then restore
            git.commit()
            git.restore(commit, safe)

        for _rep in range(self.cfg.reps):
            self._one_rewind(
                "rewind/git commit+restore", git_with_safety, None, seed, want, n_ignored
            )
        if self.has_daemon:
            if self.daemon_requests(store_dir) != served + self.cfg.reps:
                raise AssertionError("a daemon rewind was not served by the daemon")
            self.daemon(store_dir, "watch", "stop")
        store.close()
        return {
            "best_git_restore": GIT_RESTORES[best],
            "safety_restore": GIT_RESTORES[safe],
            "changes": {k: len(v) for k, v in changes.items()},
        }

    def _one_rewind(
        self,
        key: str,
        fn: Callable[[], None],
        prep: Callable[[], None] | None,
        seed: int,
        want: str,
        n_ignored: int,
    ) -> None:
        """``prep`` is None for git; for stashpoint it runs untimed and the snapshot gap holds."""
        if prep is not None:
            self.gap.wait()
        os.sync()
        mutate(self.ws, seed=seed)  # the same 100 modified + 10 new + 10 deleted every time
        if prep is not None:
            prep()
        self.add(key, timed(fn))
        if prep is not None:
            self.gap.mark()
        if fingerprint(self.root) != want:
            raise AssertionError(f"{key} did not restore the snapshot's tree")
        if count_files(self.root / "node_modules") != n_ignored:
            raise AssertionError(f"{key} touched the gitignored node_modules/")


def _nothing() -> None:
    pass


def _served_kind(cmd: list[str]) -> str:
    """Which script the daemon rows ran (see ``_common.served_cmd``)."""
    try:
        text = Path(cmd[-1]).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return "unknown"
    if "site-less launcher" in text:
        return "the site-less launcher `make setup` installs (python -S)"
    return "pip's console-script wrapper"


def _count_reads(run: Any) -> list[int]:
    """Instrument one session (bench only): how many files each scan actually read.

    Reaches into ``Session.workspace.scan``; if that internal changes, the count is -1.
    """
    seen: list[int] = [-1]
    original = getattr(run.workspace, "scan", None)
    if original is None:
        return seen

    def scan(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        result = out[0] if isinstance(out, tuple) else out
        seen.append(getattr(result, "read_files", -1))
        return out

    run.workspace.scan = scan
    return seen


def _rows(b: _Bench) -> list[dict[str, Any]]:
    """Grouped by figure: API vs git, API vs git fsync=all, then the same for the CLI."""
    s, n = b.samples, b.cfg.files

    def fastest(peer: str) -> str:
        return min((f"rewind/{peer} {how}" for how in GIT_RESTORES), key=lambda k: median(s[k]))

    both = (GIT, GIT_FS)
    figures = [
        ("first", f"first snapshot, {n:,} files", {p: f"first/{p}" for p in both}),
        ("inc1", f"incremental, {n:,} files, 1 changed", {p: f"inc1/{p}" for p in both}),
        ("inc100", f"incremental, {n:,} files, 100 changed", {p: f"inc100/{p}" for p in both}),
        ("rewind", "rewind 100 mod + 10 new + 10 del", {p: fastest(p) for p in both}),
    ]
    out = []
    for key, label, peers in figures:
        for iface in ("api", "cli"):
            for peer_key in peers.values():
                name = peer_key.split("/", 1)[1]
                out.append(
                    _ms_row(f"{label} [{iface}]", s[f"{key}/{iface}"], s[peer_key], name, BARS[key])
                )
    for key, label, peers in figures:
        if f"{key}/watch" not in s:
            continue
        for peer_key in peers.values():
            name = peer_key.split("/", 1)[1]
            out.append(
                _ms_row(f"{label} [watch]", s[f"{key}/watch"], s[peer_key], name, WATCH_BARS[key])
            )
    # The daemon's rounds come last, in a stretch of their own: against the git commits of
    # those very rounds (the machine's load there is theirs), not of all rounds.
    for key, label, peers in figures:
        if f"{key}/daemon" not in s:
            continue
        for peer_key in peers.values():
            name = peer_key.split("/", 1)[1]
            beside = s.get(f"{peer_key}@daemon", s[peer_key])
            out.append(
                _ms_row(f"{label} [daemon]", s[f"{key}/daemon"], beside, name, DAEMON_BARS[key])
            )
    for key in sorted(k for k in s if k.startswith("rewind/git")):
        out.append(_ms_row(f"(peer) {key}", s[key], None, "", None))
    for k in ("inc1", "inc100"):
        reads = b.reads.get(k, [])
        out.append(
            row(
                f"files read per API snapshot, {k[3:]} changed",
                median(reads),
                "files",
                samples=reads,
            )
        )
    return out


def _ms_row(
    fig: str, xs: list[float], peer: list[float] | None, name: str, bar: float | None
) -> dict[str, Any]:
    ms = [x * 1000 for x in xs]
    pms = [x * 1000 for x in peer] if peer else []
    return row(
        fig,
        median(ms),
        "ms",
        peer=median(pms) if pms else None,
        peer_name=name,
        bar=bar,
        samples=ms,
        peer_samples=pms,
    )


def run(cfg: Config) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sp-bench-ws-", dir=cfg.tmp))
    try:
        t0 = time.perf_counter()
        b = _Bench(cfg, tmp)
        gen = time.perf_counter() - t0
        store_dir, git = b.first()
        b.incremental(store_dir, git)
        info = b.rewind(store_dir, git)
        rows = _rows(b)
    finally:
        if not cfg.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    notes = [
        f"workspace: {b.ws.files:,} tracked files, {b.ws.total_bytes / 2**20:.1f} MiB, "
        f"{len(b.ws.binaries)} binaries, {b.ws.ignored_files:,} gitignored files in node_modules/ "
        f"(generated in {gen:.1f} s)",
        "durability: stashpoint fsyncs each checkpoint (SQLite WAL synchronous=FULL + fsynced "
        f"chunk files); '{GIT}' is git as shipped (no fsync of loose objects, index or refs); "
        f"'{GIT_FS}' adds -c core.fsync=all -c core.fsyncMethod=batch (equal durability)",
        "git runs with gc.auto=0 and maintenance.auto=false (no background gc); git init is not "
        "timed, stashpoint's store creation is (API: open + session + checkpoint + close)",
        f"rewind peer: fastest correct git restore; {info['best_git_restore']} was fastest at "
        "default durability. stashpoint's rewind also takes a safety checkpoint first and "
        "then checks every path it wrote; like git it does not fsync restored files (both "
        "versions are durable in the store, and a restore journal completes an interrupted "
        "one); 'git commit+restore' is git doing the same safety step "
        f"(add -A && commit, then {info['safety_restore']})",
        "CLI: wall time of the `stashpoint` process, bytecode cache warm (see bench_cli)",
        "every restore (stashpoint and git) was checked: tree fingerprint equal to the snapshot, "
        "node_modules/ untouched",
        "watch mode: Session(watch=True), an in-process inotify watcher (its own session in the "
        "same store); a snapshot re-reads only directories with events. SPEC bar <= 0.15x git "
        "with 1 changed; the CLI has no watcher (one process per command)",
        "daemon: `stashpoint watch start`, then each `stashpoint snap`/`rewind` is a process "
        "(interpreter start included) that hands the command to the daemon over its socket; "
        f"the `stashpoint` script is {b.served_kind}; its incremental rows, which "
        "run in a stretch of their own after the other interfaces', are compared with the git "
        "commits of those same rounds (half of them git, half git fsync=all); "
        "the daemon keeps the store open and an inotify watch (checked: every daemon row was "
        "served by it, none fell back)",
        "files read per API snapshot: the K files just edited plus the K edited before the "
        "previous snapshot (they were inside its racy window, two kernel clock ticks, so not "
        "cached): the honest steady state of an in-process agent. A CLI snap starts "
        "~0.1-0.2 s after the edit, past that window",
        f"reps: first snapshot x{cfg.reps_first}, incremental x{2 * cfg.reps} per interface, "
        f"rewind x{cfg.reps}; medians",
    ]
    return {
        "name": "workspace",
        "rows": rows,
        "notes": notes,
        "env": {"git": ".".join(map(str, git_version())), "python": sys.version.split()[0]},
    }


if __name__ == "__main__":
    from run_all import main

    main(["--only", "workspace", *sys.argv[1:]])
