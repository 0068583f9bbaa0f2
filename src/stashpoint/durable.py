"""Durable execution: steps that run once, task progress, a side-effect ledger, approval gates.

A durable run journals every call it makes through :meth:`Session.step`, :meth:`Session.tool`,
:meth:`Session.plan` and :meth:`Session.task` into an append-only log (the same kind of log as
the conversation: hash-chained rows, forked without copying). When the process dies and the
program runs again, it re-executes from the top and every call that has a journal entry returns
the recorded result instead of running its body — so the program must make the same durable
calls in the same order, and keep its non-determinism (LLM calls, clocks, I/O) inside steps.

Each call takes a *slot*: its number in call order. Entries carry their slot, so a replay looks
calls up by slot, not by log position, and concurrent async steps may finish in any order.

Entries (JSON objects; ``k`` is the kind, ``s`` the slot)::

    step      n, fp, ok, r | e        a step's result or error
    intent    n, fp, key, a           an irreversible tool is about to run (its arguments)
    effect    n, fp, key, ok, r | e   what it did (or a human's "it happened" / "reject")
    resolve   key, outcome=retry      a human said an in-doubt effect did not happen: run again
    request   n, fp, id, a            an approval-gated tool asks for a decision
    decision  id, fp, approved, why   the decision, appended by ``approve`` / ``reject``
    cancel    id, why                 an edit withdrew the request: the call asks again
    plan      tasks                   the task list
    task      id, status, note        a task changed status
    done      ok, r                   the run's return value

A journal belongs to a branch through a *run record* (store meta ``run:<session>:<branch>``):
the log that receives appends and the checkpoint the run started from. Rewinding or forking
ends the run, so a later run starts a new log from the target's journal: its steps replay up
to the target and execute afresh after it.
"""

from __future__ import annotations

import builtins
import contextvars
import functools
import hashlib
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import msgspec

from . import serde
from ._ids import new_id
from ._runs import record_applies, run_key
from .errors import (
    ConflictError,
    DivergenceError,
    IntegrityError,
    LeaseHeld,
    LeaseLost,
    NotFoundError,
    SerializationError,
    StashpointError,
    StashpointWarning,
    StepFailed,
    ToolRejected,
    UsageError,
)
from .integrity import EMPTY_CHAIN, message_chain
from .model import Checkpoint, LogRef, utc_now_iso
from .stores.base import LogAppend, LogInfo

if TYPE_CHECKING:
    from .session import Session

__all__ = [
    "TASK_STATUSES",
    "Decision",
    "DivergenceError",
    "Effect",
    "Pending",
    "RunPaused",
    "RunResult",
    "Task",
    "ToolRejected",
    "current_effect_key",
]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

TASK_STATUSES = ("pending", "in_progress", "completed", "failed", "skipped")
_DONE_TASK = ("completed", "skipped")
_json = msgspec.json.Encoder()
_effect_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "stashpoint_effect_key", default=None
)
_unjson = msgspec.json.Decoder()
_nested: contextvars.ContextVar[tuple[tuple[object, list[int]], ...]] = contextvars.ContextVar(
    "stashpoint_nested_slots", default=()
)
"""(engine, slots) of the step and tool bodies running now, innermost last: each durable call
made inside a body adds its slot to every enclosing body's list of that engine."""


# -- errors and results -------------------------------------------------------------------
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


# -- fingerprints ---------------------------------------------------------------------------
def fingerprint(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """A digest of a call's arguments; arguments stashpoint cannot encode count by type only."""
    try:
        tree = [serde.to_tree(list(args)), serde.to_tree(dict(kwargs))]
    except StashpointError:
        tree = [[_loose(a) for a in args], {k: _loose(v) for k, v in sorted(kwargs.items())}]
    data = msgspec.json.encode([name, tree], order="sorted")
    return hashlib.sha256(data).hexdigest()[:32]


def _loose(value: Any) -> Any:
    try:
        return serde.to_tree(value)
    except StashpointError:
        t = type(value)
        return {"~type": f"{t.__module__}.{t.__qualname__}"}


def _error_tree(exc: BaseException) -> dict[str, Any]:
    t = type(exc)
    return {"type": f"{t.__module__}.{t.__qualname__}", "message": str(exc)}


_BUILTIN_ERRORS = {
    name: obj
    for name, obj in vars(builtins).items()
    if isinstance(obj, type) and issubclass(obj, Exception)
}


def _rebuild_error(err: Mapping[str, Any]) -> BaseException:
    """The recorded error again: builtin exception types by name, anything else as StepFailed
    (never importing or instantiating a class named by stored data)."""
    type_name, message = str(err.get("type", "")), str(err.get("message", ""))
    module, _, name = type_name.rpartition(".")
    if module == "builtins" and name in _BUILTIN_ERRORS:
        return _BUILTIN_ERRORS[name](message)
    if type_name == f"{__name__}.ToolRejected":
        return ToolRejected(message, tool=str(err.get("tool", "")), reason=err.get("reason"))
    return StepFailed(f"{type_name}: {message}", type_name=type_name)


# -- the journal ----------------------------------------------------------------------------
def compensation_key(session: str, branch: str) -> str:
    return f"compensate:{session}:{branch}"


def _compensation_pending(item: Mapping[str, Any]) -> Pending:
    """The in-doubt decision for a compensation that was running when the process died; its
    id is the compensated effect's idempotency key."""
    tool = f"compensation of {item['tool']}"
    return Pending("in_doubt", str(item["key"]), tool, item.get("args"), "compensation")


class Journal:
    """The live journal of one branch: the head checkpoint's entries plus a run's tail."""

    def __init__(self, session: Session, *, fresh: bool = False) -> None:
        self.session = session
        meta = session.store.meta
        head = session.head
        self.key = run_key(session.name, session.branch)
        raw = meta.get_meta(self.key)
        record: dict[str, Any] | None = json.loads(raw) if raw else None
        self.last_command: dict[str, Any] = {
            k: record[k] for k in ("argv", "cwd") if record is not None and k in record
        }
        if record is not None and not fresh and record_applies(record, head):
            self.record: dict[str, Any] | None = record
            log = str(record["log"])
            info = meta.log_info(log)
            if info is None:  # the run started but appended nothing yet
                self.new: LogInfo | None = LogInfo(
                    session.name, record["parent"], int(record["parent_len"]), 0
                )
                rows = self._rows(record["parent"], int(record["parent_len"]))
            else:
                self.new = None
                rows = self._rows(log, info.length)
            self.log: str | None = log
        else:
            self.record, self.log, self.new = None, None, None
            ref = head.journal if head is not None and not fresh else None
            rows = self._rows(ref.log, ref.length) if ref is not None else []
            if ref is not None and rows and rows[-1][0] != ref.hash:
                raise IntegrityError(f"journal log {ref.log} does not match checkpoint {head}")
        self.lock = threading.RLock()  # appends vs. a timer thread's checkpoint reading ref()
        self.after_append: Callable[[dict[str, Any]], None] | None = None
        self.chains = [c for c, _ in rows]
        self.entries: list[dict[str, Any]] = [_unjson.decode(d) for _, d in rows]
        self.fresh = fresh
        self.by_slot: dict[int, list[int]] = {}
        for i, e in enumerate(self.entries):
            self.by_slot.setdefault(int(e.get("s", -1)), []).append(i)
        comp = meta.get_meta(compensation_key(session.name, session.branch))
        self.compensation: dict[str, Any] | None = json.loads(comp) if comp else None

    def _rows(self, log: str | None, length: int) -> list[tuple[str, bytes]]:
        """(chain hex, data) of the first ``length`` entries, chain-verified."""
        if log is None or length == 0:
            return []
        out = []
        chain = EMPTY_CHAIN
        for stored, data in self.session._message_rows(log, length):
            chain = message_chain(chain, data)
            if bytes.fromhex(chain) != stored:
                raise IntegrityError(f"journal log {log} is corrupt")
            out.append((chain, data))
        return out

    @property
    def live(self) -> bool:
        return self.record is not None

    def start(self, *, argv: list[str] | None = None, cwd: str | None = None) -> None:
        """Become the run that appends: a new log continuing the head's journal. Refused
        before anything runs while another worker holds the session's lease (a resumed run
        too: its steps and side effects need the lease as much as a new one's)."""
        self.session.check_may_write()
        if self.record is not None:
            return
        head = self.session.head
        ref = head.journal if head is not None and not self.fresh else None
        self.log = new_id()
        parent, parent_len = (ref.log, ref.length) if ref is not None else (None, 0)
        self.new = LogInfo(self.session.name, parent, parent_len, parent_len)
        self.record = {
            "log": self.log,
            "base": head.id if head is not None else None,
            "parent": parent,
            "parent_len": parent_len,
            "argv": argv if argv is not None else list(getattr(sys, "orig_argv", sys.argv)),
            "cwd": cwd if cwd is not None else os.getcwd(),
            "started": utc_now_iso(),
        }
        self.session.store.meta.set_meta(self.key, json.dumps(self.record))

    def ref(self) -> LogRef | None:
        """What a checkpoint taken now records as its journal."""
        with self.lock:
            return self._ref()

    def _ref(self) -> LogRef | None:
        if not self.entries:
            return None
        if self.new is not None:  # nothing appended to our own log: point at the parent's
            assert self.new.parent is not None
            return LogRef(self.new.parent, len(self.entries), self.chains[-1])
        assert self.log is not None
        return LogRef(self.log, len(self.entries), self.chains[-1])

    def append(self, entry: dict[str, Any]) -> int:
        """Durably append one entry; its index. ConflictError if another process appended."""
        with self.lock:
            return self._append(entry)

    def _append(self, entry: dict[str, Any]) -> int:
        if self.record is None:
            self.start()
        assert self.log is not None
        if self.session.redactor is not None:  # step results and arguments may hold secrets
            entry = self.session.redactor(entry)
        data = _json.encode(entry)
        prev = self.chains[-1] if self.chains else EMPTY_CHAIN
        chain = message_chain(prev, data)
        start = len(self.entries)
        try:
            self.session.store.meta.append_log(
                LogAppend(
                    self.log,
                    start,
                    [(bytes.fromhex(chain), data)],
                    self.new,
                    fence=self.session.fence,
                    session=self.session.name,
                )
            )
        except LeaseHeld:
            raise
        except LeaseLost as exc:
            if self.session.lease is not None:  # no later step body runs
                self.session.lease.mark_lost(str(exc))
            raise
        except ConflictError:
            raise ConflictError(
                f"session {self.session.name!r} branch {self.session.branch!r} is being run by "
                "another process (its journal moved); stop one of them"
            ) from None
        self.new = None
        self.entries.append(entry)
        self.chains.append(chain)
        self.by_slot.setdefault(int(entry.get("s", -1)), []).append(start)
        if self.after_append is not None:
            self.after_append(entry)
        return start

    def slot(self, s: int) -> list[dict[str, Any]]:
        """The slot's entries since its last ``cancel`` (an operator's edit withdrew a pending
        approval request: the call asks again, with whatever arguments it now has)."""
        entries = [self.entries[i] for i in self.by_slot.get(s, ())]
        for i in range(len(entries) - 1, -1, -1):
            if entries[i].get("k") == "cancel":
                return entries[i + 1 :]
        return entries

    def cancel_pending(
        self, why: str, *, command: Mapping[str, Any] | None = None
    ) -> list[Pending]:
        """Withdraw every unanswered approval request (their arguments may be stale now): each
        such call asks again, with whatever arguments it then has. A journal that no run is
        appending to (a new branch, a run a rewind ended) gets a run record first, carrying
        ``command`` (default: the branch's last recorded command)."""
        open_requests = [
            (s, p) for s, p in self.open_decisions() if s is not None and p.kind == "approval"
        ]
        if not open_requests:
            return []
        if not self.live:
            cmd = self.last_command if command is None else command
            self.start(argv=list(cmd.get("argv") or []), cwd=cmd.get("cwd"))
        for s, pending in open_requests:
            self.append({"k": "cancel", "s": s, "id": pending.id, "why": why})
        return [p for _, p in open_requests]

    # -- derived views ----------------------------------------------------------------------
    def tasks(self, upto: int | None = None) -> list[Task]:
        return fold_tasks(self.entries[:upto])

    def pending(self) -> Pending | None:
        """The first decision the run is waiting for (see :meth:`open_decisions`), or None."""
        found = self.open_decisions()
        return found[0][1] if found else None

    def all_pending(self) -> list[Pending]:
        """Every decision the run is waiting for, in call order."""
        return [p for _, p in self.open_decisions()]

    def open_decisions(self) -> list[tuple[int | None, Pending]]:
        """(slot, decision) for each decision the run waits for: an unanswered approval
        request, or an effect whose outcome is unknown (the process died between intent and
        outcome) - at any slot, since concurrent async calls journal in any order. A
        compensation that was running when the process died comes first (slot None): it
        blocks the run before its first call."""
        out: list[tuple[int | None, Pending]] = []
        comp = self.compensation_in_doubt()
        if comp is not None:
            out.append((None, comp))
        if not self.entries or self.entries[-1].get("k") == "done":
            return out
        for s in sorted(self.by_slot):
            entries = self.slot(s)
            if s < 0 or not entries:
                continue
            first, last = entries[0], entries[-1]
            k = first.get("k")
            if k == "request" and not any(e.get("k") == "decision" for e in entries[1:]):
                ident, fp = str(first["id"]), str(first["fp"])
                out.append((s, Pending("approval", ident, str(first["n"]), first.get("a"), fp)))
            elif k == "intent" and last.get("k") == "intent":
                ident, fp = str(last["key"]), str(last["fp"])
                out.append((s, Pending("in_doubt", ident, str(last["n"]), last.get("a"), fp)))
        return out

    def compensation_in_doubt(self) -> Pending | None:
        """A compensation whose intent is recorded but not its outcome, and no human decided."""
        plan = self.compensation
        running = plan.get("running") if plan is not None else None
        if not running or running.get("resolution") is not None:
            return None
        return _compensation_pending(running)

    def effects(self, start: int = 0) -> list[Effect]:
        """The ledger from log position ``start``: each logical irreversible call once."""
        out: dict[str, Effect] = {}
        for pos in range(start, len(self.entries)):
            e = self.entries[pos]
            k = e.get("k")
            if k == "intent":
                key = str(e["key"])
                out[key] = Effect(key, str(e["n"]), e.get("a"), "in_doubt", None, pos)
            elif k == "effect":
                key = str(e["key"])
                prev = out.get(key)
                status: Literal["done", "failed"] = "done" if e.get("ok") else "failed"
                args = prev.args if prev is not None else e.get("a")
                out[key] = Effect(key, str(e["n"]), args, status, e.get("r"), pos)
            elif k == "resolve":
                out.pop(str(e["key"]), None)  # "it did not happen": retried under a new intent
        return [x for x in out.values() if x.status != "failed"]

    def status(self) -> str:
        if any(e.get("k") == "done" for e in self.entries[-1:]):
            return "completed"
        p = self.pending()
        if p is not None:
            return "awaiting_approval" if p.kind == "approval" else "in_doubt"
        return "running" if self.live else ("idle" if not self.entries else "stopped")


def fold_tasks(entries: list[dict[str, Any]]) -> list[Task]:
    """Task statuses after these journal entries: the plan, then every status change."""
    tasks: dict[str, Task] = {}
    for e in entries:
        k = e.get("k")
        if k == "plan":
            for tid, title in e.get("tasks", []):
                tasks.setdefault(str(tid), Task(str(tid), str(title)))
        elif k == "task":
            t = tasks.setdefault(str(e["id"]), Task(str(e["id"]), str(e["id"])))
            t.status, t.note = str(e["status"]), e.get("note")
    return list(tasks.values())


def end_run(session: Session) -> None:
    """The branch's run is over (a rewind moved its execution position): the next run starts
    a new journal from the head. The command that ran it is kept, for ``stashpoint resume``."""
    meta, key = session.store.meta, run_key(session.name, session.branch)
    raw = meta.get_meta(key)
    if raw is None:
        return
    record = json.loads(raw)
    if "log" in record:
        meta.set_meta(key, json.dumps({k: record[k] for k in ("argv", "cwd") if k in record}))


def common_prefix(a: Journal, ref: LogRef | None, session: Session) -> int:
    """How many leading entries journal ``a`` shares with the journal ``ref`` points at."""
    if ref is None:
        return 0
    n = min(ref.length, len(a.chains))
    if n == ref.length and n and a.chains[n - 1] == ref.hash:
        return n
    rows = session._message_rows(ref.log, ref.length)
    chain, k = EMPTY_CHAIN, 0
    for k in range(min(len(rows), len(a.chains))):
        chain = message_chain(chain, rows[k][1])
        if a.chains[k] != chain:
            return k
    return min(len(rows), len(a.chains))


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

    def after_append(self, entry: dict[str, Any]) -> None:
        if entry.get("k") in ("step", "effect"):
            self.event("REC", int(entry["s"]), str(entry.get("n")))
        self.event("APP", int(entry.get("s", -1)), str(entry.get("k")))
        self.appends += 1
        if self.kill_at and self.appends == self.kill_at:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)


# -- the engine -----------------------------------------------------------------------------
class Durable:
    """Per-session durable-execution state: the registered steps and tools, the journal
    cursor and the checkpoint policy. :class:`Session` delegates to it."""

    def __init__(self, session: Session, policy: frozenset[str]) -> None:
        self.session = session
        self.policy = policy
        self.tools: dict[str, _ToolSpec] = {}
        self.resources: dict[str, Callable[[], Any]] = {}
        self._live_resources: dict[str, Any] = {}
        self.state_provider: Callable[[], Mapping[str, Any]] | None = None
        self.journal: Journal | None = None
        self._slot = 0
        self._skip: set[int] = set()
        """Slots of calls made inside a step or tool body that replayed: taken by nobody."""
        self.replayed = 0
        self.executed = 0
        self._depth = 0
        self.chaos = ChaosHooks.from_env()
        self.offload: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None
        """How async steps run their journal I/O off the event loop (default: a worker
        thread; :class:`stashpoint.aio.AsyncSession` puts it in its session queue)."""

    # -- run lifecycle ----------------------------------------------------------------------
    def begin(self, *, fresh: bool = False) -> Journal:
        j = Journal(self.session, fresh=fresh)
        head = self.session.head
        mine = self.session.config_hash
        if head is not None and j.entries and head.config_hash and mine != head.config_hash:
            import warnings

            warnings.warn(
                f"resuming session {self.session.name!r} under a different agent configuration "
                f"than checkpoint {head.id} was made with; recorded steps replay as recorded",
                StashpointWarning,
                stacklevel=4,
            )
        j.start()
        if self.chaos is not None:
            j.after_append = self.chaos.after_append
        self.journal, self._slot, self.replayed, self.executed = j, 0, 0, 0
        self._skip = set()
        self.run_pending_compensations(in_run=True)
        return j

    def end(self) -> None:
        self.journal = None

    async def _off(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` off the event loop: the fsynced journal append of an async
        step must not stall every other coroutine for the length of a disk flush."""
        call = functools.partial(fn, *args, **kwargs)
        if self.offload is not None:
            return cast(T, await self.offload(call))
        import asyncio  # here, not at the top: ~20 ms of every CLI run that only snapshots

        return await asyncio.to_thread(call)

    def _journal(self) -> Journal:
        if self.journal is None:
            self.begin()
        assert self.journal is not None
        return self.journal

    def _next_slot(self) -> int:
        if self.journal is None:  # a durable call outside run(): join or start the run
            self.begin()
        s = self._slot
        while s in self._skip:  # a replayed body's inner calls: not made again
            self._skip.discard(s)
            s += 1
        self._slot = s + 1
        for owner, used in _nested.get():
            if owner is self:
                used.append(s)
        return s

    def _skip_nested(self, entry: Mapping[str, Any]) -> None:
        """A step or tool replays without running its body: the slots its body's durable
        calls took stay taken, so the calls after it find their own entries."""
        self._skip.update(int(x) for x in entry.get("sub") or () if int(x) >= self._slot)

    @contextmanager
    def _nest(self) -> Iterator[list[int]]:
        """Collect the slots of the durable calls made inside a body (nested steps)."""
        used: list[int] = []
        token = _nested.set((*_nested.get(), (self, used)))
        try:
            yield used
        finally:
            _nested.reset(token)

    def _diverged(self, s: int, got: Mapping[str, Any], want: str) -> DivergenceError:
        j = self._journal()
        name = str(got.get("n") or got.get("id") or "")
        return DivergenceError(
            f"replay diverged at call #{s} of session {self.session.name!r}: the journal has "
            f"{got.get('k')} {name!r}"
            f"{' with other arguments' if name and name in want else ''}, "
            f"the program now calls {want}. A durable run must make the same calls in the "
            "same order (keep non-determinism inside steps); rewind to a checkpoint before "
            f"this call or start a fresh run. Journal {j.log}, {len(j.entries)} entries."
        )

    def _match(self, s: int, kind: str, name: str, fp: str) -> list[dict[str, Any]]:
        """The slot's entries if recorded (checking it is the same call), else []."""
        j = self._journal()
        entries = j.slot(s)
        if entries:
            first = entries[0]
            if first.get("k") != kind or first.get("n") != name or first.get("fp") != fp:
                if first.get("k") == "task" and first.get("auto"):
                    # "task failed" written on the way out of a crashed program (an exception
                    # outside any step): not a call the program made, so a re-run that went
                    # on differently supersedes it, as it would without tasks.
                    j.append({"k": "cancel", "s": s, "why": "the run went on past a failure"})
                    return []
                raise self._diverged(s, first, f"{kind} {name!r}")
        return entries

    def _after_live(self, trigger: str, message: str) -> None:
        if trigger in self.policy and self._depth == 0:
            self.checkpoint(kind="auto", message=message)

    def checkpoint(self, status: str = "running", **kwargs: Any) -> Checkpoint:
        """A checkpoint of the run: the tracked state (if any), the files, the journal."""
        state = self.state_provider() if self.state_provider is not None else None
        files = self.session.workspace is not None
        return self.session.checkpoint(state, status=status, files=files, **kwargs)

    # -- steps ------------------------------------------------------------------------------
    def step(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        retries: int = 0,
        backoff: float = 0.5,
    ) -> Callable[..., Any]:
        step_name: str = name or str(getattr(fn, "__qualname__", repr(fn)))
        at = self._step_at(fn, step_name, retries=retries, backoff=backoff)
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def astep(*args: Any, **kwargs: Any) -> Any:
                return await at(self._next_slot(), args, kwargs)

            return astep

        @functools.wraps(fn)
        def step(*args: Any, **kwargs: Any) -> Any:
            return at(self._next_slot(), args, kwargs)

        return step

    def _step_at(
        self, fn: Callable[..., Any], step_name: str, *, retries: int, backoff: float
    ) -> Callable[[int, tuple[Any, ...], dict[str, Any]], Any]:
        """The step as a call at a given slot (a gated tool takes its slots up front)."""
        if inspect.iscoroutinefunction(fn):

            async def astep(s: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                fp = fingerprint(step_name, args, kwargs)
                done = self._replay_step(s, step_name, fp)
                if done is not None:
                    return done()
                for attempt in range(retries + 1):
                    try:
                        with self._body(step_name, s) as sub:
                            value = await fn(*args, **kwargs)
                    except Exception as exc:
                        if attempt < retries:
                            import asyncio

                            await asyncio.sleep(backoff * 2**attempt)
                            continue
                        await self._off(self._record_step, s, step_name, fp, sub, error=exc)
                        raise
                    return await self._off(self._record_step, s, step_name, fp, sub, value=value)
                raise AssertionError("unreachable")  # pragma: no cover

            return astep

        def step(s: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            fp = fingerprint(step_name, args, kwargs)
            done = self._replay_step(s, step_name, fp)
            if done is not None:
                return done()
            for attempt in range(retries + 1):
                try:
                    with self._body(step_name, s) as sub:
                        value = fn(*args, **kwargs)
                except Exception as exc:
                    if attempt < retries:
                        time.sleep(backoff * 2**attempt)
                        continue
                    self._record_step(s, step_name, fp, sub, error=exc)
                    raise
                return self._record_step(s, step_name, fp, sub, value=value)
            raise AssertionError("unreachable")  # pragma: no cover

        return step

    @contextmanager
    def _body(self, name: str, slot: int) -> Iterator[list[int]]:
        """Around a step body: nesting depth (no policy checkpoints inside a step), the slots
        of the durable calls the body makes (journaled with the step, so that its replay skips
        them), and with ``checkpoint_interval`` a timer thread checkpointing while a long body
        runs."""
        if self.session.lease is not None:  # no step body, no side effect, outside the lease
            self.session.lease.check()
        if self.chaos is not None:
            self.chaos.event("EXEC", slot, name)
        self._depth += 1
        interval = self.session.checkpoint_interval
        stop = threading.Event()
        timer = None
        if interval is not None and self._depth == 1:

            def tick() -> None:
                n = 0
                while not stop.wait(interval):
                    n += 1
                    try:
                        self.checkpoint(kind="auto", message=f"{name}: running {n * interval:g} s")
                    except Exception as exc:  # never break the step it watches
                        import logging

                        logging.getLogger(__name__).warning("interval checkpoint failed: %s", exc)

            timer = threading.Thread(target=tick, name=f"stashpoint-interval-{name}", daemon=True)
            timer.start()
        try:
            with self._nest() as sub:
                yield sub
        finally:
            self._depth -= 1
            if timer is not None:
                stop.set()
                timer.join()

    def _replay_step(self, s: int, name: str, fp: str) -> Callable[[], Any] | None:
        entries = self._match(s, "step", name, fp)
        if not entries:
            return None
        e = entries[0]
        self.replayed += 1
        self._skip_nested(e)

        def result() -> Any:
            if e.get("ok"):
                return serde.from_tree(e.get("r"))
            raise _rebuild_error(e.get("e") or {})

        return result

    def _record_step(
        self,
        s: int,
        name: str,
        fp: str,
        sub: list[int],
        *,
        value: Any = None,
        error: BaseException | None = None,
    ) -> Any:
        entry: dict[str, Any] = {"k": "step", "s": s, "n": name, "fp": fp}
        if sub:
            entry["sub"] = sorted(sub)
        if error is None:
            entry["ok"], entry["r"] = True, serde.to_tree(value)
        else:
            entry["ok"], entry["e"] = False, _error_tree(error)
        self._journal().append(entry)
        self.executed += 1
        self._after_live("step", f"after step {name}")
        return value

    # -- tools ------------------------------------------------------------------------------
    def tool(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        irreversible: bool = False,
        approval: bool = False,
        compensate: Callable[..., Any] | None = None,
    ) -> Callable[..., Any]:
        tool_name: str = name or str(getattr(fn, "__qualname__", repr(fn)))
        spec = _ToolSpec(tool_name, irreversible or compensate is not None, approval, compensate)
        self.tools[tool_name] = spec
        as_step = (
            self._step_at(fn, tool_name, retries=0, backoff=0.0) if not spec.irreversible else None
        )

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def atool(*args: Any, **kwargs: Any) -> Any:
                # The gate's slot and the call's, taken together on the loop in call order:
                # concurrent gated calls come back from their gates in any order.
                gate = self._next_slot() if spec.approval else None
                s = self._next_slot()
                if gate is not None:
                    await self._off(self._gate, spec, gate, args, kwargs)
                if as_step is not None:
                    return await as_step(s, args, kwargs)
                key, settled = await self._off(self._effect_begin, spec, s, args, kwargs)
                if settled is not None:
                    return settled()
                token = _effect_key.set(key)
                try:
                    with self._nest() as sub:
                        value = await fn(*args, **kwargs)
                except Exception as exc:
                    await self._off(self._effect_end, spec, s, key, sub, error=exc)
                    raise
                finally:
                    _effect_key.reset(token)
                return await self._off(self._effect_end, spec, s, key, sub, value=value)

            return atool

        @functools.wraps(fn)
        def tool(*args: Any, **kwargs: Any) -> Any:
            if spec.approval:  # the call's slot after the gate's: a rejection takes only one
                self._gate(spec, self._next_slot(), args, kwargs)
            s = self._next_slot()
            if as_step is not None:
                return as_step(s, args, kwargs)
            key, settled = self._effect_begin(spec, s, args, kwargs)
            if settled is not None:
                return settled()
            token = _effect_key.set(key)
            try:
                with self._nest() as sub:
                    value = fn(*args, **kwargs)
            except Exception as exc:
                self._effect_end(spec, s, key, sub, error=exc)
                raise
            finally:
                _effect_key.reset(token)
            return self._effect_end(spec, s, key, sub, value=value)

        return tool

    def _gate(self, spec: _ToolSpec, s: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        fp = fingerprint(spec.name, args, kwargs)
        entries = self._match(s, "request", spec.name, fp)
        if not entries:
            req: dict[str, Any] = {"k": "request", "s": s, "n": spec.name, "fp": fp}
            req["id"] = new_id()
            req["a"] = _loose([list(args), kwargs])
            self._journal().append(req)
            self.executed += 1
            pending = Pending("approval", req["id"], spec.name, req["a"], fp)
            self._pause(pending, self._paused_checkpoint(pending))
        self.replayed += 1
        decision = next((e for e in entries[1:] if e.get("k") == "decision"), None)
        if decision is None:
            pending = Pending("approval", str(entries[0]["id"]), spec.name, entries[0].get("a"), fp)
            head = self.session.head
            if head is None or head.status != "awaiting_approval":  # died before checkpointing
                head = self._paused_checkpoint(pending)
            self._pause(pending, head)
        assert decision is not None
        if decision.get("fp") != fp:  # bound to the arguments it was given for
            raise self._diverged(s, decision, f"{spec.name!r} with other arguments")
        if not decision.get("approved"):
            reason = decision.get("why")
            raise ToolRejected(
                f"{spec.name} was rejected" + (f": {reason}" if reason else ""),
                tool=spec.name,
                reason=reason,
            )

    def _paused_checkpoint(self, pending: Pending) -> Checkpoint:
        """The checkpoint a paused run rests on, and the notification that someone must act."""
        from .notify import notify

        approval = pending.kind == "approval"
        cp = self.checkpoint(
            status="awaiting_approval" if approval else "in_doubt",
            kind="paused",
            message=f"waiting for approval of {pending.tool}"
            if approval
            else f"outcome of {pending.tool} unknown: decide before resuming",
            meta={"approval" if approval else "in_doubt": pending.to_dict()},
        )
        notify(self.session, self.session.notify, pending, cp)
        return cp

    def _pause(self, pending: Pending, cp: Checkpoint | None) -> None:
        if cp is not None and cp.status in ("awaiting_approval", "in_doubt"):
            pending = Pending(
                pending.kind, pending.id, pending.tool, pending.args, pending.fingerprint, cp.id
            )
        raise RunPaused(pending)

    def _effect_begin(
        self, spec: _ToolSpec, s: int, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, Callable[[], Any] | None]:
        """(idempotency key, recorded outcome or None): intent first, then the call."""
        fp = fingerprint(spec.name, args, kwargs)
        entries = self._match(s, "intent", spec.name, fp)
        if not entries:
            key = new_id()
            self._record_intent(spec, s, fp, key, args, kwargs)
            return key, None
        self.replayed += 1
        last = entries[-1]
        k = last.get("k")
        key = str(entries[0]["key"])
        if k == "effect":
            self._skip_nested(last)
            error: BaseException
            if last.get("ok") and "x" not in last:
                value = serde.from_tree(last.get("r"))
                return key, lambda: value
            if last.get("ok"):  # it happened, but its result could not be recorded
                error = SerializationError(str(last["x"]))
            else:
                error = _rebuild_error(last.get("e") or {})

            def fail() -> Any:
                raise error

            return key, fail
        if k == "resolve":  # a human said it did not happen: try again, same key
            self._record_intent(spec, s, fp, key, args, kwargs)
            return key, None
        # An intent with no outcome: the process died while the effect ran. Never re-run it
        # on a guess: pause until a human says whether it happened.
        pending = Pending("in_doubt", key, spec.name, last.get("a"), fp)
        cp = self.session.head
        if cp is None or cp.status != "in_doubt":
            cp = self._paused_checkpoint(pending)
        self._pause(pending, cp)
        raise AssertionError("unreachable")  # pragma: no cover - _pause raises

    def _record_intent(
        self,
        spec: _ToolSpec,
        s: int,
        fp: str,
        key: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        try:
            a = serde.to_tree([list(args), dict(kwargs)])
        except StashpointError as exc:
            raise UsageError(
                f"irreversible tool {spec.name}: its arguments are recorded in the side-effect "
                f"ledger and must be encodable ({exc})"
            ) from None
        if self.policy:  # any automatic policy: a checkpoint to rewind to before the effect
            self.checkpoint(kind="auto", message=f"before {spec.name}")
        intent = {"k": "intent", "s": s, "n": spec.name, "fp": fp, "key": key, "a": a}
        intent["t"] = utc_now_iso()
        self._journal().append(intent)
        if self.chaos is not None:
            self.chaos.event("EXEC", s, spec.name)

    def _effect_end(
        self,
        spec: _ToolSpec,
        s: int,
        key: str,
        sub: list[int],
        *,
        value: Any = None,
        error: BaseException | None = None,
    ) -> Any:
        entry: dict[str, Any] = {"k": "effect", "s": s, "n": spec.name, "key": key}
        entry["t"] = utc_now_iso()
        if sub:
            entry["sub"] = sorted(sub)
        refused: SerializationError | None = None
        if error is None:
            try:
                entry["ok"], entry["r"] = True, serde.to_tree(value)
            except StashpointError as exc:
                # The effect happened: the ledger says so (done, with the result's type only),
                # and this call fails now and on every replay, like a step's unencodable result.
                refused = SerializationError(
                    f"irreversible tool {spec.name} ran, but its result cannot be recorded for "
                    f"replay ({exc}); it is in the side-effect ledger as done. Return encodable "
                    "data from the tool"
                )
                entry["ok"], entry["r"], entry["x"] = True, _loose(value), str(refused)
        else:
            entry["ok"], entry["e"] = False, _error_tree(error)
        self._journal().append(entry)
        self.executed += 1
        self._after_live("tool", f"after {spec.name}")
        if refused is not None:
            raise refused
        return value

    # -- tasks ------------------------------------------------------------------------------
    def plan(self, tasks: list[str] | list[tuple[str, str]] | Mapping[str, str]) -> list[Task]:
        items: list[tuple[str, str]] = []
        if isinstance(tasks, Mapping):
            items = [(str(k), str(v)) for k, v in tasks.items()]
        else:
            for t in tasks:
                items.append((t, t) if isinstance(t, str) else (str(t[0]), str(t[1])))
        if len({i for i, _ in items}) != len(items):
            raise UsageError("task ids in a plan must be unique")
        s = self._next_slot()
        fp = hashlib.sha256(_json.encode(items)).hexdigest()[:32]
        entries = self._match(s, "plan", "plan", fp)
        if entries:
            self.replayed += 1
        else:
            self._journal().append(
                {"k": "plan", "s": s, "n": "plan", "fp": fp, "tasks": [list(x) for x in items]}
            )
        return self.tasks()

    def tasks(self) -> list[Task]:
        """Task statuses as of the current point of the run (replay-consistent)."""
        j = self._journal()
        upto = max((i for s in range(self._slot) for i in j.by_slot.get(s, ())), default=-1)
        return j.tasks(upto + 1)

    def remaining(self) -> list[Task]:
        return [t for t in self.tasks() if t.status not in _DONE_TASK]

    def set_task(
        self, task_id: str, status: str, note: str | None = None, *, auto: bool = False
    ) -> None:
        if status not in TASK_STATUSES:
            raise UsageError(f"task status must be one of {', '.join(TASK_STATUSES)}")
        s = self._next_slot()
        fp = f"{task_id}:{status}"
        entries = self._match(s, "task", "task", fp)
        if entries:
            self.replayed += 1
            return
        self._journal().append(
            {
                "k": "task",
                "s": s,
                "n": "task",
                "fp": fp,
                "id": task_id,
                "status": status,
                "note": note,
                **({"auto": True} if auto else {}),
            }
        )
        if status in ("completed", "failed", "skipped"):
            self._after_live("task", f"task {task_id} {status}")

    @contextmanager
    def task(self, task_id: str) -> Iterator[None]:
        self.set_task(task_id, "in_progress")
        try:
            yield
        except ToolRejected as exc:
            self.set_task(task_id, "skipped", str(exc))
            raise
        except Exception as exc:
            self.set_task(task_id, "failed", f"{type(exc).__name__}: {exc}", auto=True)
            raise
        self.set_task(task_id, "completed")

    # -- running a program ------------------------------------------------------------------
    def run(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *, fresh: bool
    ) -> RunResult:
        try:
            self.begin(fresh=fresh)
        except RunPaused as p:  # a compensation's outcome is unknown
            return self._paused(p)
        try:
            value = fn(*args, **kwargs)
        except RunPaused as p:
            return self._paused(p)
        except Exception as exc:
            self._failed(exc)
            raise
        return self._finish(value)

    async def arun(
        self,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        fresh: bool,
    ) -> RunResult:
        # The start (journal reads, pending compensations) and the end (a checkpoint with a
        # full workspace snapshot) block: off the loop, like every journal append.
        try:
            await self._off(self.begin, fresh=fresh)
        except RunPaused as p:  # a compensation's outcome is unknown
            return self._paused(p)
        try:
            value = await fn(*args, **kwargs)
        except RunPaused as p:
            return self._paused(p)
        except Exception as exc:
            await self._off(self._failed, exc)
            raise
        return await self._off(self._finish, value)

    def _paused(self, p: RunPaused) -> RunResult:
        status: Literal["awaiting_approval", "in_doubt"] = (
            "awaiting_approval" if p.pending.kind == "approval" else "in_doubt"
        )
        res = RunResult(status, None, p.pending, self.replayed, self.executed)
        self.end()
        return res

    def _failed(self, exc: Exception) -> None:
        try:
            self.session.checkpoint(
                self.state_provider() if self.state_provider else None,
                kind="auto",
                status="failed",
                message=f"run failed: {type(exc).__name__}: {exc}"[:500],
                files=self.session.workspace is not None,
            )
        finally:
            self.end()

    def _finish(self, value: Any) -> RunResult:
        s = self._next_slot()
        j = self._journal()
        entries = j.slot(s)
        if entries and entries[0].get("k") == "done":
            recorded = serde.from_tree(entries[0].get("r"))
            if not self._completion_recorded(j):  # the process died right after "done"
                self._completed_checkpoint()
            res = RunResult("completed", recorded, None, self.replayed, self.executed)
            self.end()
            return res
        if entries:
            raise self._diverged(s, entries[0], "the end of the run")
        try:
            tree = serde.to_tree(value)
        except StashpointError:
            tree = None
        j.append({"k": "done", "s": s, "ok": True, "r": tree})
        self._completed_checkpoint()
        res = RunResult("completed", value, None, self.replayed, self.executed)
        self.end()
        return res

    def _completed_checkpoint(self) -> None:
        self.session.checkpoint(
            self.state_provider() if self.state_provider else None,
            kind="milestone",
            status="completed",
            message="run completed",
            files=self.session.workspace is not None,
        )

    def _completion_recorded(self, j: Journal) -> bool:
        """Whether the branch has the "run completed" checkpoint of this journal: a completed
        checkpoint among the head and its ancestors that hold the whole journal."""
        n, chain = len(j.entries), j.chains[-1]
        cp = self.session.head
        while cp is not None and cp.journal is not None:
            if cp.journal.length != n or cp.journal.hash != chain:
                return False
            if cp.status == "completed":
                return True
            try:
                cp = self.session.store.get(cp.parent) if cp.parent else None
            except StashpointError:  # pruned history: take the checkpoint again
                return False
        return False

    # -- resources --------------------------------------------------------------------------
    def resource(self, name: str) -> Any:
        """The live object for a registered resource, created once per process."""
        if name not in self._live_resources:
            factory = self.resources.get(name)
            if factory is None:
                raise NotFoundError(f"no resource {name!r} is registered on this session")
            self._live_resources[name] = factory()
        return self._live_resources[name]

    # -- compensation -----------------------------------------------------------------------
    def request_compensation(self, effects: list[Effect]) -> None:
        meta = self.session.store.meta
        key = compensation_key(self.session.name, self.session.branch)
        todo = [e.to_dict() for e in reversed(effects)]  # newest first: a saga unwinds
        plan: dict[str, Any] = {"todo": todo, "done": []}
        raw = meta.get_meta(key)
        running = json.loads(raw).get("running") if raw else None
        if running is not None:  # a compensation in doubt stays first, to be decided
            item = {k: v for k, v in running.items() if k not in ("t", "resolution")}
            plan["todo"] = [item, *(t for t in todo if t["key"] != item["key"])]
            plan["running"] = running
        meta.set_meta(key, json.dumps(plan))

    def run_pending_compensations(self, *, in_run: bool = False) -> list[dict[str, Any]]:
        """Run requested compensations whose functions this process registered, newest
        effect first, each recorded; the rest stay requested (for the program that has them).

        Each compensation is an external action too: its intent is recorded before it runs.
        One that was running when the process died is in doubt - it is never run again on a
        guess: a run (``in_run``) pauses until a human says whether it happened (``approve
        --done``), should run again (``approve``) or be given up (``reject``)."""
        meta = self.session.store.meta
        key = compensation_key(self.session.name, self.session.branch)
        raw = meta.get_meta(key)
        if raw is None:
            return []
        plan = json.loads(raw)
        done: list[dict[str, Any]] = plan["done"]
        for item in list(plan["todo"]):
            spec = self.tools.get(item["tool"])
            if spec is None:
                return done  # later: when the program that registers the tool runs
            record: dict[str, Any] = {"key": item["key"], "tool": item["tool"]}
            running = plan.get("running")
            decided = None
            if running is not None and running.get("key") == item["key"]:
                decided = running.get("resolution")
                if decided is None:  # an intent with no outcome: the process died in it
                    if not in_run:
                        return done
                    pending = _compensation_pending(running)
                    cp = self.session.head
                    if cp is None or cp.status != "in_doubt":
                        cp = self._paused_checkpoint(pending)
                    self._pause(pending, cp)
            if decided is not None and decided.get("outcome") != "retry":
                by = {"by": decided.get("by"), "reason": decided.get("why")}
                if decided.get("outcome") == "done":
                    record.update(ok=True, result=decided.get("result"), **by)
                else:
                    record.update(ok=None, skipped="rejected", **by)
            elif spec.compensate is None:
                record.update(ok=None, skipped="the tool has no compensation")
            else:
                plan["running"] = {**item, "t": utc_now_iso()}  # the intent, first
                meta.set_meta(key, json.dumps(plan))
                args, kwargs = serde.from_tree(item["args"]) if item["args"] else ([], {})
                try:
                    out = spec.compensate(serde.from_tree(item["result"]), *args, **kwargs)
                    record.update(ok=True, result=_loose(out))
                except Exception as exc:
                    record.update(ok=False, error=_error_tree(exc))
            done.append(record)
            plan["todo"].remove(item)
            plan.pop("running", None)
            meta.set_meta(key, json.dumps(plan))
        self.session.checkpoint(
            kind="auto",
            message=f"compensated {len(done)} effect(s)",
            meta={"compensations": done},
            files=False,
        )
        meta.set_meta(key, None)
        return done


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
    who = by or _user()
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
        entry: dict[str, Any]
        if pending.kind == "approval":
            if mark_done:
                raise UsageError("--done applies to an in-doubt effect, not to an approval")
            entry = {"k": "decision", "s": s, "id": pending.id, "fp": pending.fingerprint}
            entry.update({"approved": approved, "why": reason, "by": who, "t": utc_now_iso()})
        elif approved and not mark_done:
            entry = {"k": "resolve", "s": s, "key": pending.id, "outcome": "retry", "by": who}
            entry.update({"why": reason, "t": utc_now_iso()})
        else:
            entry = {"k": "effect", "s": s, "n": pending.tool, "key": pending.id, "by": who}
            entry["t"] = utc_now_iso()
            if approved:
                entry["ok"], entry["r"] = True, serde.to_tree(done_result)
            else:
                entry["ok"] = False
                entry["e"] = {
                    "type": f"{__name__}.ToolRejected",
                    "message": f"{pending.tool} was rejected" + (f": {reason}" if reason else ""),
                    "tool": pending.tool,
                    "reason": reason,
                }
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


def _user() -> str:
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
    next_task = next((t for t in tasks if t.status not in _DONE_TASK), None)
    return {
        "session": session.name,
        "branch": session.branch,
        "status": j.status(),
        "head": head.id if head else None,
        "journal": len(j.entries),
        "steps": sum(1 for e in j.entries if e.get("k") == "step"),
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
    return fold_tasks([_unjson.decode(d) for _, d in rows])
