"""pytest plugin, opt-in: the ``stashpoint_chaos`` fixture.

Installing stashpoint does not load it into every pytest run (it would import the chaos
harness into projects that never asked for it). Enable it in a test suite's top-level
``conftest.py`` with ``pytest_plugins = ["stashpoint.testing.pytest_plugin"]``, or per run with
``pytest -p stashpoint.testing.pytest_plugin``. Then:

    def test_my_agent_recovers(stashpoint_chaos, tmp_path):
        report = stashpoint_chaos(["python", "agent.py"], source=project_dir, approve=True)
        assert report.ok, report.summary()

It runs :func:`stashpoint.chaos.run_chaos`: the agent killed after every step boundary and at
random instants, resumed until done, each run checked against an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ..chaos import ChaosReport, run_chaos


@pytest.fixture
def stashpoint_chaos() -> Callable[..., ChaosReport]:
    def chaos(command: list[str], *, source: str | Path = ".", **kwargs: Any) -> ChaosReport:
        return run_chaos(list(command), source=Path(source).resolve(), **kwargs)

    return chaos
