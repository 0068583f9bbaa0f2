"""Durability levels: how soon a checkpoint survives a power loss.

``fsync`` (the default) makes every checkpoint durable before ``checkpoint()`` returns. ``group``
commits checkpoints without waiting for the disk and flushes them together, every N checkpoints
or T milliseconds after the oldest unflushed one, whichever comes first. ``exit`` flushes only
when the store is closed or the process exits.

What the levels trade is survival of a *machine* crash (power loss, kernel panic) or a crash
of the database server: a killed agent process loses nothing at any level, since a committed
transaction is in the operating system's (or the server's) hands before ``checkpoint()``
returns. What a level never trades is integrity: a crash loses whole checkpoints from the
newest end, never leaves a damaged one, because SQLite and PostgreSQL keep their write-ahead
log ordered and a flush makes everything before it durable.

Backends: SQLite (``synchronous=NORMAL`` for deferred commits, an fsync of the WAL to flush)
and PostgreSQL (``synchronous_commit=off`` for the deferred commit, one synchronous commit to
flush) honour every level. The others are at least as durable as asked: the plain-file store
fsyncs every write, Redis persists as its server is configured, memory keeps nothing.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import TYPE_CHECKING, Literal

from . import config, metakeys
from .errors import UsageError

if TYPE_CHECKING:
    from .stores.base import Lifecycle

__all__ = ["DURABILITY_ENV", "DURABILITY_META", "Durability", "GroupCommit", "resolve"]

DURABILITY_META = metakeys.DURABILITY
"""Store meta key holding the store's default level."""

DURABILITY_ENV = config.DURABILITY.env[0]

Level = Literal["fsync", "group", "exit"]

_set = object.__setattr__


class Durability:
    """A durability level. Parse one from text with :meth:`parse`: ``fsync``, ``exit``,
    ``group`` (every 64 checkpoints or 100 ms), ``group:N``, ``group:Tms`` or ``group:N,Tms``.
    Immutable, compared and hashed by its fields."""

    __slots__ = ("every", "level", "ms")
    level: Level
    every: int | None
    """``group``: flush after this many deferred checkpoints (None: no count limit)."""
    ms: float | None
    """``group``: flush at the latest this many milliseconds after the oldest deferred one
    (None: no time limit)."""

    def __init__(
        self, level: Level = "fsync", every: int | None = None, ms: float | None = None
    ) -> None:
        _set(self, "level", level)
        _set(self, "every", every)
        _set(self, "ms", ms)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: a Durability is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: a Durability is immutable")

    def __repr__(self) -> str:
        return f"Durability(level={self.level!r}, every={self.every!r}, ms={self.ms!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Durability) and other.__class__ is self.__class__:
            return (self.level, self.every, self.ms) == (other.level, other.every, other.ms)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.level, self.every, self.ms))

    def __reduce__(self) -> tuple[type[Durability], tuple[Level, int | None, float | None]]:
        return Durability, (self.level, self.every, self.ms)  # copy and pickle: no __setattr__

    @classmethod
    def parse(cls, text: str | Durability) -> Durability:
        if isinstance(text, Durability):
            return text
        value = text.strip().lower()
        if value in ("fsync", "always", "full"):
            return cls("fsync")
        if value in ("exit", "at-exit", "close"):
            return cls("exit")
        if value == "group":
            return cls("group", 64, 100.0)
        head, colon, rest = value.partition(":")
        every: int | None = None
        ms: float | None = None
        try:
            if head != "group" or not colon or not rest:
                raise ValueError
            for part in rest.split(","):
                if part.endswith("ms") and ms is None:
                    ms = float(part[:-2])
                    if not ms > 0 or ms == float("inf"):
                        raise ValueError
                elif part.isdigit() and every is None:
                    every = int(part)
                    if every < 1:
                        raise ValueError
                else:
                    raise ValueError
        except ValueError:
            raise UsageError(
                f"unknown durability level {text!r}: use fsync, group (every 64 checkpoints or "
                "100 ms), group:N, group:Tms, group:N,Tms (N, T > 0) or exit"
            ) from None
        return cls("group", every, ms)

    @property
    def deferred(self) -> bool:
        """Whether commits at this level return before they are on disk."""
        return self.level != "fsync"

    def __str__(self) -> str:
        if self.level != "group":
            return self.level
        parts = [str(self.every)] if self.every else []
        parts += [f"{self.ms:g}ms"] if self.ms else []
        return "group:" + ",".join(parts)

    def describe(self) -> str:
        if self.level == "fsync":
            return "fsync every checkpoint"
        if self.level == "exit":
            return "flush when the store closes or the process exits"
        when = [f"{self.every} checkpoints"] if self.every else []
        when += [f"{self.ms:g} ms"] if self.ms else []
        return "group commit: flush every " + " or ".join(when)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"level": self.level, "text": str(self), "means": self.describe()}
        if self.level == "group":
            out.update(every=self.every, ms=self.ms)
        return out


def resolve(given: Durability | str | None, stored: str | None) -> Durability:
    """A store's level: the one given (API or URL), else ``$STASHPOINT_DURABILITY``, else
    ``durability`` in ``[tool.stashpoint]``, else the one recorded in the store (``stashpoint
    init --durability``), else ``fsync`` (:mod:`stashpoint.config`)."""
    found = config.value(config.DURABILITY, given or None, stored=stored or None)
    return Durability.parse(found)


class GroupCommit:
    """Flushes one metadata store's deferred commits on the schedule of each level.

    One per open store, shared by its sessions: a flush makes every commit before it durable,
    whichever session made it, and an ``fsync``-level commit of any session flushes the others'
    deferred ones as a side effect (both backends that defer keep one ordered log).
    """

    def __init__(self, meta: Lifecycle) -> None:
        self.meta = meta
        self._lock = threading.Lock()
        self._pending = 0
        self._timer: threading.Timer | None = None
        self._at_exit = False
        self.flushes = 0
        """How many flushes ran (for ``show`` and the tests)."""

    def committed(self, durability: Durability) -> None:
        """Note one commit made at ``durability``; flush when its level says so."""
        if not durability.deferred:
            with self._lock:
                self._pending = 0  # that commit flushed the log up to and including it
            return
        flush_now = False
        with self._lock:
            self._pending += 1
            self._register_exit()  # whatever the level, nothing deferred outlives the process
            if durability.level == "group":
                if durability.every is not None and self._pending >= durability.every:
                    flush_now = True
                elif durability.ms is not None and self._timer is None:
                    self._timer = threading.Timer(durability.ms / 1000.0, self._on_timer)
                    self._timer.daemon = True
                    self._timer.start()
        if flush_now:
            self.flush()

    @property
    def pending(self) -> int:
        return self._pending

    def flush(self) -> None:
        """Make every commit so far durable (a no-op when none is pending)."""
        with self._lock:
            timer, self._timer = self._timer, None
            pending = self._pending
        if timer is not None:
            timer.cancel()
        if pending:
            self.meta.flush()  # on failure they stay pending: a later flush tries again
            with self._lock:
                self.flushes += 1
                self._pending = max(0, self._pending - pending)  # later ones wait their turn

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
        try:
            self.flush()
        except Exception:  # a background flush must not kill the thread noisily
            import logging

            logging.getLogger("stashpoint").warning(
                "group-commit flush failed; the next checkpoint or close tries again",
                exc_info=True,
            )

    def _register_exit(self) -> None:
        if not self._at_exit:
            self._at_exit = True
            ref = weakref.ref(self)
            atexit.register(_flush_at_exit, ref)

    def close(self) -> None:
        """Flush what is pending (the store is closing)."""
        self.flush()


def _flush_at_exit(ref: weakref.ref[GroupCommit]) -> None:
    group = ref()
    if group is not None and group.pending:
        try:
            group.flush()
        except Exception:
            pass  # the store may already be closed; its close flushed
