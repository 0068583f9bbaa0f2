"""The durable-execution engine: steps that run once, irreversible tools with an intent
before and an outcome after, approval gates, tasks, and the run around them.

Each durable call takes a *slot*, its number in call order; a replay answers a call from its
slot's journal entries instead of running its body, and refuses (DivergenceError) a program
that now makes another call there.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET

from .. import serde
from .._ids import new_id
from ..errors import (
    DivergenceError,
    NotFoundError,
    SerializationError,
    StashpointError,
    StashpointWarning,
    ToolRejected,
    UsageError,
)
from ..model import Checkpoint, utc_now_iso
from . import compensation
from .chaoshooks import ChaosHooks
from .entries import (
    Call,
    CancelEntry,
    DecisionEntry,
    DoneEntry,
    EffectEntry,
    Entry,
    ErrorInfo,
    IntentEntry,
    JournalEntry,
    PlanEntry,
    RequestEntry,
    ResolveEntry,
    StepEntry,
    TaskEntry,
    fingerprint,
    loose,
)
from .journal import Journal
from .offload import Offload, OffLoop
from .results import (
    DONE_TASK,
    TASK_STATUSES,
    Effect,
    Pending,
    RunPaused,
    RunResult,
    Task,
    _effect_key,
    _ToolSpec,
    current_effect_key,
)

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["Durable", "current_effect_key"]

T = TypeVar("T")

_json = msgspec.json.Encoder()
_nested: contextvars.ContextVar[tuple[tuple[object, list[int]], ...]] = contextvars.ContextVar(
    "stashpoint_nested_slots", default=()
)
"""(engine, slots) of the step and tool bodies running now, innermost last: each durable call
made inside a body adds its slot to every enclosing body's list of that engine."""


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
        self.offload: Offload | None = None
        self._offloop = OffLoop()  # journal work handed off the loop, not done yet
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
        """``fn(*args, **kwargs)`` off the event loop (:mod:`.offload`)."""
        return await self._offloop.call(self.offload, functools.partial(fn, *args, **kwargs))

    async def _settle(self) -> None:
        """Wait for journal writes other coroutines of the run handed off: when one call pauses
        the run (a gate under ``asyncio.gather``), a sibling's request already on its way is
        recorded before the pause is reported."""
        await self._offloop.settle()

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

    def _skip_nested(self, entry: StepEntry | EffectEntry) -> None:
        """A step or tool replays without running its body: the slots its body's durable
        calls took stay taken, so the calls after it find their own entries."""
        if entry.nested is not UNSET:
            self._skip.update(x for x in entry.nested if x >= self._slot)

    @contextmanager
    def _nest(self) -> Iterator[list[int]]:
        """Collect the slots of the durable calls made inside a body (nested steps)."""
        used: list[int] = []
        token = _nested.set((*_nested.get(), (self, used)))
        try:
            yield used
        finally:
            _nested.reset(token)

    def _diverged(self, s: int, got: Entry, want: str) -> DivergenceError:
        j = self._journal()
        name = got.subject
        return DivergenceError(
            f"replay diverged at call #{s} of session {self.session.name!r}: the journal has "
            f"{got.kind} {name!r}"
            f"{' with other arguments' if name and name in want else ''}, "
            f"the program now calls {want}. A durable run must make the same calls in the "
            "same order (keep non-determinism inside steps); rewind to a checkpoint before "
            f"this call or start a fresh run. Journal {j.log}, {len(j.entries)} entries."
        )

    def _match(self, s: int, kind: type[Call], name: str, fp: str) -> list[JournalEntry]:
        """The slot's entries if recorded (checking it is the same call), else []."""
        j = self._journal()
        entries = j.slot(s)
        if entries:
            first = entries[0]
            if type(first) is not kind or first.name != name or first.fingerprint != fp:
                if type(first) is TaskEntry and first.auto is True:
                    # "task failed" written on the way out of a crashed program (an exception
                    # outside any step): not a call the program made, so a re-run that went
                    # on differently supersedes it, as it would without tasks.
                    j.append(CancelEntry(slot=s, why="the run went on past a failure"))
                    return []
                raise self._diverged(s, first, f"{kind.kind} {name!r}")
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
        entries = self._match(s, StepEntry, name, fp)
        if not entries:
            return None
        e = entries[0]
        assert type(e) is StepEntry
        self.replayed += 1
        self._skip_nested(e)

        def result() -> Any:
            if e.ok:
                return serde.from_tree(None if e.result is UNSET else e.result)
            raise (e.error if e.error is not UNSET else ErrorInfo()).rebuild()

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
        made = functools.partial(
            StepEntry, slot=s, name=name, fingerprint=fp, nested=sorted(sub) if sub else UNSET
        )
        if error is None:
            entry = made(ok=True, result=serde.to_tree(value))
        else:
            entry = made(ok=False, error=ErrorInfo.of(error))
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
        entries = self._match(s, RequestEntry, spec.name, fp)
        if not entries:
            a = loose([list(args), kwargs])
            req = RequestEntry(slot=s, name=spec.name, fingerprint=fp, id=new_id(), args=a)
            self._journal().append(req)
            self.executed += 1
            pending = Pending("approval", req.id, spec.name, a, fp)
            self._pause(pending, self._paused_checkpoint(pending))
        self.replayed += 1
        request = entries[0]
        assert type(request) is RequestEntry
        decision = next((e for e in entries[1:] if type(e) is DecisionEntry), None)
        if decision is None:
            pending = Pending("approval", request.id, spec.name, request.args, fp)
            head = self.session.head
            if head is None or head.status != "awaiting_approval":  # died before checkpointing
                head = self._paused_checkpoint(pending)
            self._pause(pending, head)
        assert decision is not None
        if decision.fingerprint != fp:  # bound to the arguments it was given for
            raise self._diverged(s, decision, f"{spec.name!r} with other arguments")
        if not decision.approved:
            reason = decision.why
            raise ToolRejected(
                f"{spec.name} was rejected" + (f": {reason}" if reason else ""),
                tool=spec.name,
                reason=reason,
            )

    def _paused_checkpoint(self, pending: Pending) -> Checkpoint:
        """The checkpoint a paused run rests on, and the notification that someone must act."""
        from ..notify import notify

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
        entries = self._match(s, IntentEntry, spec.name, fp)
        if not entries:
            key = new_id()
            self._record_intent(spec, s, fp, key, args, kwargs)
            return key, None
        self.replayed += 1
        first, last = entries[0], entries[-1]
        assert type(first) is IntentEntry
        key = first.key
        if type(last) is EffectEntry:
            self._skip_nested(last)
            error: BaseException
            if last.ok and last.unrecorded is UNSET:
                value = serde.from_tree(None if last.result is UNSET else last.result)
                return key, lambda: value
            if last.ok:  # it happened, but its result could not be recorded
                error = SerializationError(str(last.unrecorded))
            else:
                error = (last.error if last.error is not UNSET else ErrorInfo()).rebuild()

            def fail() -> Any:
                raise error

            return key, fail
        if type(last) is ResolveEntry:  # a human said it did not happen: try again, same key
            self._record_intent(spec, s, fp, key, args, kwargs)
            return key, None
        # An intent with no outcome: the process died while the effect ran. Never re-run it
        # on a guess: pause until a human says whether it happened.
        args_recorded = last.args if type(last) is IntentEntry else first.args
        pending = Pending("in_doubt", key, spec.name, args_recorded, fp)
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
        at = utc_now_iso()
        intent = IntentEntry(slot=s, name=spec.name, fingerprint=fp, key=key, args=a, at=at)
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
        made = functools.partial(
            EffectEntry,
            slot=s,
            name=spec.name,
            key=key,
            at=utc_now_iso(),
            nested=sorted(sub) if sub else UNSET,
        )
        refused: SerializationError | None = None
        if error is None:
            try:
                entry = made(ok=True, result=serde.to_tree(value))
            except StashpointError as exc:
                # The effect happened: the ledger says so (done, with the result's type only),
                # and this call fails now and on every replay, like a step's unencodable result.
                refused = SerializationError(
                    f"irreversible tool {spec.name} ran, but its result cannot be recorded for "
                    f"replay ({exc}); it is in the side-effect ledger as done. Return encodable "
                    "data from the tool"
                )
                entry = made(ok=True, result=loose(value), unrecorded=str(refused))
        else:
            entry = made(ok=False, error=ErrorInfo.of(error))
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
        entries = self._match(s, PlanEntry, "plan", fp)
        if entries:
            self.replayed += 1
        else:
            self._journal().append(PlanEntry(slot=s, name="plan", fingerprint=fp, tasks=items))
        return self.tasks()

    def tasks(self) -> list[Task]:
        """Task statuses as of the current point of the run (replay-consistent)."""
        j = self._journal()
        upto = max((i for s in range(self._slot) for i in j.by_slot.get(s, ())), default=-1)
        return j.tasks(upto + 1)

    def remaining(self) -> list[Task]:
        return [t for t in self.tasks() if t.status not in DONE_TASK]

    def set_task(
        self, task_id: str, status: str, note: str | None = None, *, auto: bool = False
    ) -> None:
        if status not in TASK_STATUSES:
            raise UsageError(f"task status must be one of {', '.join(TASK_STATUSES)}")
        s = self._next_slot()
        fp = f"{task_id}:{status}"
        entries = self._match(s, TaskEntry, "task", fp)
        if entries:
            self.replayed += 1
            return
        self._journal().append(
            TaskEntry(
                slot=s,
                name="task",
                fingerprint=fp,
                id=task_id,
                status=status,
                note=note,
                auto=True if auto else UNSET,
            )
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
            await self._settle()
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
        if entries and type(entries[0]) is DoneEntry:
            recorded = serde.from_tree(entries[0].result)
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
        j.append(DoneEntry(slot=s, ok=True, result=tree))
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
        compensation.request(self, effects)

    def run_pending_compensations(self, *, in_run: bool = False) -> list[dict[str, Any]]:
        """Run the requested compensations this process can (see :mod:`.compensation`)."""
        return compensation.run_pending(self, in_run=in_run)
