"""The async API: the same names as the sync one, for code that runs on an event loop.

    import stashpoint.aio

    async with await stashpoint.aio.open("state/") as store:
        run = await store.session("ticket-42", workspace="repo/")
        cp = await run.checkpoint({"messages": msgs}, message="before migration")
        await run.rewind(cp.id)

Agent frameworks (LangGraph's async savers, the OpenAI Agents SDK, FastAPI services) call from
an event loop, and a checkpoint does blocking I/O: an SQLite fsync, a workspace scan, network
round trips to PostgreSQL or Redis. Called inline, a 20 MB first snapshot would freeze every
other coroutine of the process for a third of a second.

**One implementation.** :class:`AsyncSession` wraps a sync :class:`~stashpoint.Session` and
runs each blocking call in a worker thread; it has no logic of its own beyond the thread hop,
so the sync and async faces cannot drift apart in behaviour. Most awaited methods are made
from the sync ones (:func:`_awaited`: name, signature, docstring), so they cannot drift in
signature either; a test checks every sync name has its twin.

**Threads: one ordered queue per session, one pool per store.** A ``Session`` keeps caches
(its head, the conversation as last checkpointed, log tips) and is not built for concurrent
calls from several threads; and callers expect ``await a(); await b()`` and also
``gather(a(), b())`` on one session to happen in the order they were made. So each
``AsyncSession`` runs its calls one at a time, first in first out, on the threads of a pool
owned by its ``AsyncStore``. The alternatives lose something:

- ``asyncio.to_thread`` per call: concurrent calls on one session would race for its caches
  and commit in arbitrary order (the head compare-and-set keeps the chain linear, but
  "checkpoint 3" could land before "checkpoint 2").
- one thread per store: every session of a service waits behind the slowest; a 20 MB snapshot
  of one agent would stall every other agent's 0.3 ms state checkpoint.
- one thread per session: a parked thread for every idle session of a long-lived service.

The queue does not hold a thread while it is empty, and after each call it yields its thread
back to the pool, so a busy session cannot starve the others. Different sessions do run in
parallel; with SQLite their metadata commits still take turns on the store's one connection
(its lock), so what overlaps is the scanning, hashing and compressing, which is most of a
snapshot. Calls run in a copy of the caller's :mod:`contextvars` context, as with
``asyncio.to_thread``.

**Cancellation never interrupts a write.** Cancelling (or timing out) the task that awaits a
call has one of two outcomes: if the call had not started (it was queued behind earlier calls
on the same session), it never runs; if it had started, it runs to completion in its thread
and only its result is dropped. A cancelled ``checkpoint`` may therefore still be recorded;
each commit is atomic anyway, so there is never a half-written checkpoint. Later
calls on the session queue behind it and see its effect.

**Durable programs run on the loop; their journal I/O does not.** :meth:`AsyncSession.arun`
runs the program's coroutines on the event loop (they must run there), after every call made
before it on the session has finished; the run's start (reading the journal, pending
compensations) and its closing "completed" or "failed" checkpoint (a workspace snapshot) run in
the session's queue. An async durable step takes its slot
on the loop (so call order is kept under ``asyncio.gather``), runs its body there, and awaits
its fsynced journal append in this session's queue (the engine's ``offload`` hook): other
coroutines keep running during the disk flush. A *sync* step inside an async program cannot
await, so it appends inline. Policy checkpoints of async steps run in the queue too.
Do not rewind or fork a session while its durable program runs (as in sync code).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import inspect
import os
import threading
import weakref
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

from ._store import Store
from .durable_surface import DurableDecorators, DurableMethods
from .errors import UsageError
from .lease import Lease
from .opening import open_store
from .session import Session
from .trial import Trial

if TYPE_CHECKING:
    from pathlib import Path
    from types import TracebackType

    from .durability import Durability
    from .durable import Durable, RunResult
    from .model import Checkpoint
    from .rewind import RewindResult

__all__ = [
    "AsyncLease",
    "AsyncSession",
    "AsyncStore",
    "AsyncTrial",
    "SerialQueue",
    "open",
    "open_async",
]

P = ParamSpec("P")
T = TypeVar("T")
U = TypeVar("U")
C = TypeVar("C", bound=type)
F = TypeVar("F", bound=Callable[..., Any])


def _closed() -> UsageError:
    return UsageError("the store is closed")


_shared: ThreadPoolExecutor | None = None
_shared_lock = threading.Lock()


def _shared_pool() -> ThreadPoolExecutor:
    """The pool of queues made without one (``ThreadPoolExecutor``'s default size), made on
    first use and kept for the process, as asyncio's default executor is for a loop."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ThreadPoolExecutor(thread_name_prefix="stashpoint-aio")
        return _shared


_queues: weakref.WeakSet[SerialQueue] = weakref.WeakSet()
"""Every live queue, reset in a forked child (:func:`_forget_shared_pool`)."""


def _forget_shared_pool() -> None:
    """In a forked child: the parent's pool has no threads here (and counts its idle ones as
    if it had: work given to it would wait forever), so the child makes its own. Each queue
    starts empty and idle: a fork can land while a parent's worker, its call's result already
    delivered, has not yet marked the queue idle (the child's queue would then wait for a
    drain that never comes), and calls still queued are the parent's, not to be run twice."""
    global _shared, _shared_lock
    _shared, _shared_lock = None, threading.Lock()
    for queue in list(_queues):
        queue._lock, queue._draining = threading.Lock(), False
        queue._queue.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_shared_pool)


class SerialQueue:
    """Runs calls one at a time, in submission order, on a shared pool's threads: how
    stashpoint's async code runs blocking calls (an :class:`AsyncSession`'s, and the
    integrations' async methods), so calls made on one object keep their order.

    Loop-independent and thread-safe: a plain :class:`concurrent.futures.Future` per call,
    so cancelling one that has not started (``Future.cancel``) makes the queue skip it, and
    one that has started cannot be cancelled at all. ``pool`` defaults to one pool shared by
    every queue made without one.
    """

    def __init__(self, pool: ThreadPoolExecutor | None = None) -> None:
        self._own_pool = pool
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[Callable[[], Any], Future[Any]]] = collections.deque()
        self._draining = False
        _queues.add(self)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        with self._lock:
            self._queue.append((fn, fut))
            if self._draining:
                return fut
            self._draining = True
        try:
            self._pool().submit(self._drain)
        except RuntimeError:  # the pool is shut down: the store was closed
            with self._lock:
                failed = list(self._queue)
                self._queue.clear()
                self._draining = False
            for _, f in failed:
                if f.set_running_or_notify_cancel():
                    f.set_exception(_closed())
        return fut

    def _pool(self) -> ThreadPoolExecutor:
        # The shared pool looked up each time: a queue made before a fork works after it.
        return self._own_pool if self._own_pool is not None else _shared_pool()

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` in a worker thread once every earlier call of this queue
        has finished, in a copy of the caller's :mod:`contextvars` context."""
        return await asyncio.wrap_future(self.submit(_bind(fn, *args, **kwargs)))

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
                fn, fut = self._queue.popleft()
            if fut.set_running_or_notify_cancel():  # False: cancelled before it started
                try:
                    result = fn()
                except BaseException as exc:
                    fut.set_exception(exc)
                else:
                    fut.set_result(result)
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
            try:  # give the thread back, so that a busy session cannot starve the others
                self._pool().submit(self._drain)
                return
            except RuntimeError:  # closing: finish this session's queue here
                continue


class _Twin(Protocol):
    """What an async twin of a sync class has: the sync object, and a way to run its calls."""

    sync: Any

    async def _call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T: ...


def _awaited(
    method: Callable[Concatenate[Any, P], T], note: str = ""
) -> Callable[Concatenate[_Twin, P], Coroutine[Any, Any, T]]:
    """The sync class's ``method`` as a coroutine that runs it off the loop (an
    :class:`AsyncSession`'s in its queue, an :class:`AsyncStore`'s in its pool), with the
    method's name, signature and docstring (plus ``note``): each signature is written once, in
    the sync class, and mypy checks the awaited calls against it."""
    return _awaited_as(method, _unchanged, note)


def _unchanged(_twin: _Twin, value: T) -> T:
    return value


def _awaited_as(
    method: Callable[Concatenate[Any, P], T],
    then: Callable[[Any, T], U],
    note: str = "",
    returns: str | None = None,
) -> Callable[Concatenate[_Twin, P], Coroutine[Any, Any, U]]:
    """:func:`_awaited`, its result passed through ``then(twin, result)`` (a sync session
    made async), ``returns`` naming the new result type in the signature."""
    name = method.__name__

    @functools.wraps(method)
    async def awaited(self: _Twin, /, *args: P.args, **kwargs: P.kwargs) -> U:
        # The object's own method (a subclass may override it), with the signature above.
        call = cast("Callable[P, T]", getattr(self.sync, name))
        return then(self, await self._call(call, *args, **kwargs))

    awaited.__module__ = __name__
    if note:
        awaited.__doc__ = f"{inspect.cleandoc(method.__doc__ or '')}\n\n{note}"
    signature = inspect.signature(method)
    self_param, *params = signature.parameters.values()
    awaited.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[self_param.replace(annotation=inspect.Parameter.empty), *params],
        return_annotation=signature.return_annotation if returns is None else returns,
    )
    return awaited


def _named(cls: C) -> C:
    """Class decorator: the awaited twins defined in ``cls`` are named as its methods."""
    for name, value in vars(cls).items():
        if inspect.iscoroutinefunction(value) and hasattr(value, "__wrapped__"):
            value.__qualname__ = f"{cls.__qualname__}.{name}"
    return cls


def _bind(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Callable[[], T]:
    """``fn(*args, **kwargs)`` as a no-argument call, run in a copy of the caller's context."""
    ctx = contextvars.copy_context()
    return functools.partial(ctx.run, fn, *args, **kwargs)


@_named
class AsyncStore:
    """A :class:`~stashpoint.Store` for asyncio code: the same methods, awaited.

    Owns the thread pool its sessions' calls run on (``max_workers`` threads; default
    ``ThreadPoolExecutor``'s). ``AsyncStore(store)`` wraps a store opened synchronously,
    e.g. with options :func:`open` does not forward.
    """

    def __init__(self, store: Store, *, max_workers: int | None = None) -> None:
        self.sync = store
        """The wrapped sync store (its methods block: call them with :meth:`run_sync`)."""
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="stashpoint-aio")
        self._closed = False

    @property
    def url(self) -> str:
        return self.sync.url

    @property
    def id(self) -> str:
        return self.sync.id

    def _submit(self, call: Callable[[], T]) -> Future[T]:
        if self._closed:
            raise _closed()
        try:
            return self._pool.submit(call)
        except RuntimeError:
            raise _closed() from None

    async def _call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await asyncio.wrap_future(self._submit(_bind(fn, *args, **kwargs)))

    async def _acquire(self, drop: Callable[[T], object], call: Callable[[], T]) -> T:
        """``call()`` in the pool, for a result that holds something (a lease) until dropped.

        A started call cannot be interrupted: if the caller is cancelled (or times out) while
        it runs, ``drop`` its result when it arrives, or nobody would ever release it.
        """
        fut = self._submit(call)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.add_done_callback(functools.partial(_drop_orphan, drop))
            raise

    async def session(self, name: str = "main", **kwargs: Any) -> AsyncSession:
        """Open (or start) a session; the options are :class:`~stashpoint.Session`'s.

        A coroutine because opening does I/O: it reads which branch the workspace follows
        and completes a rewind that a crash interrupted. With ``lease=True`` (or a ttl) it
        takes the session's lease; cancelled meanwhile, that lease is released.
        """
        # Session.close releases only a lease the session took itself, not one passed in.
        sync = await self._acquire(Session.close, _bind(self.sync.session, name, **kwargs))
        return AsyncSession(sync, self)

    # Run in the pool, each the sync store's method: one signature.
    sessions = _awaited(Store.sessions)
    resolve = _awaited(Store.resolve)
    get = _awaited(Store.get)
    flush = _awaited(Store.flush)
    set_durability = _awaited(Store.set_durability)
    durability_report = _awaited(Store.durability_report)
    head_id = _awaited(Store.head_id)
    branches = _awaited(Store.branches)
    start_branch = _awaited(Store.start_branch)
    record_ids = _awaited(Store.record_ids)
    records = _awaited(Store.records)
    pruned = _awaited(Store.pruned)
    prune = _awaited(Store.prune)
    session_value = _awaited(Store.session_value)
    set_session_value = _awaited(Store.set_session_value)
    swap_session_value = _awaited(Store.swap_session_value)
    log_info = _awaited(Store.log_info)
    read_messages = _awaited(Store.read_messages)

    @property
    def cache_dir(self) -> Path | None:
        return self.sync.cache_dir

    async def lease(
        self, session: str, *, ttl: float = 30.0, owner: str | None = None, wait: float = 0.0
    ) -> AsyncLease:
        """Own ``session`` across workers; pass it to :meth:`session` as ``lease=``.

        Cancelled (or timed out) while it waits, a lease acquired afterwards is released
        at once instead of being renewed for nobody.
        """
        lease = await self._acquire(
            Lease.release, _bind(self.sync.lease, session, ttl=ttl, owner=owner, wait=wait)
        )
        return AsyncLease._adopt(lease)

    async def run_sync(
        self, fn: Callable[Concatenate[Store, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn(store, *args, **kwargs)`` in a worker thread, for what has no async name,
        e.g. ``await astore.run_sync(stashpoint.verify.verify_store)``."""
        return await self._call(fn, self.sync, *args, **kwargs)

    async def close(self) -> None:
        """Wait for every call already made on this store's sessions, then close the store.

        Calls made afterwards raise :class:`~stashpoint.UsageError`.
        """
        if self._closed:
            return
        self._closed = True

        def finish() -> None:
            self._pool.shutdown(wait=True)
            self.sync.close()

        await asyncio.shield(asyncio.get_running_loop().run_in_executor(None, finish))

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def open(
    url: str | os.PathLike[str] | None = None,
    *,
    key: bytes | None = None,
    blobs: str | None = None,
    mirror: str | os.PathLike[str] | None = None,
    encryption_key: bytes | None = None,
    durability: Durability | str | None = None,
    accept_rollback: bool | None = None,
    max_workers: int | None = None,
) -> AsyncStore:
    """Open a store by URL or path (see :func:`stashpoint.open`) without blocking the loop.

    ``async with await stashpoint.aio.open(url) as store:`` closes it at the end.
    """
    loop = asyncio.get_running_loop()
    fut = loop.run_in_executor(
        None,
        functools.partial(
            open_store,
            url,
            key=key,
            blobs=blobs,
            mirror=mirror,
            encryption_key=encryption_key,
            durability=durability,
            accept_rollback=accept_rollback,
        ),
    )
    try:
        store = await asyncio.shield(fut)
    except asyncio.CancelledError:
        # opened for a caller that is gone
        fut.add_done_callback(functools.partial(_drop_orphan, Store.close))
        raise
    return AsyncStore(store, max_workers=max_workers)


def _drop_orphan(drop: Callable[[T], object], fut: Future[T] | asyncio.Future[T]) -> None:
    """Done-callback: let go of what a call made for a caller that was cancelled."""
    if not fut.cancelled() and fut.exception() is None:
        drop(fut.result())


class AsyncLease(Lease):
    """The :class:`~stashpoint.Lease` that :meth:`AsyncStore.lease` returns: a ``Lease``
    (pass it to sessions, sync or async), plus ``arelease`` / ``arenew`` / ``acheck``, awaited,
    and ``async with``. Releasing joins the renewal thread and makes a store round trip (and
    ``check`` may renew), so on the loop use those rather than the blocking sync methods.
    """

    @classmethod
    def _adopt(cls, lease: Lease) -> AsyncLease:
        # Store.lease builds the Lease (and its wait loop); only methods are added here, no
        # state, so re-classing the live object keeps its renewal thread and fencing token.
        lease.__class__ = cls
        return cast("AsyncLease", lease)

    async def arelease(self) -> None:
        """:meth:`release` in a worker thread. Shielded: once asked for, the release happens
        even if the caller is cancelled (a skipped one would keep renewing for nobody)."""
        loop = asyncio.get_running_loop()
        await asyncio.shield(loop.run_in_executor(None, self.release))

    async def arenew(self) -> None:
        """:meth:`renew` in a worker thread."""
        await asyncio.get_running_loop().run_in_executor(None, self.renew)

    async def acheck(self) -> None:
        """:meth:`check` in a worker thread (past its ttl it asks the store)."""
        await asyncio.get_running_loop().run_in_executor(None, self.check)

    async def __aenter__(self) -> AsyncLease:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.arelease()


open_async = open
"""``stashpoint.open_async``: :func:`open` under a name that reads well at the top level."""


class _Chunks:
    """An artifact's chunks as an async iterator: each ``next`` in the session's queue."""

    def __init__(self, session: AsyncSession, chunks: Iterator[bytes]) -> None:
        self._session = session
        self._chunks = chunks

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._session._call(next, self._chunks, None)
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        """Stop early: close the underlying reader (its files) in the queue."""
        close = getattr(self._chunks, "close", None)
        if close is not None:
            await self._session._call(close)


def _in_own_queue(run: AsyncSession, other: Session) -> AsyncSession:
    """The session of another directory, made by ``run``: async too, with its own queue."""
    return AsyncSession(other, run.store)


def _switched_or_own(run: AsyncSession, other: Session) -> AsyncSession:
    """What a fork returns: ``run`` itself when it switched branch, else the new directory's."""
    return run if other is run.sync else _in_own_queue(run, other)


@_named
class AsyncSession(DurableDecorators):
    """A :class:`~stashpoint.Session` for asyncio code: the same method names, awaited.

    Every method that does I/O is a coroutine that runs the sync method in this session's
    ordered queue (see the module docstring): calls on one session happen one at a time, in
    the order they were made. The head is ``await run.get_head()`` (the sync ``head`` is a
    property that may read the store, and an awaitable property is a trap). Durable
    decorators (:meth:`step`, :meth:`tool`) and the task helpers are the sync session's,
    used inside a program run by :meth:`arun`.
    """

    def __init__(self, session: Session, store: AsyncStore) -> None:
        self.sync = session
        """The wrapped sync session (its methods block: call them with :meth:`run_sync`)."""
        self.store = store
        self._queue = SerialQueue(store._pool)
        # Durable async steps journal through this session's queue, off the loop, in order.
        session.durable.offload = lambda call: asyncio.wrap_future(self._queue.submit(call))

    def __repr__(self) -> str:
        return f"<AsyncSession {self.name!r} branch {self.branch!r}>"

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def branch(self) -> str:
        return self.sync.branch

    @property
    def last_restore(self) -> RewindResult | None:
        """What this session's latest restore did (a rewind, a fork, one finished on open)."""
        return self.sync.last_restore

    async def _call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self.store._closed:
            raise _closed()
        return await self._queue.call(fn, *args, **kwargs)

    async def run_sync(
        self, fn: Callable[Concatenate[Session, P], T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn(session, *args, **kwargs)`` in this session's queue, for what has no async
        name: ``await run.run_sync(stashpoint.Session.remaining_tasks)``."""
        return await self._call(fn, self.sync, *args, **kwargs)

    # -- reading --------------------------------------------------------------------------
    async def get_head(self) -> Checkpoint | None:
        """The branch head (verified), or None for a branch with no checkpoint yet."""
        return await self._call(lambda: self.sync.head)

    # Awaited in this session's queue, each the sync session's method: one signature.
    resolve = _awaited(Session.resolve)
    get = _awaited(Session.get)
    history = _awaited(Session.history)
    labels = _awaited(Session.labels)
    branches = _awaited(Session.branches)
    state = _awaited(Session.state)
    diff = _awaited(Session.diff)
    check_may_write = _awaited(Session.check_may_write)

    # -- writing --------------------------------------------------------------------------
    async def checkpoint(
        self,
        state: Mapping[str, Any] | None = None,
        *,
        message: str | None = None,
        label: str | None = None,
        kind: str = "manual",
        step: int | None = None,
        meta: Mapping[str, Any] | None = None,
        files: bool = True,
        progress: Callable[[int, int], None] | None = None,
        skip_unchanged: bool = False,
        status: str | None = None,
        artifacts: Mapping[str, str | os.PathLike[str] | None] | None = None,
        append_messages: Sequence[Any] | None = None,
        expect_head: str | None = None,
    ) -> Checkpoint:
        """Record a checkpoint of ``state`` and the workspace, atomically (see
        :meth:`Session.checkpoint`, and its ``append_messages`` for concurrent appends and
        ``expect_head`` for a compare-and-set on the head).

        ``state`` is encoded in the worker thread: do not mutate it until the call returns.
        ``progress`` is called from the worker thread (use ``loop.call_soon_threadsafe`` to
        reach the loop). Cancelled after it started, the checkpoint still completes.
        """
        return await self._call(
            self.sync.checkpoint,
            state,
            message=message,
            label=label,
            kind=kind,
            step=step,
            meta=meta,
            files=files,
            progress=progress,
            skip_unchanged=skip_unchanged,
            status=status,
            artifacts=artifacts,
            append_messages=append_messages,
            expect_head=expect_head,
        )

    artifacts = _awaited(Session.artifacts)
    fetch_artifact = _awaited(Session.fetch_artifact)
    read_artifact = _awaited_as(
        Session.read_artifact,
        _Chunks,
        "Awaited, it finds the artifact (a missing one raises there, as the sync call does) "
        "and returns an async iterator, each chunk read in this session's queue: ``async for "
        "chunk in await run.read_artifact(...)``.",
        returns="AsyncIterator[bytes]",
    )
    label = _awaited(Session.label)
    edit = _awaited(Session.edit, "Validators run in the worker thread.")

    def validator(self, fn: F) -> F:
        """Decorator: register a state validator for :meth:`edit` (no I/O)."""
        return self.sync.validator(fn)

    def validate(self, state: dict[str, Any]) -> None:
        """Run every validator (see :meth:`Session.validate`); no store I/O, so not awaited."""
        self.sync.validate(state)

    complete_interrupted_restore = _awaited(Session.complete_interrupted_restore)
    rewind = _awaited(Session.rewind, "Compensations it runs run in the worker thread.")
    bound_root = _awaited(Session.bound_root)
    materialize = _awaited_as(
        Session.materialize,
        _in_own_queue,
        "Awaited, the new directory's :class:`AsyncSession` is returned.",
        returns="AsyncSession",
    )
    fork = _awaited_as(
        Session.fork,
        _switched_or_own,
        "Awaited: without ``into`` this session switches to the new branch and is returned; "
        "with it, the new directory's session, with its own queue (it runs in parallel with "
        "this one).",
        returns="AsyncSession",
    )

    def trial(self, ref: str | Checkpoint | None = None) -> AsyncTrial:
        """:meth:`Session.trial` for asyncio code: ``async with run.trial(node) as t:``.
        Going to the node, keeping and rolling back run in this session's queue, off the
        loop; the block itself runs on the loop."""
        return AsyncTrial(self, Trial(self.sync, ref))

    # -- durable execution ----------------------------------------------------------------
    async def arun(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, fresh: bool = False, **kwargs: Any
    ) -> RunResult:
        """Run (or resume) the async program ``fn`` as a durable program, on the event loop
        (see :meth:`Session.arun`), once every call made before on this session is done.

        Its start (reading the journal, pending compensations) and its final checkpoint
        (a full workspace snapshot) run off the loop, like its steps' journal appends.
        """
        await self._call(_nothing)
        return await self.sync.arun(fn, *args, fresh=fresh, **kwargs)

    tasks = _awaited(DurableMethods.tasks)
    remaining_tasks = _awaited(DurableMethods.remaining_tasks)
    effects = _awaited(DurableMethods.effects)
    pending = _awaited(DurableMethods.pending)
    approve = _awaited(DurableMethods.approve)
    reject = _awaited(DurableMethods.reject)

    # The decorators and task helpers (DurableDecorators) are used inside a running program:
    # they register with the sync session's engine and journal inline (see the module
    # docstring).
    def _engine(self) -> Durable:
        return self.sync.durable

    async def close(self) -> None:
        """Release the lease the session took (after every queued call has finished).

        Shielded: a close that is cancelled before its turn still runs, or the lease would be
        renewed for nobody until the process exits.
        """
        await asyncio.shield(self._call(self.sync.close))

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncTrial:
    """One attempt from a checkpoint in asyncio code (see :class:`~stashpoint.trial.Trial`):
    made by :meth:`AsyncSession.trial`. Each step of the sync trial (go to the node, keep,
    roll back) runs in the session's queue, so it is ordered with the session's other calls
    and never blocks the loop; an exception or a cancellation leaving the block rolls back."""

    def __init__(self, run: AsyncSession, trial: Trial) -> None:
        self._run = run
        self.sync = trial
        """The wrapped sync trial."""

    @property
    def base(self) -> Checkpoint:
        """The checkpoint the trial started from and rolls back to."""
        return self.sync.base

    @property
    def result(self) -> Checkpoint | None:
        """After keep: the kept checkpoint; after a rollback: what the trial had reached."""
        return self.sync.result

    @property
    def outcome(self) -> str:
        return self.sync.outcome

    async def keep(
        self,
        state: Mapping[str, Any] | None = None,
        *,
        message: str | None = None,
        label: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Checkpoint:
        """End the trial keeping what it did (:meth:`Trial.keep`)."""
        return await self._run._call(self.sync.keep, state, message=message, label=label, meta=meta)

    async def rollback(self) -> Checkpoint:
        """End the trial now, going back to :attr:`base` (:meth:`Trial.rollback`)."""
        return await self._run._call(self.sync.rollback)

    async def __aenter__(self) -> AsyncTrial:
        await self._run._call(self.sync.__enter__)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Shielded: a block cancelled while rolling back still ends its trial.
        await asyncio.shield(self._run._call(self.sync.__exit__, exc_type, exc, tb))

    def __repr__(self) -> str:
        return f"<AsyncTrial {self.sync!r}>"


def _nothing() -> None:
    """A no-op through a session's queue: returns once every earlier call has finished."""
