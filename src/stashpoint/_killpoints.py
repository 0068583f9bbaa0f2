"""Named places where a test may SIGKILL this process (``$STASHPOINT_TEST_KILL_AT``).

Why: a crash between two writes (of an import, a copy, a restore) must leave nothing that the
next command cannot finish, and a test can only show that by killing the real CLI exactly
there, not at a random instant. Here, at the bottom of the package, so that every layer can
mark its own points.
"""

from __future__ import annotations

import os
import signal

KILL_ENV = "STASHPOINT_TEST_KILL_AT"
"""For tests only: ``NAME`` or ``NAME:N`` - SIGKILL this process the N-th time (default the
first) it passes the kill point ``NAME`` (``import-log``, ``import-record``, ``import-head``,
``copy-exported``, ``rewind-hooks``)."""
_kill_counts: dict[str, int] = {}


def kill_point(name: str) -> None:
    """A place where a test may kill this process (``$STASHPOINT_TEST_KILL_AT``, for tests
    only). Unset, it costs one environment lookup."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    point, _, count = spec.partition(":")
    if point != name:
        return
    seen = _kill_counts[name] = _kill_counts.get(name, 0) + 1
    if seen >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
