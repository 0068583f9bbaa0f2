"""Recovery testing: ``stashpoint chaos`` and the ``stashpoint_chaos`` pytest fixture.

Each test can fail: the demo agent must recover from every kill, and two deliberately broken
agents - one that re-executes recorded steps, one whose output is not deterministic - must be
caught."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stashpoint.chaos import ChaosReport

pytestmark = pytest.mark.slow

AGENT = """
import random, sys
import stashpoint

store = stashpoint.open(".stashpoint")
run = store.session("main")

@run.step
def work(i):
    return i * i

def main():
    return [work(i) for i in range(4)]

fresh = "fresh" in sys.argv      # broken: starts over, re-running recorded steps
noisy = "noisy" in sys.argv      # broken: non-determinism outside steps
value = run.run(main, fresh=fresh).value
print(value, random.random() if noisy else "")
"""


def test_chaos_on_the_demo_agent_recovers_every_run(sp: Any, tmp_path: Path) -> None:
    agent = [sys.executable, "-m", "stashpoint._demo_agent", "--store", ".stashpoint"]
    agent += ["--workspace", ".", "--outside", "out", "--delay", "0.005"]
    res = sp(
        "--session",
        "durable-demo",
        "chaos",
        "--approve",
        "--random",
        "3",
        "--max-boundaries",
        "8",
        "--seed",
        "7",
        "--json",
        "--",
        *agent,
        cwd=tmp_path,
    )
    report = json.loads(res.out)
    assert report["ok"] and report["boundaries"] >= 15
    assert len(report["runs"]) == 11
    assert all(r["killed"] for r in report["runs"] if r["scenario"].startswith("boundary"))
    assert all(r["same_result"] and r["ran_twice"] == [] for r in report["runs"])
    assert json.loads(report["reference"].strip().splitlines()[-1])["tests"] == "passed"


def test_the_fixture_catches_an_agent_that_reruns_recorded_steps(
    stashpoint_chaos: Callable[..., ChaosReport], tmp_path: Path
) -> None:
    (tmp_path / "agent.py").write_text(textwrap.dedent(AGENT))
    report = stashpoint_chaos(
        [sys.executable, "agent.py", "fresh"], source=tmp_path, random_runs=0, seed=1
    )
    assert not report.ok
    twice = [r for r in report.runs if r.ran_twice]
    assert twice and all(r.same_result for r in report.runs)  # same output, but work redone
    assert "ran twice" in report.summary()

    good = stashpoint_chaos([sys.executable, "agent.py"], source=tmp_path, random_runs=2, seed=1)
    assert good.ok, good.summary()
    assert good.boundaries == 5  # four steps and the end of the run


def test_the_fixture_catches_output_that_is_not_deterministic(
    stashpoint_chaos: Callable[..., ChaosReport], tmp_path: Path
) -> None:
    (tmp_path / "agent.py").write_text(textwrap.dedent(AGENT))
    report = stashpoint_chaos(
        [sys.executable, "agent.py", "noisy"], source=tmp_path, random_runs=0, max_boundaries=2
    )
    assert not report.ok and not any(r.same_result for r in report.runs)
    assert "different result" in report.summary()


WRAPPED_AGENT = """
import os, sys, time
import stashpoint

store = stashpoint.open(".stashpoint")
run = store.session("main")

@run.step
def work(i):
    time.sleep(0.4)
    return i * i

value = run.run(lambda: [work(i) for i in range(4)]).value
with open(sys.argv[1], "a") as f:  # outside the scenario's copy: one line per finished process
    f.write(os.path.basename(os.getcwd()) + "\\n")
print(value)
"""


def test_a_random_kill_reaches_the_agent_behind_a_wrapper(
    stashpoint_chaos: Callable[..., ChaosReport], tmp_path: Path
) -> None:
    """`sh -c 'python agent.py; true'`: the kill must take the agent down, not only the shell
    (which left the agent to run to the end while the run counted as killed and recovered)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "agent.py").write_text(textwrap.dedent(WRAPPED_AGENT))
    finished = tmp_path / "finished.log"
    line = f"{shlex.quote(sys.executable)} agent.py {shlex.quote(str(finished))}; true"
    report = stashpoint_chaos(
        ["sh", "-c", line], source=src, boundaries=False, random_runs=2, seed=5
    )
    assert report.ok, report.summary()
    assert [r.killed for r in report.runs] == [True, True]
    # each scenario's agent finished once: in the resumed process, never in the killed one
    per_scenario = Counter(finished.read_text().split())
    assert per_scenario == {
        "reference": 1,
        **{r.scenario.replace(" ", "-"): 1 for r in report.runs},
    }
