"""A session's durable-execution surface, written once: the decorators and task helpers a
durable program uses (:class:`DurableDecorators`, shared by :class:`~stashpoint.Session` and
:class:`~stashpoint.aio.AsyncSession`), and the run, its tasks, decisions and side-effect
ledger as a session reads them (:class:`DurableMethods`; the async session awaits these
same methods in its queue).

The engine itself is :mod:`stashpoint.durable`, imported on first use: a process that only
checkpoints (an agent hook) never loads it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from ._runs import UNREAD as _INHERIT
from ._runs import record_applies
from .errors import IntegrityError, UsageError
from .metakeys import run_key
from .model import Checkpoint, LogRef

if TYPE_CHECKING:
    from .durable import Durable, Effect, Pending, RunResult, Task
    from .session import Session

__all__ = ["DurableDecorators", "DurableMethods", "args_summary", "policy"]

F = TypeVar("F", bound=Callable[..., Any])

_POLICIES = ("step", "tool", "task")


def policy(spec: str | Iterable[str] | None) -> frozenset[str]:
    """The automatic checkpoints a ``checkpoint_every`` spec asks for."""
    if spec is None or spec == "manual":
        return frozenset()
    wanted = frozenset([spec] if isinstance(spec, str) else spec) - {"manual"}
    unknown = wanted - set(_POLICIES)
    if unknown:
        raise UsageError(
            f"unknown checkpoint policy {sorted(unknown)}: use step, tool, task or manual"
        )
    return wanted


def args_summary(args: Any, limit: int = 80) -> str:
    """``(to='a@b', n=2)`` from a ledger's recorded [args, kwargs], cut to ``limit``."""
    try:
        pos, kw = args
        parts = [repr(a) for a in pos] + [f"{k}={v!r}" for k, v in kw.items()]
    except (TypeError, ValueError, AttributeError):
        parts = [repr(args)]
    text = "(" + ", ".join(parts) + ")"
    return text if len(text) <= limit else text[: limit - 2] + "…)"


class DurableDecorators:
    """What a durable program calls while it runs: no store I/O of its own (journal appends
    happen inside the wrapped calls), so the same plain methods serve the sync and the
    async session."""

    def _engine(self) -> Durable:
        """The durable engine these register with (the sync session's)."""
        raise NotImplementedError

    @overload
    def step(self, fn: F, /) -> F: ...

    @overload
    def step(
        self, fn: None = None, /, *, name: str | None = None, retries: int = 0, backoff: float = 0.5
    ) -> Callable[[F], F]: ...

    def step(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        retries: int = 0,
        backoff: float = 0.5,
    ) -> F | Callable[[F], F]:
        """Decorator: a durable step. It runs once; its result (or error) is journaled, and
        when the program runs again after a crash the recorded result is returned instead.

        ``@run.step`` or ``@run.step(name="ask", retries=3)``; sync and async functions.
        Name steps explicitly when their ``__qualname__`` may change between versions.
        """

        def wrap(f: F) -> F:
            return cast(F, self._engine().step(f, name=name, retries=retries, backoff=backoff))

        return wrap if fn is None else wrap(fn)

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        irreversible: bool = False,
        approval: bool = False,
        compensate: Callable[..., Any] | None = None,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        irreversible: bool = False,
        approval: bool = False,
        compensate: Callable[..., Any] | None = None,
    ) -> F | Callable[[F], F]:
        """Decorator: a durable tool call. ``irreversible`` tools go into the side-effect
        ledger (intent before, outcome after: a crash in between is never silently re-run);
        ``approval`` tools pause the run until ``approve`` / ``reject``; ``compensate(result,
        *args, **kwargs)`` undoes an effect when a rewind asks for it (saga)."""

        def wrap(f: F) -> F:
            return cast(
                F,
                self._engine().tool(
                    f,
                    name=name,
                    irreversible=irreversible,
                    approval=approval,
                    compensate=compensate,
                ),
            )

        return wrap if fn is None else wrap(fn)

    def plan(self, tasks: Any) -> list[Task]:
        """Declare the task list (ids, or (id, title) pairs, or {id: title}); journaled."""
        return self._engine().plan(tasks)

    def task(self, task_id: str) -> AbstractContextManager[None]:
        """Context manager: the task is in_progress inside, completed after, failed (or
        skipped, for a rejected tool) on an exception."""
        return self._engine().task(task_id)

    def set_task(self, task_id: str, status: str, note: str | None = None) -> None:
        self._engine().set_task(task_id, status, note)

    def track(self, provider: Callable[[], Mapping[str, Any]]) -> Callable[[], Mapping[str, Any]]:
        """Register what automatic checkpoints of a durable run record as state."""
        self._engine().state_provider = provider
        return provider

    def resource(self, name: str) -> Callable[[F], F]:
        """Decorator: a factory that re-creates a live resource (database connection, API
        client) in each process; ``run.get_resource(name)`` returns it, created once."""

        def register(factory: F) -> F:
            self._engine().resources[name] = factory
            return factory

        return register

    def get_resource(self, name: str) -> Any:
        """The live resource, created once per process by its factory, on the caller's
        thread (a factory may build loop-bound objects, such as async clients)."""
        return self._engine().resource(name)


def tasks(self: Session, ref: str | Checkpoint | None = None) -> list[Task]:
    """Task statuses: as of the running program's position, or of a checkpoint."""
    from .durable import Journal, tasks_at

    if ref is not None:
        cp = self._as_checkpoint(ref)
        return tasks_at(self, cp) if cp is not None else []
    if self._durable is not None and self._durable.journal is not None:
        return self._durable.tasks()
    return Journal(self).tasks()


def remaining_tasks(self: Session) -> list[Task]:
    """Tasks not completed or skipped, in plan order: where a resumed run continues."""
    return self.durable.remaining()


def run(
    self: Session, fn: Callable[..., Any], *args: Any, fresh: bool = False, **kwargs: Any
) -> RunResult:
    """Run (or resume) ``fn`` as a durable program: calls already journaled on this
    branch return their recorded results; the rest execute. Returns when it completes or
    pauses for a decision (``result.status``); exceptions propagate after a ``failed``
    checkpoint. ``fresh`` starts a new run with an empty journal."""
    return self.durable.run(fn, args, kwargs, fresh=fresh)


async def arun(
    self: Session, fn: Callable[..., Any], *args: Any, fresh: bool = False, **kwargs: Any
) -> RunResult:
    """:meth:`run` for an async ``fn``."""
    return await self.durable.arun(fn, args, kwargs, fresh=fresh)


def pending(self: Session) -> Pending | None:
    """The decision the branch's run waits for, if any."""
    from .durable import Journal

    return Journal(self).pending()


def approve(
    self: Session,
    ident: str | None = None,
    *,
    reason: str | None = None,
    by: str | None = None,
    done: bool = False,
    result: Any = None,
) -> Checkpoint:
    """Approve what the run waits for. For an in-doubt effect: retry it, or with ``done``
    record that it happened (with ``result``) so it is not run again."""
    from .durable import decide

    return decide(
        self, ident, approved=True, reason=reason, by=by, mark_done=done, done_result=result
    )


def reject(
    self: Session, ident: str | None = None, *, reason: str | None = None, by: str | None = None
) -> Checkpoint:
    """Reject it: the resumed run's call raises :class:`ToolRejected`."""
    from .durable import decide

    return decide(self, ident, approved=False, reason=reason, by=by)


def effects(self: Session, since: str | Checkpoint | None = None) -> list[Effect]:
    """The side-effect ledger of the branch's journal (after checkpoint ``since``)."""
    from .durable import Journal, common_prefix

    j = Journal(self)
    start = 0
    if since is not None:
        cp = self._as_checkpoint(since)
        start = common_prefix(j, cp.journal if cp else None, self)
    return self._mark_compensable(j.effects(start))


def _mark_compensable(self: Session, effects: list[Effect]) -> list[Effect]:
    tools = self._durable.tools if self._durable is not None else {}
    return [
        dataclasses.replace(e, compensable=bool(tools.get(e.tool) and tools[e.tool].compensate))
        for e in effects
    ]


def _journal_ref(self: Session, head: Checkpoint | None) -> LogRef | None:
    """The durable-execution journal a new checkpoint records: the running program's, or
    the branch's live run (entries appended since the head, e.g. by a crashed run), or
    the head's."""
    if self._durable is not None and self._durable.journal is not None:
        return self._durable.journal.ref()
    inherited = head.journal if head is not None else None
    if self._run_record is _INHERIT:
        raw = self.store.meta.get_meta(run_key(self.name, self.branch))
        self._run_record = json.loads(raw) if raw else None
    rec = self._run_record
    if rec is None:
        return inherited
    if not record_applies(rec, head):
        return inherited
    log = str(rec["log"])
    info = self.store.meta.log_info(log)
    if info is None or info.length <= info.parent_len:  # nothing appended since it began
        return inherited
    last = self.store.meta.read_messages(log, info.length - 1, info.length)
    if not last:
        raise IntegrityError(f"journal log {log} has missing entries")
    return LogRef(log, info.length, last[0].chain.hex())


def _engine(self: Session) -> Durable:
    return self.durable


class DurableMethods(DurableDecorators):
    """The methods above, as :class:`~stashpoint.Session` has them."""

    _engine = _engine
    tasks = tasks
    remaining_tasks = remaining_tasks
    run = run
    resume = run
    arun = arun
    pending = pending
    approve = approve
    reject = reject
    effects = effects
    _mark_compensable = _mark_compensable
    _journal_ref = _journal_ref
