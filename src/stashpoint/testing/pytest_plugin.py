"""pytest plugin (auto-loaded when stashpoint is installed): the ``stashpoint_chaos`` fixture.

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
