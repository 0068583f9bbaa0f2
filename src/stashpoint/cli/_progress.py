"""Progress display for long operations: silent for quick ones, a rich bar for slow ones.

The bar appears only after half a second and only on a terminal, so scripts and agent hooks
see clean output, and rich is imported only when a bar is actually drawn.
"""

from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["ByteProgress", "StepProgress"]

_DELAY_S = 0.5


class ByteProgress:
    def __init__(self, label: str, *, enabled: bool = True) -> None:
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self._start = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> ByteProgress:
        self._start = time.monotonic()
        return self

    def __call__(self, files: int, nbytes: int) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            if time.monotonic() - self._start < _DELAY_S:
                return
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TransferSpeedColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[files]} files"),
                TransferSpeedColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=None, files=0)
        self._bar.update(self._task, completed=nbytes, files=files)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


class StepProgress:
    """A bar over a known number of steps (``progress(done, total)``), shown like
    :class:`ByteProgress`: after half a second, on a terminal only."""

    def __init__(self, label: str, *, enabled: bool = True) -> None:
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self._start = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> StepProgress:
        self._start = time.monotonic()
        return self

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            if time.monotonic() - self._start < _DELAY_S:
                return
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=total)
        self._bar.update(self._task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
