"""Durable-step overhead: ``@run.step`` vs DBOS's ``@DBOS.step`` on SQLite vs a plain call.

The workload: a program that calls a no-op step N times.
The overhead per step is ``(time of the program with N steps - time with 0 steps) / N``, so
what a run pays once (starting it, the final checkpoint, DBOS's workflow row) cancels out and
what is left is the price of one recorded step. Medians over ``reps`` repetitions.

- stashpoint: ``store = stashpoint.open(dir)`` (SQLite WAL, ``synchronous=FULL``: one fsync
  per step, the default), ``run = store.session(...)``, ``@run.step def noop(i)``, then
  ``run.run(main)``; a new session per repetition, one store. Also ``run.arun`` with an async
  step, and the *replay*: the same program again on a fresh Session object of the same
  session, every step answered from the journal.
- DBOS (PyPI ``dbos``): ``@DBOS.step() def noop(i)`` called N times inside a
  ``@DBOS.workflow()``, system database on SQLite (``system_database_url=sqlite:///...``), no
  server. DBOS leaves SQLite at its defaults: rollback journal (``journal_mode=delete``) and
  ``synchronous=FULL`` - every commit fsyncs, as stashpoint's does, so the two compare at equal
  durability. It runs a second time on a database switched to WAL beforehand (stashpoint's
  journal mode, still ``synchronous=FULL``): the same setting, the stricter peer. Each DBOS
  runs in a child process of its own (DBOS is a process-wide singleton with background
  threads), driven over a pipe so repetitions interleave with stashpoint's; the child times
  the workflow call itself, so the pipe costs nothing.
- plain: the same loop calling an undecorated function: the floor.
- floor: one bare SQLite WAL commit of a 1 KB row at ``synchronous=FULL``, what each recorded
  step must at least pay to be durable (context).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import stashpoint
from _common import Config, Floor, median, row

BAR = 0.25  # stashpoint's per-step overhead <= 0.25x DBOS's
KINDS = ("sync", "async")
DBOS_MODES = {"default": "DBOS", "wal": "DBOS (WAL)"}
SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


# -- stashpoint ---------------------------------------------------------------------------
def _program(run: Any, n: int) -> tuple[Callable[[], int], Callable[[], Any]]:
    """``main`` (sync) and ``amain`` (async) calling a no-op durable step ``n`` times.

    The steps are defined here, so their names (qualnames) are the same for every Session
    object: a fresh Session replays what another one recorded."""

    @run.step
    def noop(i: int) -> int:
        return i

    @run.step
    async def anoop(i: int) -> int:
        return i

    def main() -> int:
        for i in range(n):
            noop(i)
        return n

    async def amain() -> int:
        for i in range(n):
            await anoop(i)
        return n

    return main, amain


class Stashpoint:
    def __init__(self, path: Path) -> None:
        self.store = stashpoint.open(path)
        self.loop = asyncio.new_event_loop()
        self.serial = 0

    def time(self, kind: str, n: int) -> tuple[float, str]:
        """Seconds for a new session's run of ``n`` steps; the session's name."""
        self.serial += 1
        name = f"{kind}-{n}-{self.serial}"
        run = self.store.session(name)
        main, amain = _program(run, n)
        t0 = time.perf_counter()
        res = run.run(main) if kind == "sync" else self.loop.run_until_complete(run.arun(amain))
        dt = time.perf_counter() - t0
        assert res.status == "completed" and res.executed == n and res.replayed == 0, res
        return dt, name

    def replay(self, name: str, n: int) -> float:
        """Seconds to run session ``name``'s program again on a fresh Session: all replayed."""
        run = self.store.session(name)
        main, _ = _program(run, n)
        t0 = time.perf_counter()
        res = run.run(main)
        dt = time.perf_counter() - t0
        assert res.status == "completed" and res.replayed == n and res.executed == 0, res
        return dt

    def pragmas(self) -> dict[str, Any]:
        """journal_mode and synchronous of the store's own connection (internal attribute)."""
        db: sqlite3.Connection = getattr(self.store.meta, "_db")  # noqa: B009
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
        sync = db.execute("PRAGMA synchronous").fetchone()[0]
        return {"journal_mode": mode, "synchronous": SYNCHRONOUS.get(sync, sync)}

    def close(self) -> None:
        self.loop.close()
        self.store.close()


def _plain(n: int) -> float:
    """Seconds per call of the same loop over a plain function (n * 1000 calls, one sample)."""

    def noop(i: int) -> int:
        return i

    def main(k: int) -> None:
        for i in range(k):
            noop(i)

    k = n * 1000
    t0 = time.perf_counter()
    main(0)
    t1 = time.perf_counter()
    main(k)
    t2 = time.perf_counter()
    return ((t2 - t1) - (t1 - t0)) / k


# -- DBOS, in a child process ---------------------------------------------------------------
def dbos_child(db: str, mode: str) -> None:
    """Serve timings of DBOS workflows over stdin/stdout: ``sync N`` / ``async N`` answer the
    seconds a workflow of N no-op steps took; ``quit`` shuts DBOS down."""
    out: IO[str] = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever DBOS prints goes to stderr, not into the protocol
    sys.stdout = sys.stderr
    if mode == "wal":  # journal_mode=WAL is persistent: set it before DBOS opens the file
        with sqlite3.connect(db) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
    from importlib.metadata import version

    import sqlalchemy as sa
    from dbos import DBOS

    dbos = DBOS(config={"name": "stashpoint-bench", "system_database_url": f"sqlite:///{db}"})

    @DBOS.step()
    def noop(i: int) -> int:
        return i

    @DBOS.step()
    async def anoop(i: int) -> int:
        return i

    @DBOS.workflow()
    def workflow(n: int) -> int:
        for i in range(n):
            noop(i)
        return n

    @DBOS.workflow()
    async def aworkflow(n: int) -> int:
        for i in range(n):
            await anoop(i)
        return n

    DBOS.launch()
    loop = asyncio.new_event_loop()
    pragmas: dict[str, Any] = {}
    try:  # the settings of DBOS's own connections (internal attribute: best effort)
        with dbos._sys_db.engine.connect() as sa_conn:
            for p in ("journal_mode", "synchronous"):
                pragmas[p] = sa_conn.execute(sa.text(f"PRAGMA {p}")).scalar()
        pragmas["synchronous"] = SYNCHRONOUS.get(pragmas["synchronous"], pragmas["synchronous"])
    except Exception as exc:
        pragmas["error"] = repr(exc)
    print(json.dumps({"version": version("dbos"), "pragmas": pragmas}), file=out, flush=True)
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "quit":
            break
        n = int(arg)
        t0 = time.perf_counter()
        got = workflow(n) if cmd == "sync" else loop.run_until_complete(aworkflow(n))
        dt = time.perf_counter() - t0
        assert got == n
        print(json.dumps(dt), file=out, flush=True)
    loop.close()
    DBOS.destroy()


class Dbos:
    """A DBOS child process (see :func:`dbos_child`)."""

    def __init__(self, tmp: Path, mode: str) -> None:
        self.log_path = tmp / f"dbos-{mode}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--dbos-child", str(tmp / f"dbos-{mode}.sqlite"), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=tmp,  # DBOS may write files into its working directory
        )
        hello = json.loads(self._line())
        self.version: str = hello["version"]
        self.pragmas: dict[str, Any] = hello["pragmas"]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            tail = self.log_path.read_text()[-2000:]
            raise RuntimeError(f"DBOS child exited ({self.proc.returncode}):\n{tail}")
        return line

    def time(self, kind: str, n: int) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{kind} {n}\n")
        self.proc.stdin.flush()
        return float(json.loads(self._line()))

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            self.log.close()


def _dbos_peers(tmp: Path, notes: list[str]) -> dict[str, Dbos]:
    try:
        import dbos  # noqa: F401
    except ImportError:
        notes.append("DBOS not installed (pip install dbos): no peer, no bar")
        return {}
    peers: dict[str, Dbos] = {}
    for mode in DBOS_MODES:
        try:
            peers[mode] = Dbos(tmp, mode)
        except (RuntimeError, OSError, ValueError) as exc:
            notes.append(f"DBOS ({mode}) could not start: {exc}")
    return peers


# -- the measurement ------------------------------------------------------------------------
def _overhead(t_n: list[float], t_0: list[float], n: int) -> list[float]:
    """Per-step overhead in µs, one sample per repetition."""
    return [(a - b) / n * 1e6 for a, b in zip(t_n, t_0, strict=True)]


def run(cfg: Config) -> dict[str, Any]:
    n = max(10, cfg.steps // 2)  # 500 steps by default, 100 with --quick
    reps = cfg.reps
    tmp = Path(tempfile.mkdtemp(prefix="sp-bench-durable-", dir=cfg.tmp))
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    sp = Stashpoint(tmp / "sp")
    floor = Floor(tmp / "floor.db")
    peers = _dbos_peers(tmp, notes)
    times: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        times.setdefault(key, []).append(value)

    try:
        # warm-up: imports, first connections, page cache; not recorded
        for kind in KINDS:
            for steps in (0, 20):
                _, name = sp.time(kind, steps)
                if kind == "sync":
                    sp.replay(name, steps)
                for peer in peers.values():
                    peer.time(kind, steps)
        floor.samples(20)
        for _ in range(reps):  # interleaved, so a slow spell of the disk hits all alike
            add("plain", _plain(n) * 1e6)
            add("floor", median(floor.samples(50)) * 1e6)
            for kind in KINDS:
                for steps in (0, n):
                    t, name = sp.time(kind, steps)
                    add(f"sp-{kind}-{steps}", t)
                    if kind == "sync":
                        add(f"replay-{steps}", sp.replay(name, steps))
                    for mode, peer in peers.items():
                        add(f"{mode}-{kind}-{steps}", peer.time(kind, steps))
        sp_pragmas = sp.pragmas()
    finally:
        for peer in peers.values():
            peer.close()
        sp.close()
        floor.close()
        if not cfg.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    rows.append(row("plain call (the floor)", median(times["plain"]), "µs/step"))
    rows.append(
        row(
            "bare SQLite WAL commit, 1 KB row, FULL",
            median(times["floor"]),
            "µs",
            note="what one durable step must at least pay",
        )
    )
    for kind in KINDS:
        ours = _overhead(times[f"sp-{kind}-{n}"], times[f"sp-{kind}-0"], n)
        for mode, label in DBOS_MODES.items():
            if mode not in peers:
                continue
            theirs = _overhead(times[f"{mode}-{kind}-{n}"], times[f"{mode}-{kind}-0"], n)
            rows.append(
                row(
                    f"[FULL] {kind} step overhead",
                    median(ours),
                    "µs/step",
                    peer=median(theirs),
                    peer_name=label,
                    bar=BAR,
                    samples=ours,
                    peer_samples=theirs,
                )
            )
        if not peers:
            rows.append(row(f"[FULL] {kind} step overhead", median(ours), "µs/step", samples=ours))
    live = _overhead(times[f"sp-sync-{n}"], times["sp-sync-0"], n)
    replay = _overhead(times[f"replay-{n}"], times["replay-0"], n)
    rows.append(
        row(
            "replay per step (fresh Session, from the journal)",
            median(replay),
            "µs/step",
            peer=median(live),
            peer_name="live step",
            samples=replay,
            note="includes loading and chain-verifying the journal",
        )
    )
    ms = [t * 1000 for t in times["sp-sync-0"]]
    for mode, label in DBOS_MODES.items():
        if mode in peers:
            theirs = [t * 1000 for t in times[f"{mode}-sync-0"]]
            rows.append(
                row(
                    "run with 0 steps (start + finish)",
                    median(ms),
                    "ms",
                    peer=median(theirs),
                    peer_name=label,
                    samples=ms,
                    peer_samples=theirs,
                )
            )

    notes += [
        f"per-step overhead = (time of a run of {n:,} no-op steps - time of a run of 0) / "
        f"{n:,}; median of {reps} repetitions, interleaved with the peers",
        f"stashpoint: stashpoint.open(), SQLite {sp_pragmas['journal_mode']} mode, "
        f"synchronous={sp_pragmas['synchronous']} (one fsync per recorded step)",
        "replay: the same program on a fresh Session object of the same session, every step "
        "answered from the journal (the 0-step replay is subtracted likewise)",
    ]
    for mode, peer in peers.items():
        notes.append(
            f"{DBOS_MODES[mode]}: dbos {peer.version}, system database on SQLite, "
            + ", ".join(f"{k}={v}" for k, v in peer.pragmas.items())
            + (
                " (DBOS's defaults; every commit fsyncs: equal durability)"
                if mode == "default"
                else " (switched to WAL before DBOS opened it: stashpoint's exact setting)"
            )
        )
    if peers:
        notes.append(
            "each DBOS runs in a child process of its own (a process-wide singleton with "
            "background threads), timed inside the child around the workflow call"
        )
    return {
        "name": "durable",
        "rows": rows,
        "notes": notes,
        "steps": n,
        "dbos": {m: {"version": p.version, "pragmas": p.pragmas} for m, p in peers.items()},
        "stashpoint_sqlite": sp_pragmas,
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--dbos-child"]:
        dbos_child(sys.argv[2], sys.argv[3])
    else:
        from run_all import main

        main(["--only", "durable", *sys.argv[1:]])
