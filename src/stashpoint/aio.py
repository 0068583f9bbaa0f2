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
so the sync and async faces cannot drift apart in behaviour, only in the list of names (a test
compares the signatures).

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
import os
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

from ._store import Store
from .durable_surface import DurableDecorators, DurableMethods
from .errors import IntegrityError, UsageError
from .lease import Lease
from .opening import open_store

if TYPE_CHECKING:
    from pathlib import Path
    from types import TracebackType

    from .durability import Durability
    from .durable import Durable, RunResult
    from .model import ArtifactRef, Checkpoint
    from .session import CheckpointDiff, RewindResult, Session

__all__ = ["AsyncLease", "AsyncSession", "AsyncStore", "open", "open_async"]

P = ParamSpec("P")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _closed() -> UsageError:
    return UsageError("the store is closed")


class _SerialQueue:
    """Runs calls one at a time, in submission order, on a shared pool's threads.

    Loop-independent and thread-safe: a plain :class:`concurrent.futures.Future` per call,
    so cancelling one that has not started (``Future.cancel``) makes the queue skip it, and
    one that has started cannot be cancelled at all.
    """

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[Callable[[], Any], Future[Any]]] = collections.deque()
        self._draining = False

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        fut: Future[T] = Future()
        with self._lock:
            self._queue.append((fn, fut))
            if self._draining:
                return fut
            self._draining = True
        try:
            self._pool.submit(self._drain)
        except RuntimeError:  # the pool is shut down: the store was closed
            with self._lock:
                failed = list(self._queue)
                self._queue.clear()
                self._draining = False
            for _, f in failed:
                if f.set_running_or_notify_cancel():
                    f.set_exception(_closed())
        return fut

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
                self._pool.submit(self._drain)
                return
            except RuntimeError:  # closing: finish this session's queue here
                continue


def _awaited(
    method: Callable[Concatenate[Session, P], T],
) -> Callable[Concatenate[AsyncSession, P], Coroutine[Any, Any, T]]:
    """The sync session's ``method`` as a coroutine run in the session's queue, with its
    name, signature and docstring: a durable method is written once, in the sync session."""

    @functools.wraps(method)
    async def awaited(self: AsyncSession, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._call(functools.partial(method, self.sync), *args, **kwargs)

    awaited.__qualname__ = f"AsyncSession.{method.__name__}"
    return awaited


def _bind(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Callable[[], T]:
    """``fn(*args, **kwargs)`` as a no-argument call, run in a copy of the caller's context."""
    ctx = contextvars.copy_context()
    return functools.partial(ctx.run, fn, *args, **kwargs)


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

    async def _in_pool(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
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
        from .session import Session

        # Session.close releases only a lease the session took itself, not one passed in.
        sync = await self._acquire(Session.close, _bind(self.sync.session, name, **kwargs))
        return AsyncSession(sync, self)

    async def sessions(self) -> list[str]:
        return await self._in_pool(self.sync.sessions)

    async def resolve(self, ref: str, session: str | None = None) -> str:
        """Full id from an id, a unique id prefix or a label (see :meth:`Store.resolve`)."""
        return await self._in_pool(self.sync.resolve, ref, session)

    async def get(self, ident: str, *, check_parent: bool = True) -> Checkpoint:
        """A verified checkpoint (see :meth:`Store.get`)."""
        return await self._in_pool(self.sync.get, ident, check_parent=check_parent)

    async def flush(self) -> None:
        """Make every checkpoint committed so far durable (deferred durability levels)."""
        await self._in_pool(self.sync.flush)

    async def set_durability(self, level: Durability | str) -> Durability:
        """Record ``level`` as the store's default (see :meth:`Store.set_durability`)."""
        return await self._in_pool(self.sync.set_durability, level)

    async def durability_report(self, level: Durability | None = None) -> dict[str, Any]:
        """The level and what the backend makes of it (see :meth:`Store.durability_report`)."""
        return await self._in_pool(self.sync.durability_report, level)

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
        return await self._in_pool(fn, self.sync, *args, **kwargs)

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
        self._queue = _SerialQueue(store._pool)
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

    async def _call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self.store._closed:
            raise _closed()
        return await asyncio.wrap_future(self._queue.submit(_bind(fn, *args, **kwargs)))

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

    async def resolve(self, ref: str) -> str:
        """Full id from an id, unique prefix, label, ``HEAD`` or ``HEAD~N``."""
        return await self._call(self.sync.resolve, ref)

    async def get(self, ref: str) -> Checkpoint:
        return await self._call(self.sync.get, ref)

    async def history(
        self, *, limit: int | None = None, damaged: list[IntegrityError] | None = None
    ) -> list[Checkpoint]:
        """All checkpoints of the session, newest first, each verified with its chain link
        (see :meth:`Session.history` for ``damaged``)."""
        return await self._call(self.sync.history, limit=limit, damaged=damaged)

    async def labels(self) -> dict[str, str]:
        return await self._call(self.sync.labels)

    async def branches(self) -> dict[str, str]:
        return await self._call(self.sync.branches)

    async def state(self, ref: str | Checkpoint | None = None) -> dict[str, Any]:
        """The full state of a checkpoint (default: the head), decoded and verified."""
        return await self._call(self.sync.state, ref)

    async def diff(self, a: str | Checkpoint, b: str | Checkpoint) -> CheckpointDiff:
        return await self._call(self.sync.diff, a, b)

    async def check_may_write(self) -> None:
        """LeaseLost / LeaseHeld if the store would refuse this session's writes."""
        await self._call(self.sync.check_may_write)

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

    async def artifacts(self, ref: str | Checkpoint | None = None) -> dict[str, ArtifactRef]:
        return await self._call(self.sync.artifacts, ref)

    async def fetch_artifact(
        self,
        ref: str | Checkpoint | None,
        name: str,
        dest: str | os.PathLike[str],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> Path:
        """Write an artifact to ``dest`` atomically (see :meth:`Session.fetch_artifact`)."""
        return await self._call(self.sync.fetch_artifact, ref, name, dest, progress=progress)

    async def read_artifact(self, ref: str | Checkpoint | None, name: str) -> AsyncIterator[bytes]:
        """Stream an artifact's content, verified chunk by chunk (see
        :meth:`Session.read_artifact`): ``async for chunk in await run.read_artifact(...)``.

        Awaiting it finds the artifact (so a missing one raises there, as the sync call
        does); each chunk is then read in this session's queue.
        """
        chunks = await self._call(self.sync.read_artifact, ref, name)
        return _Chunks(self, chunks)

    async def label(self, ref: str, label: str | None) -> Checkpoint:
        return await self._call(self.sync.label, ref, label)

    async def edit(
        self,
        ref: str | Checkpoint | None = None,
        *,
        assign: Mapping[str, Any] | None = None,
        patch: list[dict[str, Any]] | None = None,
        state: Mapping[str, Any] | None = None,
        reason: str | None = None,
        by: str | None = None,
        branch: str | None = None,
    ) -> Checkpoint:
        """Correct a checkpoint's state as a new child checkpoint (see :meth:`Session.edit`);
        validators run in the worker thread."""
        return await self._call(
            self.sync.edit,
            ref,
            assign=assign,
            patch=patch,
            state=state,
            reason=reason,
            by=by,
            branch=branch,
        )

    def validator(self, fn: F) -> F:
        """Decorator: register a state validator for :meth:`edit` (no I/O)."""
        return self.sync.validator(fn)

    def validate(self, state: dict[str, Any]) -> None:
        """Run every validator (see :meth:`Session.validate`); no store I/O, so not awaited."""
        self.sync.validate(state)

    async def complete_interrupted_restore(self) -> bool:
        """Finish a rewind a crash interrupted (opening a session already does)."""
        return await self._call(self.sync.complete_interrupted_restore)

    async def rewind(
        self,
        ref: str,
        *,
        files: bool = True,
        state: bool = True,
        compensate: bool = False,
        artifacts: bool | Mapping[str, str | os.PathLike[str] | None] = False,
        progress: Callable[[int, int], None] | None = None,
        artifacts_to: str | os.PathLike[str] | None = None,
        recorded_paths: bool = False,
    ) -> RewindResult:
        """Go back to a checkpoint: files, state, or both (see :meth:`Session.rewind`);
        compensations it runs run in the worker thread."""
        return await self._call(
            self.sync.rewind,
            ref,
            files=files,
            state=state,
            compensate=compensate,
            artifacts=artifacts,
            progress=progress,
            artifacts_to=artifacts_to,
            recorded_paths=recorded_paths,
        )

    async def bound_root(
        self, branch: str | None = None, target: Checkpoint | None = None
    ) -> str | None:
        """The directory a branch is bound to (see :meth:`Session.bound_root`)."""
        return await self._call(self.sync.bound_root, branch, target)

    async def materialize(self, into: str | os.PathLike[str], ref: str = "HEAD") -> AsyncSession:
        """Write a checkpoint into a new or empty directory that then follows this branch
        (see :meth:`Session.materialize`); the new directory's session is returned."""
        other = await self._call(self.sync.materialize, into, ref)
        return AsyncSession(other, self.store)

    async def fork(
        self,
        ref: str,
        branch: str | None = None,
        *,
        into: str | os.PathLike[str] | None = None,
    ) -> AsyncSession:
        """A new branch starting at a checkpoint (see :meth:`Session.fork`).

        Without ``into`` this session switches to the new branch and is returned; with it,
        the new directory's session, with its own queue (it runs in parallel with this one).
        """
        other = await self._call(self.sync.fork, ref, branch, into=into)
        return self if other is self.sync else AsyncSession(other, self.store)

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

    # Awaited in this session's queue, each the sync session's method: one signature.
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


def _nothing() -> None:
    """A no-op through a session's queue: returns once every earlier call has finished."""
