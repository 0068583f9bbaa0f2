"""Probe: what one served ``stashpoint rewind`` costs, measured in the daemon.

The workspace row of bench_workspace times a served rewind (100 modified + 10 new + 10
deleted files of 10k) against git; its wall clock is noisy on a shared machine. This probe
runs the same request and reports, per rewind:

- the client's wall clock (the site-less launcher, as ``make setup`` installs it);
- the daemon's own time for the request (``watch status --json``: last_request_ms) and its
  CPU time (process_time, measured around the request by the daemon driver below);
- the garbage collections during each request (count and wall time);
- optionally: the wall and CPU time of chosen functions (``--phases``), a cProfile of each
  request (``--profile DIR``), the daemon's syscalls over all timed rewinds (``--strace``:
  ``strace -f -c``; ``--strace log``: every call, timed), and its user-space instruction
  count per rewind (``--callgrind``: the daemon runs under valgrind; the count is stable
  under load where the wall clock is not, but SHA-256 counts ~30x what it costs natively:
  valgrind hides the CPU's SHA extensions).

The daemon is started by this script (not ``watch start``) so that it can be instrumented
without the product knowing: the child re-enters this file with ``--daemon-child`` and wraps
:meth:`stashpoint.watch_daemon.Daemon.answer`. It listens where ``watch start`` would.

Usage (from the repository root)::

    PYTHONPATH=$PWD/src nice -n 19 python bench/probe_rewind.py --reps 15
    PYTHONPATH=$PWD/src nice -n 19 python bench/probe_rewind.py --reps 5 --profile /tmp/prof
    PYTHONPATH=$PWD/src nice -n 19 python bench/probe_rewind.py --reps 5 --strace
    PYTHONPATH=$PWD/src nice -n 19 python bench/probe_rewind.py --reps 5 --callgrind
    PYTHONPATH=$PWD/src nice -n 19 python bench/probe_rewind.py --reps 15 \
        --phases stashpoint.workspace:Workspace.scan,stashpoint.workspace.restore:Restorer._sync

``--src`` is copied first (default /work/ws10k, a make_workspace(…, 10_000) tree); it is
never modified.
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

_CPU_KEY = "probe_cpu_ms"
_GC_KEY = "gc:collections"


def _daemon_child(argv: list[str]) -> None:
    """The daemon, with each request's CPU time in its status (and a profile when asked)."""
    from stashpoint import watch_daemon

    prof_dir = os.environ.get("PROBE_PROFILE_DIR")
    answer = watch_daemon.Daemon.answer
    status = watch_daemon.Daemon.status
    state = {"cpu": 0.0, "n": 0}

    def timed_answer(self: Any, message: dict[str, object]) -> dict[str, object]:
        if message.get("op") != "run":
            return answer(self, message)
        prof = None
        if prof_dir:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t0 = time.process_time()
        try:
            return answer(self, message)
        finally:
            state["cpu"] = (time.process_time() - t0) * 1000
            if prof is not None:
                prof.disable()
                state["n"] += 1
                prof.dump_stats(os.path.join(str(prof_dir), f"req-{state['n']:03d}.prof"))

    def status_with_cpu(self: Any) -> dict[str, object]:
        out = status(self)
        out[_CPU_KEY] = round(state["cpu"], 2)
        # (a string: the protocol's codec carries flat values only)
        out["probe_phases"] = json.dumps({k: v[:] for k, v in phases.items()})
        for v in phases.values():
            v[0] = v[1] = 0.0
        return out

    phases: dict[str, list[float]] = {}
    for spec in filter(None, os.environ.get("PROBE_PHASES", "").split(",")):
        _wrap_phase(spec, phases)
    gc_acc = phases.setdefault(_GC_KEY, [0.0, 0.0])  # (wall ms, number of collections)
    gc_t0 = [0.0]

    def gc_callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        else:
            gc_acc[0] += (time.perf_counter() - gc_t0[0]) * 1000
            gc_acc[1] += 1

    import gc

    gc.callbacks.append(gc_callback)
    watch_daemon.Daemon.answer = timed_answer  # type: ignore[method-assign]
    watch_daemon.Daemon.status = status_with_cpu  # type: ignore[method-assign]
    watch_daemon.main(argv)


def _wrap_phase(spec: str, phases: dict[str, list[float]]) -> None:
    """Time ``module:Class.method`` (or ``module:function``): wall and CPU ms per request."""
    import importlib

    mod_name, _colon, attr = spec.partition(":")
    owner: Any = importlib.import_module(mod_name)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    fn = getattr(owner, name)
    acc = phases.setdefault(spec, [0.0, 0.0])
    depth = [0]

    def wrapper(*a: Any, **k: Any) -> Any:
        if depth[0]:
            return fn(*a, **k)  # recursion: count the outermost call only
        depth[0] += 1
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return fn(*a, **k)
        finally:
            acc[0] += (time.perf_counter() - t0) * 1000
            acc[1] += (time.process_time() - c0) * 1000
            depth[0] -= 1

    setattr(owner, name, wrapper)


def _workspace_of(root: Path) -> Any:
    """The workload's description of a copied make_workspace tree (its file lists in the
    order make_workspace wrote them: sorted paths are that order)."""
    from workload import Workspace

    text: list[str] = [".gitignore"]
    binaries: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("node_modules", ".git"))
        rel = os.path.relpath(dirpath, root)
        for name in sorted(filenames):
            path = name if rel == "." else f"{rel}/{name}"
            if path == ".gitignore":
                continue
            (binaries if path.startswith("assets/") else text).append(path)
    return Workspace(root, 1, text, binaries)


def _dumped_instructions(tmp: Path, tag: str) -> int:
    """The instruction count (Ir) of the callgrind dump ``tag`` (its totals line); the dump
    is renamed ``tag.callgrind`` (for callgrind_annotate, with --keep)."""
    for path in sorted(tmp.glob("callgrind.out.*")):
        text = path.read_text(errors="replace")
        if f"desc: Trigger: dump {tag}\n" not in text[:4000]:
            continue
        for line in text.splitlines():
            if line.startswith(("summary:", "totals:")):
                path.rename(tmp / f"{tag}.callgrind")
                return int(line.split()[1])
    raise SystemExit(f"no callgrind dump for {tag}")


def main() -> None:
    if sys.argv[1:2] == ["--daemon-child"]:
        _daemon_child(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", default="/work/ws10k", help="workspace to copy (never modified)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--profile", metavar="DIR", help="cProfile each served rewind into DIR")
    p.add_argument(
        "--strace",
        nargs="?",
        const="count",
        choices=("count", "log"),
        help="the daemon's syscalls over the timed rewinds: counted, or every one (log)",
    )
    p.add_argument(
        "--phases",
        default="",
        help="comma-separated module:Class.method to time in the daemon (wall/cpu ms)",
    )
    p.add_argument(
        "--callgrind",
        action="store_true",
        help="run the daemon under callgrind: user-space instructions per rewind",
    )
    p.add_argument("--check", action="store_true", help="fingerprint after every rewind")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = p.parse_args()

    from _common import Gap, cli_env, served_cmd, warm_bytecode
    from stashpoint.watchd.protocol import socket_path, store_key
    from workload import fingerprint
    from workload import mutate_for_rewind as mutate

    tmp = Path(tempfile.mkdtemp(prefix="probe-rewind-"))
    root = tmp / "ws"
    subprocess.run(["cp", "-a", args.src, str(root)], check=True)
    ws = _workspace_of(root)
    store = tmp / "store"
    env = cli_env()
    warm_bytecode(env)
    served = served_cmd(tmp)
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        env["PROBE_PROFILE_DIR"] = str(Path(args.profile).resolve())
    if args.phases:
        env["PROBE_PHASES"] = args.phases

    def sp(*argv: str, check: bool = True) -> str:
        cmd = [*served, "--store", str(store), "-C", str(root), "--session", "bench", *argv]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if check and out.returncode != 0:
            raise SystemExit(f"{argv}: {out.returncode}\n{out.stdout}\n{out.stderr}")
        return out.stdout

    # The store, made by an unserved CLI run; then the daemon, where `watch start` puts it.
    noserve = {**env, "STASHPOINT_NO_DAEMON": "1"}
    subprocess.run(
        [*served, "--store", str(store), "-C", str(root), "init"],
        check=True,
        capture_output=True,
        env=noserve,
    )
    url = store_key(str(store))
    sock = socket_path(url, str(root), create=True)
    assert sock is not None
    cg_out = tmp / "callgrind.out"
    wrap = (
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={cg_out}"]
        if args.callgrind
        else []
    )
    child = ["--daemon-child", "--store", url, "--root", str(root), "--idle", "600"]
    daemon = subprocess.Popen(
        [*wrap, sys.executable, __file__, *child, "--socket", sock],
        cwd=root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    tracer: subprocess.Popen[bytes] | None = None
    try:
        assert daemon.stdout is not None
        line = daemon.stdout.readline().decode()  # "watching ROOT (pid N)": warm
        if "watching" not in line:
            raise SystemExit(f"the daemon did not start: {line!r}")

        def status() -> dict[str, Any]:
            got: dict[str, Any] = json.loads(sp("watch", "status", "--json"))
            if not got.get("running"):
                raise SystemExit(f"the daemon is not running: {got}")
            return got

        gap = Gap(0.1)
        base = json.loads(sp("snap", "--json", "-m", "base"))["id"]
        gap.mark()
        want = fingerprint(root) if args.check else None
        walls: list[float] = []
        server: list[float] = []
        cpu: list[float] = []
        phase_samples: dict[str, list[list[float]]] = {}
        requests = status()["requests"]
        if args.strace:
            how = ["-c"] if args.strace == "count" else ["-tt", "-T"]
            tracer = subprocess.Popen(
                ["strace", "-f", *how, "-p", str(daemon.pid), "-o", str(tmp / "strace.txt")],
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)
        instructions: list[float] = []

        def callgrind(*flags: str) -> None:
            subprocess.run(
                ["callgrind_control", *flags, str(daemon.pid)], check=True, capture_output=True
            )

        for rep in range(args.reps):
            gap.wait()
            mutate(ws, seed=4242)
            os.sync()
            if args.callgrind:
                time.sleep(0.3)  # the daemon drains the mutation's events first (not counted)
                callgrind("-i", "on")
                callgrind("-z")
            t0 = time.perf_counter()
            out = sp("rewind", base)
            walls.append((time.perf_counter() - t0) * 1000)
            gap.mark()
            if args.callgrind:
                callgrind("-d", f"rep{rep}")
                callgrind("-i", "off")
                instructions.append(_dumped_instructions(tmp, f"rep{rep}") / 1e6)
            if not out.startswith("rewound"):
                raise SystemExit(f"unexpected output: {out!r}")
            if tracer is None:
                st = status()
                server.append(st["last_request_ms"])
                cpu.append(st[_CPU_KEY])
                for k, v in json.loads(st.get("probe_phases", "{}")).items():
                    phase_samples.setdefault(k, []).append(v)
            if want is not None and fingerprint(root) != want:
                raise SystemExit("the rewind did not restore the snapshot's tree")
        if tracer is not None:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(10)
            print((tmp / "strace.txt").read_text())
        st = status()
        served_n = st["requests"] - requests
        if served_n != args.reps:
            raise SystemExit(f"only {served_n} of {args.reps} rewinds were served")

        def show(name: str, xs: list[float]) -> None:
            if xs:
                print(
                    f"{name:<22} median {statistics.median(xs):7.2f} ms   "
                    f"min {min(xs):7.2f}   max {max(xs):7.2f}   n={len(xs)}"
                )

        print(f"served rewind, 100 mod + 10 new + 10 del of {len(ws.text_files)} files")
        show("client wall", walls)
        show("daemon wall", server)
        show("daemon cpu", cpu)
        if instructions:
            print(
                f"daemon user-space instructions per rewind (callgrind, millions): median "
                f"{statistics.median(instructions):.1f}  min {min(instructions):.1f}  "
                f"max {max(instructions):.1f}"
            )
        for k, vs in phase_samples.items():
            name = k.rpartition(":")[2]
            show(f"  {name} wall", [v[0] for v in vs])
            if k == _GC_KEY:
                counts = sorted(int(v[1]) for v in vs)
                print(f"  {name}: {counts} per rewind")
            else:
                show(f"  {name} cpu", [v[1] for v in vs])
        print(f"full scans by the daemon: {st['full_scans']}")
    finally:
        if tracer is not None and tracer.poll() is None:
            tracer.kill()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")


if __name__ == "__main__":
    main()
