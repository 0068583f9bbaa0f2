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


class _DelayedBar:
    """What both bars share: the delay, the terminal check, start and stop. A subclass says
    which columns it shows (:meth:`_columns`) and what a call reports."""

    def __init__(self, label: str, *, enabled: bool = True) -> None:
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()
        self._start = time.monotonic()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Any:
        self._start = time.monotonic()
        return self

    @property
    def callback(self) -> Any:
        """This bar to hand to the library as its progress function, or None when it never
        draws (not a terminal, or --json): a scan then makes no call per file for nothing
        (50k calls of a first snapshot of 50k files, off the scanning thread's critical
        path)."""
        return self if self.enabled else None

    def _columns(self) -> list[Any]:
        raise NotImplementedError

    def _update(self, **fields: Any) -> None:
        """Draw the bar with ``fields`` once half a second has passed (nothing before)."""
        if not self.enabled:
            return
        if self._bar is None:
            if time.monotonic() - self._start < _DELAY_S:
                return
            from rich.console import Console
            from rich.progress import Progress

            self._bar = Progress(*self._columns(), console=Console(stderr=True), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=fields.get("total"), files=0)
        self._bar.update(self._task, **fields)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


class ByteProgress(_DelayedBar):
    """Bytes and files done, no known total (``progress(files, nbytes)``)."""

    def _columns(self) -> list[Any]:
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TransferSpeedColumn

        return [
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[files]} files"),
            TransferSpeedColumn(),
            TimeElapsedColumn(),
        ]

    def __call__(self, files: int, nbytes: int) -> None:
        self._update(completed=nbytes, files=files)


class StepProgress(_DelayedBar):
    """A bar over a known number of steps (``progress(done, total)``)."""

    def _columns(self) -> list[Any]:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        return [
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        ]

    def __call__(self, done: int, total: int) -> None:
        self._update(completed=done, total=total)
