"""Human decisions on a paused run - approving or rejecting a gated call, saying whether an
in-doubt effect happened - and the status a person looks at before deciding."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import serde
from ..errors import NotFoundError, StashpointError, UsageError
from ..metakeys import compensation_key
from ..model import Checkpoint, utc_now_iso
from .entries import (
    TOOL_REJECTED,
    DecisionEntry,
    EffectEntry,
    ErrorInfo,
    JournalEntry,
    ResolveEntry,
    StepEntry,
    decode_rows,
)
from .journal import Journal, fold_tasks
from .results import DONE_TASK, Pending, Task

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["decide", "run_status", "tasks_at", "user"]


def decide(
    session: Session,
    ident: str | None,
    *,
    approved: bool,
    reason: str | None = None,
    by: str | None = None,
    done_result: Any = None,
    mark_done: bool = False,
) -> Checkpoint:
    """Record a human decision on what the branch's run waits for (``approve`` / ``reject``).

    ``ident`` may be the request id, the in-doubt effect's key, the paused checkpoint's id (or
    a prefix, label, ``HEAD``), or None for the first pending decision in call order (the one
    ``stashpoint resume --dry-run`` shows; concurrent async calls may wait for several). The
    decision is appended to the run's journal, where the resumed run consumes it once (a
    compensation's, to the compensation plan), and recorded as an ``approval`` checkpoint
    (who, when, why) so the history shows it.
    """
    j = Journal(session)
    found = j.open_decisions()
    if not found:
        raise NotFoundError(
            f"session {session.name!r} branch {session.branch!r} is not waiting for a decision"
        )
    s, pending = _choose(session, found, ident)
    who = by or user()
    if s is None:  # a compensation whose outcome is unknown
        if pending.kind != "in_doubt":  # pragma: no cover - compensations are in doubt only
            raise AssertionError(pending)
        plan = j.compensation
        assert plan is not None and plan.get("running") is not None
        outcome = "retry" if approved and not mark_done else "done" if approved else "rejected"
        resolution: dict[str, Any] = {"outcome": outcome, "by": who, "why": reason}
        resolution["t"] = utc_now_iso()
        if outcome == "done":
            resolution["result"] = serde.to_tree(done_result)
        if session.redactor is not None:  # as journal entries are: a result may hold a secret
            resolution = dict(session.redactor(resolution))
        plan["running"]["resolution"] = resolution
        session.store.meta.set_meta(
            compensation_key(session.name, session.branch), json.dumps(plan)
        )
    else:
        if not j.live:
            raise NotFoundError(
                f"session {session.name!r} branch {session.branch!r} is not waiting for a decision"
            )
        entry: JournalEntry
        at = utc_now_iso()
        if pending.kind == "approval":
            if mark_done:
                raise UsageError("--done applies to an in-doubt effect, not to an approval")
            entry = DecisionEntry(
                slot=s,
                id=pending.id,
                fingerprint=pending.fingerprint,
                approved=approved,
                why=reason,
                by=who,
                at=at,
            )
        elif approved and not mark_done:
            entry = ResolveEntry(slot=s, key=pending.id, outcome="retry", by=who, why=reason, at=at)
        elif approved:
            result = serde.to_tree(done_result)
            entry = EffectEntry(
                slot=s, name=pending.tool, key=pending.id, by=who, at=at, ok=True, result=result
            )
        else:
            error = ErrorInfo(
                type=TOOL_REJECTED,
                message=f"{pending.tool} was rejected" + (f": {reason}" if reason else ""),
                tool=pending.tool,
                reason=reason,
            )
            entry = EffectEntry(
                slot=s, name=pending.tool, key=pending.id, by=who, at=at, ok=False, error=error
            )
        j.append(entry)
    verb = (
        "approved"
        if pending.kind == "approval" and approved
        else "rejected"
        if not approved
        else "marked done"
        if mark_done
        else "to retry"
    )
    decision: dict[str, Any] = {"kind": pending.kind, "id": pending.id, "tool": pending.tool}
    decision["decision"] = verb
    decision.update({"by": who, "reason": reason, "fingerprint": pending.fingerprint})
    extra: dict[str, Any] = {"journal": j.ref()} if j.live else {}
    return session.checkpoint(
        kind="approval",
        message=f"{pending.tool} {verb} by {who}" + (f": {reason}" if reason else ""),
        meta={"decision": decision},
        files=False,
        status="running",
        **extra,
    )


def _paused_on(cp: Checkpoint | None) -> str | None:
    """The id of the decision a paused checkpoint was taken for."""
    if cp is None:
        return None
    for k in ("approval", "in_doubt"):
        info = cp.meta.get(k)
        if isinstance(info, Mapping) and info.get("id") is not None:
            return str(info["id"])
    return None


def _choose(
    session: Session, found: list[tuple[int | None, Pending]], ident: str | None
) -> tuple[int | None, Pending]:
    """The open decision ``ident`` names: a request id or in-doubt key, a paused checkpoint
    (its own decision; the head: the first open one if its own is not open), or None for the
    first in call order (what ``stashpoint resume --dry-run`` shows)."""
    if ident is None:
        return found[0]
    for s, p in found:
        if p.id == ident:
            return s, p
    try:
        cp: Checkpoint | None = session.get(ident)
    except StashpointError:
        cp = None
    head = session.head
    if cp is not None:
        mine = _paused_on(cp)
        for s, p in found:
            if p.id == mine:
                return s, p
        if head is not None and cp.id == head.id:
            return found[0]
    waits = "; ".join(f"{p.kind} {p.id} ({p.tool})" for _, p in found)
    raise NotFoundError(f"no pending decision {ident!r}; the run waits for: {waits}")


def user() -> str:
    """Who decides, for the record: the login name."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for this uid (containers)
        return f"uid {os.getuid()}"


def run_status(session: Session) -> dict[str, Any]:
    """What ``stashpoint resume --dry-run`` and ``tasks`` show."""
    j = Journal(session)
    head = session.head
    paused = head if head is not None and head.status in ("awaiting_approval", "in_doubt") else None
    mine = _paused_on(paused)
    found = j.all_pending()
    if paused is not None and found and not any(p.id == mine for p in found):
        mine = found[0].id  # an older paused checkpoint: `approve HEAD` takes the first
    all_pending = [
        Pending(p.kind, p.id, p.tool, p.args, p.fingerprint, paused.id)
        if paused is not None and p.id == mine
        else p
        for p in found
    ]
    pending = all_pending[0] if all_pending else None
    tasks = j.tasks()
    next_task = next((t for t in tasks if t.status not in DONE_TASK), None)
    return {
        "session": session.name,
        "branch": session.branch,
        "status": j.status(),
        "head": head.id if head else None,
        "journal": len(j.entries),
        "steps": sum(1 for e in j.entries if type(e) is StepEntry),
        "pending": pending.to_dict() if pending else None,
        "pending_all": [p.to_dict() for p in all_pending],
        "tasks": [t.to_dict() for t in tasks],
        "next_task": next_task.to_dict() if next_task else None,
        "effects": [e.to_dict() for e in j.effects()],
        "command": j.last_command.get("argv"),
        "cwd": j.last_command.get("cwd"),
    }


def tasks_at(session: Session, cp: Checkpoint) -> list[Task]:
    """Task statuses recorded in one checkpoint's journal."""
    if cp.journal is None:
        return []
    rows = session._message_rows(cp.journal.log, cp.journal.length)
    return fold_tasks(decode_rows(rows, f"journal of checkpoint {cp.id}"))
