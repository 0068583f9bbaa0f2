"""Progress bars of the command line: drawn only on a terminal, and otherwise not even called."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest

from stashpoint.cli._progress import ByteProgress, StepProgress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("bar", [ByteProgress, StepProgress])
def test_a_bar_that_never_draws_hands_no_callback_to_the_library(
    bar: type[ByteProgress] | type[StepProgress], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    assert bar("x").callback is None
    monkeypatch.setattr(sys, "stderr", _Tty())
    assert bar("x", enabled=False).callback is None  # (--json)
    on = bar("x")
    assert on.callback is on


def test_snap_without_a_terminal_scans_without_a_progress_callback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first snapshot of 50k files called the bar 50k times on the scanning thread, where
    no bar could ever be drawn (the output of a hook or a script)."""
    from stashpoint.cli import main
    from stashpoint.session import Session

    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(5):
        (ws / f"f{i}.txt").write_text(f"{i}\n")
    seen: list[Any] = []
    real = Session.checkpoint

    def checkpoint(self: Session, *args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("progress", "absent"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Session, "checkpoint", checkpoint)
    monkeypatch.setenv("STASHPOINT_NO_DAEMON", "1")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with pytest.raises(SystemExit) as done:
        main(["--store", str(tmp_path / "store"), "-C", str(ws), "--session", "s", "snap"])
    assert done.value.code == 0
    assert seen == [None]
