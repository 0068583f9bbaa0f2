"""A/B probe: the served rewind of two source trees, interleaved, on a machine others use.

Wall-clock figures of one tree measured now and of another measured a minute later compare
two different loads. Here each tree gets its own copy of the workspace, store and daemon,
and their rewinds alternate (A, B, A, B, ...), so both see the same moments; the report
gives each tree's medians and the median of the per-pair ratios B/A.

Usage (from the repository root; A is usually main, B this tree)::

    PYTHONPATH=$PWD/src nice -n 19 python bench/probe_rewind_ab.py /work/main/src $PWD/src

Each rewind is the workload of bench_workspace's rewind row (100 modified + 10 new + 10
deleted files of 10k, from a copy of ``--src``), run by the site-less launcher, as in
bench/probe_rewind.py (which also explains the daemon-side figures).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_rewind import _CPU_KEY, _workspace_of


class _Rig:
    """One tree's workspace copy, store, launcher and instrumented daemon."""

    def __init__(self, src_tree: str, workspace: str, tag: str) -> None:
        from _common import cli_env
        from stashpoint.watchd import launcher
        from stashpoint.watchd.protocol import socket_path, store_key

        self.tree = src_tree
        self.tmp = Path(tempfile.mkdtemp(prefix=f"probe-ab-{tag}-"))
        self.root = self.tmp / "ws"
        subprocess.run(["cp", "-a", workspace, str(self.root)], check=True)
        self.ws = _workspace_of(self.root)
        self.store = self.tmp / "store"
        self.env = cli_env()
        self.env["PYTHONPATH"] = src_tree
        pkg = os.path.join(src_tree, "stashpoint")
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", pkg], env=self.env, capture_output=True
        )
        (self.tmp / "bin").mkdir()
        self.cmd = [str(self.tmp / "bin" / "stashpoint")]
        launcher.write(self.cmd[0], sys.executable, src_tree)
        subprocess.run(
            [*self.cmd, "--store", str(self.store), "-C", str(self.root), "init"],
            check=True,
            capture_output=True,
            env={**self.env, "STASHPOINT_NO_DAEMON": "1"},
        )
        url = store_key(str(self.store))
        sock = socket_path(url, str(self.root), create=True)
        assert sock is not None
        child = ["--daemon-child", "--store", url, "--root", str(self.root), "--idle", "900"]
        probe = str(Path(__file__).resolve().parent / "probe_rewind.py")
        self.daemon = subprocess.Popen(
            [sys.executable, probe, *child, "--socket", sock],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=self.env,
            start_new_session=True,
        )
        assert self.daemon.stdout is not None
        line = self.daemon.stdout.readline().decode()
        if "watching" not in line:
            raise SystemExit(f"the daemon of {src_tree} did not start: {line!r}")
        self.base = json.loads(self.sp("snap", "--json", "-m", "base"))["id"]
        self.walls: list[float] = []
        self.server: list[float] = []
        self.cpu: list[float] = []

    def sp(self, *argv: str) -> str:
        cmd = [*self.cmd, "--store", str(self.store), "-C", str(self.root), "--session", "bench"]
        out = subprocess.run([*cmd, *argv], capture_output=True, text=True, env=self.env)
        if out.returncode != 0:
            raise SystemExit(f"{self.tree} {argv}: {out.returncode}\n{out.stdout}{out.stderr}")
        return out.stdout

    def status(self) -> dict[str, Any]:
        got: dict[str, Any] = json.loads(self.sp("watch", "status", "--json"))
        if not got.get("running"):
            raise SystemExit(f"the daemon of {self.tree} is not running")
        return got

    def rewind(self) -> None:
        from workload import mutate_for_rewind

        mutate_for_rewind(self.ws, seed=4242)
        os.sync()
        t0 = time.perf_counter()
        out = self.sp("rewind", self.base)
        self.walls.append((time.perf_counter() - t0) * 1000)
        if not out.startswith("rewound"):
            raise SystemExit(f"unexpected output: {out!r}")
        st = self.status()
        self.server.append(st["last_request_ms"])
        self.cpu.append(st[_CPU_KEY])

    def close(self) -> None:
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.daemon.wait(10)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="source directory of tree A (holding the stashpoint package)")
    p.add_argument("b", help="source directory of tree B")
    p.add_argument("--src", default="/work/ws10k", help="workspace to copy (never modified)")
    p.add_argument("--pairs", type=int, default=20)
    args = p.parse_args()
    rigs: list[_Rig] = []
    try:
        rigs.append(_Rig(os.path.abspath(args.a), args.src, "a"))
        rigs.append(_Rig(os.path.abspath(args.b), args.src, "b"))
        a, b = rigs
        for i in range(args.pairs):
            for rig in (a, b) if i % 2 == 0 else (b, a):  # neither always goes first
                time.sleep(0.1)  # the snapshot gap of the bench (Gap(0.1))
                rig.rewind()

        def med(xs: list[float]) -> float:
            return float(statistics.median(xs))

        print(f"{args.pairs} interleaved served rewinds each (load {os.getloadavg()[0]:.2f})")
        for name, rig in (("A", a), ("B", b)):
            print(
                f"{name} {rig.tree}: client wall median {med(rig.walls):.2f} ms "
                f"(min {min(rig.walls):.2f}), daemon wall {med(rig.server):.2f} "
                f"(min {min(rig.server):.2f}), daemon cpu {med(rig.cpu):.2f}"
            )
        for what, xa, xb in (
            ("client wall", a.walls, b.walls),
            ("daemon wall", a.server, b.server),
            ("daemon cpu", a.cpu, b.cpu),
        ):
            ratios = [y / x for x, y in zip(xa, xb, strict=True)]
            print(f"B/A {what}: median of pair ratios {med(ratios):.3f}")
    finally:
        for rig in rigs:
            rig.close()


if __name__ == "__main__":
    main()
