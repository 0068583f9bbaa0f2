"""kill -9 harness for durable execution.

The scripted agent of ``stashpoint._demo_agent`` (durable steps, tasks, an approval-gated
irreversible deploy and an irreversible notification) runs in a subprocess that is killed with
SIGKILL at random instants - at least 80 across the scenarios - and resumed each time, with
``stashpoint approve`` answering its approval and in-doubt questions as a human would (looking
at the "real world" log to tell whether an effect happened).

Checked for every scenario:
- the final result and the workspace equal an uninterrupted run's;
- no step body started after its result had been journaled (the execution log, written by the
  bodies outside the store, is compared with the journal as it stood before each process);
  a body that was killed before its result was journaled may run again - that is the only
  re-execution allowed, and it is exactly what the journal is for;
- each irreversible effect happened exactly once;
- ``stashpoint verify`` passes and every task completed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import stashpoint
from stashpoint._demo_agent import EXIT_APPROVAL, EXIT_IN_DOUBT, SESSION
from stashpoint.durable import Journal
from stashpoint.durable.entries import StepEntry

pytestmark = pytest.mark.slow

KILLS_WANTED = 80
DELAY = 0.01
STATS: Counter[str] = Counter()  # what the operator had to decide, for the printed summary


def agent(store: Path, ws: Path, outside: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "stashpoint._demo_agent",
        "--store",
        str(store),
        "--workspace",
        str(ws),
        "--outside",
        str(outside),
        "--delay",
        str(DELAY),
    ]


def cli(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "stashpoint", "--store", str(store), "--session", SESSION]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120)


def recorded_steps(store_dir: Path) -> Counter[str]:
    """Fingerprints of the steps whose results the branch's journal holds."""
    store = stashpoint.open(store_dir)
    try:
        j = Journal(store.session(SESSION))
        return Counter(e.fingerprint for e in j.entries if type(e) is StepEntry)
    finally:
        store.close()


def decide(store: Path, outside: Path, code: int) -> None:
    """Answer what the paused run asks, as an operator would."""
    if code == EXIT_APPROVAL:
        STATS["approvals"] += 1
        res = cli(store, "approve", "--reason", "harness")
    else:
        status = json.loads(cli(store, "resume", "--dry-run", "--json").stdout)
        key = status["pending"]["id"]
        effects = (
            (outside / "effects.log").read_text() if (outside / "effects.log").exists() else ""
        )
        happened = [line for line in effects.splitlines() if line.endswith(" " + key)]
        STATS["in-doubt effects happened" if happened else "in-doubt effects retried"] += 1
        if happened:  # it did happen: record its result, never run it again
            what = happened[0].rsplit(" ", 1)[0]
            res = cli(store, "approve", "--done", "--result", json.dumps(what))
        else:  # it did not: run it again (with the same idempotency key)
            res = cli(store, "approve", "--reason", "not in the outbox")
    assert res.returncode == 0, res.stderr


def run_to_completion(
    base: Path, rng: random.Random | None, max_kills: int
) -> tuple[dict[str, object], int, Path, Path, Path]:
    store, ws, outside = base / "store", base / "ws", base / "outside"
    ws.mkdir(parents=True)
    kills = 0
    for _attempt in range(500):
        before = recorded_steps(store) if store.exists() else Counter()
        proc = subprocess.Popen(
            agent(store, ws, outside), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        code: int | None
        if rng is not None and kills < max_kills:
            # Mostly at a random instant; sometimes right after an external effect happened
            # (before its outcome is journaled), the case a ledger exists for.
            if rng.random() < 0.2:
                wait_for_new_effect(proc, outside / "effects.log")
            else:
                try:
                    proc.wait(timeout=rng.uniform(0.0, 0.5))
                except subprocess.TimeoutExpired:
                    pass
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            out, err = proc.communicate()
            code = None if proc.returncode == -signal.SIGKILL else proc.returncode
        else:
            out, err = proc.communicate(timeout=120)
            code = proc.returncode
        check_no_replayed_body_ran(outside, proc.pid, before)
        if code == 0:
            return json.loads(out.strip().splitlines()[-1]), kills, store, ws, outside
        if code in (EXIT_APPROVAL, EXIT_IN_DOUBT):
            decide(store, outside, code)
        elif code is not None:
            raise AssertionError(f"agent exited {code}:\n{err}")
    raise AssertionError("the agent never completed")


def wait_for_new_effect(proc: subprocess.Popen[str], log: Path) -> None:
    size = log.stat().st_size if log.exists() else 0
    deadline = time.monotonic() + 2.0
    while proc.poll() is None and time.monotonic() < deadline:
        if log.exists() and log.stat().st_size > size:
            return
        time.sleep(0.0005)


def check_no_replayed_body_ran(outside: Path, pid: int, recorded: Counter[str]) -> None:
    log = outside / "executions.log"
    if not log.exists():
        return
    for line in log.read_text().splitlines():
        event, fp, line_pid, what = line.split(" ", 3)
        if int(line_pid) == pid and event == "START":
            assert fp not in recorded, f"{what} ran again although its result was journaled"


def test_kill_9_at_random_instants_then_resume(tmp_path: Path) -> None:
    reference, _, _, ref_ws, ref_out = run_to_completion(tmp_path / "reference", None, 0)
    ref_files = {p.name: p.read_text() for p in ref_ws.iterdir() if p.is_file()}
    assert reference["tests"] == "passed"

    rng = random.Random(int(os.environ.get("STASHPOINT_HARNESS_SEED", "20261122")))
    total = 0
    scenario = 0
    while total < KILLS_WANTED:
        scenario += 1
        base = tmp_path / f"run{scenario}"
        result, kills, store, ws, outside = run_to_completion(base, rng, 25)
        total += kills
        assert result == reference, f"scenario {scenario} ended differently"
        assert {p.name: p.read_text() for p in ws.iterdir() if p.is_file()} == ref_files

        effects = [
            line.rsplit(" ", 1)[0] for line in (outside / "effects.log").read_text().splitlines()
        ]
        assert sorted(effects) == sorted(
            line.rsplit(" ", 1)[0] for line in (ref_out / "effects.log").read_text().splitlines()
        ), f"scenario {scenario}: an irreversible effect ran {Counter(effects)}"

        journal = recorded_steps(store)
        assert all(n == 1 for n in journal.values()), journal
        ends = Counter(
            line.split(" ")[1]
            for line in (outside / "executions.log").read_text().splitlines()
            if line.startswith("END ")
        )
        assert set(ends) == set(journal)  # every recorded step ran (at least) once

        verify = cli(store, "verify")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        tasks = json.loads(cli(store, "tasks", "--json").stdout)
        assert [t["status"] for t in tasks] == ["completed"] * 4
        leftovers = [p for p in store.rglob("*") if ".stashpoint-tmp-" in p.name]
        assert leftovers == []
    assert total >= KILLS_WANTED
    print(f"{total} kills over {scenario} scenarios; decisions: {dict(STATS)}")
