"""What a durable run reports to its caller: a result, a pause with the decision it waits
for, the task list and the side-effect ledger."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["TASK_STATUSES", "Decision", "Effect", "Pending", "RunPaused", "RunResult", "Task"]

TASK_STATUSES = ("pending", "in_progress", "completed", "failed", "skipped")
DONE_TASK = ("completed", "skipped")


@dataclass(frozen=True)
class Pending:
    """A decision a human has to make before the run can go on."""

    kind: Literal["approval", "in_doubt"]
    id: str
    """Approval request id, or the in-doubt effect's idempotency key."""
    tool: str
    args: Any
    fingerprint: str
    checkpoint: str | None = None
    """The checkpoint taken when the run paused (``stashpoint approve`` accepts it too)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "id": self.id,
            "tool": self.tool,
            "args": self.args,
            "fingerprint": self.fingerprint,
            "checkpoint": self.checkpoint,
        }


class RunPaused(BaseException):
    """Raised out of a gated tool to stop the run until a human decides.

    A BaseException so that an agent's ``except Exception`` does not swallow it;
    :meth:`Session.run` catches it and returns a paused :class:`RunResult`.
    """

    def __init__(self, pending: Pending) -> None:
        super().__init__(f"waiting for a decision on {pending.tool} ({pending.id})")
        self.pending = pending


@dataclass
class RunResult:
    status: Literal["completed", "awaiting_approval", "in_doubt"]
    value: Any = None
    pending: Pending | None = None
    replayed: int = 0
    """Calls answered from the journal in this process."""
    executed: int = 0
    """Calls that ran their body in this process."""

    @property
    def paused(self) -> bool:
        return self.status != "completed"


@dataclass
class Task:
    id: str
    title: str
    status: str = "pending"
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "status": self.status, "note": self.note}


@dataclass(frozen=True)
class Effect:
    """One irreversible external action in the ledger."""

    key: str
    """Idempotency key: the same across retries of one logical call."""
    tool: str
    args: Any
    status: Literal["done", "failed", "in_doubt"]
    result: Any = None
    position: int = 0
    """Index of the entry in the journal log."""
    compensable: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "tool": self.tool,
            "args": self.args,
            "status": self.status,
            "result": self.result,
            "position": self.position,
            "compensable": self.compensable,
        }


@dataclass(frozen=True)
class Decision:
    id: str
    approved: bool
    reason: str | None
    by: str


_effect_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "stashpoint_effect_key", default=None
)


@dataclass
class _ToolSpec:
    name: str
    irreversible: bool
    approval: bool
    compensate: Callable[..., Any] | None


def current_effect_key() -> str | None:
    """Idempotency key of the irreversible tool call running now: pass it to the API you call
    (e.g. an ``Idempotency-Key`` header), so a retry after an in-doubt crash, which reuses the
    key, cannot do the thing twice."""
    return _effect_key.get()
