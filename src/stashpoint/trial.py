"""Trials: try something from a checkpoint, then keep it or roll back.

The loop of a tree search or of RL rollouts: from a node (a checkpoint), change files and
state, judge the result, and either keep it or go back to the node, thousands of times on
one open store::

    with run.trial(node) as t:
        agent_step()
        if score() > best:
            t.keep(message="better")   # the workspace stays; t.result is the new node
    # not kept, or an exception: files and state are back at ``node``

Entering rewinds to the node if the workspace is elsewhere (nothing is written when it is
already there). Leaving without :meth:`Trial.keep` rewinds to it: only the paths that differ
are written, and with ``Session(watch=True)`` only the directories that changed are looked
at, so a trial that changed a few files of 10k costs a few milliseconds. The state the
trial reached is not lost: :attr:`Trial.result` is the checkpoint that records it (the
rewind's safety checkpoint), which a later trial can start from.

Trials nest (a search descending from a node it is trying): the inner one must end before
the outer one does, and an outer trial cannot be kept or rolled back while an inner one is
open. Every restore goes through :meth:`Session.rewind`, so it writes only where
:mod:`stashpoint.restore_target` allows.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from .errors import UsageError
from .model import Checkpoint

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Trial"]

Outcome = Literal["pending", "open", "kept", "rolled back"]

_open: weakref.WeakKeyDictionary[Session, list[Trial]] = weakref.WeakKeyDictionary()
"""Session -> its open trials, outermost first."""


class Trial:
    """One attempt from a checkpoint; made by :meth:`Session.trial`, used as a context
    manager. Rolls back on leaving the block unless :meth:`keep` was called, and on any
    exception raised in the block (which then propagates)."""

    def __init__(self, session: Session, ref: str | Checkpoint | None = None) -> None:
        self.session = session
        self._ref = ref.id if isinstance(ref, Checkpoint) else ref
        self.outcome: Outcome = "pending"
        self._base: Checkpoint | None = None
        self.result: Checkpoint | None = None
        """After :meth:`keep`: the kept checkpoint. After a rollback: the checkpoint that
        records what the trial had reached (rewind to it, or start a trial from it, to get
        it back)."""

    @property
    def base(self) -> Checkpoint:
        """The checkpoint the trial started from and rolls back to."""
        if self._base is None:
            raise UsageError("this trial has not started: use it as `with session.trial() as t`")
        return self._base

    # -- the block ---------------------------------------------------------------------
    def __enter__(self) -> Trial:
        if self.outcome != "pending":
            raise UsageError(f"this trial is {self.outcome}: a trial is entered once")
        s = self.session
        if self._ref is None:
            # From where the workspace is: a checkpoint of it (the head, if nothing changed).
            self._base = s.checkpoint(kind="auto", message="trial", skip_unchanged=True)
        else:
            target = s.get(self._ref)
            # Writes nothing and records nothing when the workspace is already there.
            s._rewind(target.id, reuse_head=True)
            self._base = target
        _open.setdefault(s, []).append(self)
        self.outcome = "open"
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.outcome != "open":
            return  # kept or rolled back inside the block
        if exc is None:
            self._check_innermost("leave")
        else:
            # An exception unwinding through nested blocks ends the inner ones first; one
            # still open here was entered by hand: roll it back too, innermost first.
            for inner in reversed(self._inner()):
                inner._rollback()
        self._rollback()

    # -- outcomes ----------------------------------------------------------------------
    def keep(
        self,
        state: Mapping[str, Any] | None = None,
        *,
        message: str | None = None,
        label: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Checkpoint:
        """End the trial keeping what it did: checkpoint the workspace (and ``state``, if
        given; else the head's) and leave it as it is. Returns the checkpoint."""
        self._check_innermost("keep")
        cp = self.session.checkpoint(state, message=message or "trial kept", label=label, meta=meta)
        self._end("kept", cp)
        return cp

    def rollback(self) -> Checkpoint:
        """End the trial now, going back to :attr:`base`; returns :attr:`result`."""
        self._check_innermost("roll back")
        return self._rollback()

    # -- internals ---------------------------------------------------------------------
    def _rollback(self) -> Checkpoint:
        # A trial checkpointed just before (nothing changed since) is its own undo point.
        done = self.session._rewind(self.base.id, reuse_head=True)
        self._end("rolled back", done.safety)
        return done.safety

    def _end(self, outcome: Outcome, result: Checkpoint) -> None:
        self.outcome, self.result = outcome, result
        stack = _open.get(self.session, [])
        if self in stack:
            stack.remove(self)

    def _inner(self) -> list[Trial]:
        stack = _open.get(self.session, [])
        return stack[stack.index(self) + 1 :] if self in stack else []

    def _check_innermost(self, what: str) -> None:
        if self.outcome != "open":
            raise UsageError(f"cannot {what} this trial: it is {self.outcome}")
        inner = self._inner()
        if inner:
            raise UsageError(
                f"cannot {what} this trial while a trial nested in it (from checkpoint "
                f"{inner[-1].base.id}) is open: end the inner one first"
            )

    def __repr__(self) -> str:
        base = self._base.id if self._base is not None else self._ref
        return f"<Trial from {base} {self.outcome}>"
