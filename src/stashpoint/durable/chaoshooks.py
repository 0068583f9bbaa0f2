"""Fault injection for ``stashpoint chaos``: the run reports its step boundaries and dies
at the one it is told to, so the runner can check that no recorded step runs twice."""

from __future__ import annotations

import os

from .entries import EffectEntry, Entry, StepEntry

__all__ = ["ChaosHooks"]


class ChaosHooks:
    """What ``stashpoint chaos`` asks of a run through the environment:
    ``STASHPOINT_CHAOS_LOG`` - append ``EXEC`` when a call's body starts, ``REC`` when its
    result is journaled, ``APP`` per journal append (one line each, so the runner can tell a
    body that ran again after its result was recorded); ``STASHPOINT_CHAOS_KILL_AT=N`` -
    SIGKILL this process right after its N-th journal append (a crash at a step boundary)."""

    def __init__(self, log: str | None, kill_at: int) -> None:
        self.log, self.kill_at, self.appends = log, kill_at, 0

    @classmethod
    def from_env(cls) -> ChaosHooks | None:
        log = os.environ.get("STASHPOINT_CHAOS_LOG") or None
        kill_at = int(os.environ.get("STASHPOINT_CHAOS_KILL_AT") or 0)
        if not (log or kill_at):
            return None
        hooks = cls(log, kill_at)
        if log is not None and os.path.exists(log):  # appends count across resumed processes
            with open(log, "rb") as f:
                hooks.appends = sum(1 for line in f if line.startswith(b"APP "))
        return hooks

    def event(self, kind: str, slot: int, name: str) -> None:
        if self.log is None:
            return
        fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{kind} {slot} {os.getpid()} {name}\n".encode())
        finally:
            os.close(fd)

    def after_append(self, entry: Entry) -> None:
        if isinstance(entry, (StepEntry, EffectEntry)):
            self.event("REC", entry.slot, entry.name)
        self.event("APP", entry.slot, entry.kind)
        self.appends += 1
        if self.kill_at and self.appends == self.kill_at:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
