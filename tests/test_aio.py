"""The async API (``stashpoint.aio``) on real SQLite stores and real files, and on PostgreSQL
and Redis when they are there: the same operations as the sync API, in call order per session,
without blocking the event loop, and never leaving a half-written checkpoint when cancelled.

Plain ``asyncio.run`` inside sync tests: no pytest plugin needed.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import itertools
import multiprocessing
import os
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stashpoint
import stashpoint.aio
from stashpoint.aio import AsyncSession, AsyncStore, SerialQueue
from stashpoint.verify import verify_store

from .conftest import snapshot_tree

MiB = 1024 * 1024


def _run(coro: Awaitable[Any]) -> Any:
    async def main() -> Any:
        return await coro

    return asyncio.run(main())


def _linear(history: list[stashpoint.Checkpoint]) -> None:
    """Newest first, each the parent of the one before: one chain, nothing lost or forked."""
    for newer, older in itertools.pairwise(history):
        assert newer.parent == older.id and newer.parent_digest == older.digest
        assert newer.step == older.step + 1
    assert history[-1].parent is None


# -- the same operations as the sync API ------------------------------------------------------
def test_checkpoint_state_history_rewind_fork_diff(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    (ws / "keep.bin").write_bytes(os.urandom(3000))
    msgs = [{"role": "user", "content": "hi"}]

    async def main() -> None:
        async with await stashpoint.aio.open(tmp_path / "store") as store:
            run = await store.session("s", workspace=ws)
            assert await run.get_head() is None and await run.state() == {}
            before = snapshot_tree(ws)
            cp1 = await run.checkpoint({"messages": msgs, "plan": [1]}, label="first")
            (ws / "a.txt").write_text("two\n")
            (ws / "new.txt").write_text("new\n")
            more = [*msgs, {"role": "ai", "content": "yo"}]
            cp2 = await run.checkpoint({"messages": more, "plan": [1, 2]}, message="second")

            assert (await run.get_head()) == cp2
            assert await run.state() == {"messages": more, "plan": [1, 2]}
            assert await run.state(cp1.id) == {"messages": msgs, "plan": [1]}
            assert [c.id for c in await run.history()] == [cp2.id, cp1.id]
            assert await run.resolve("first") == cp1.id == await run.resolve("HEAD~1")
            assert (await run.get(cp1.id[:12])).id == cp1.id
            assert await run.labels() == {cp1.id: "first"}
            await run.label(cp2.id, "second")
            assert (await run.labels())[cp2.id] == "second"

            d = await run.diff(cp1.id, "HEAD")
            assert d.values == [("plan", "changed", [1], [1, 2])]
            assert d.messages_removed == 0 and d.messages_added == [more[1]]
            assert {(c.path, c.status) for c in d.files} == {
                (b"a.txt", "modified"),
                (b"new.txt", "added"),
            }

            r = await run.rewind(cp1.id)
            assert snapshot_tree(ws) == before
            assert r.target.id == cp1.id and (await run.get_head()) == r.head
            assert await run.state() == {"messages": msgs, "plan": [1]}
            # the rewind is undoable: its safety checkpoint has the second version
            await run.rewind(r.safety.id, state=False)
            assert (ws / "a.txt").read_text() == "two\n"

            b = await run.fork(cp1.id, "try-b", into=tmp_path / "b")
            assert isinstance(b, AsyncSession) and b is not run and b.branch == "try-b"
            assert snapshot_tree(tmp_path / "b") == before
            assert await b.state() == {"messages": msgs, "plan": [1]}
            bcp = await b.checkpoint({"messages": msgs, "plan": ["b"]})
            assert bcp.parent == cp1.id and bcp.branch == "try-b"
            assert set(await run.branches()) == {"main", "try-b"}
            assert await store.sessions() == ["s"]

            same = await run.fork(cp2.id, "in-place")
            assert same is run and run.branch == "in-place"
            assert (ws / "new.txt").exists()

            assert (await store.run_sync(verify_store)).ok

    _run(main())


def test_errors_propagate_unchanged_and_a_closed_store_refuses(tmp_path: Path) -> None:
    async def main() -> None:
        store = await stashpoint.aio.open(tmp_path / "store")
        run = await store.session("s")
        with pytest.raises(stashpoint.NotFoundError):
            await run.get("no-such-checkpoint")
        with pytest.raises(stashpoint.UsageError):
            await run.checkpoint(kind="no-such-kind")
        await run.checkpoint({"x": 1})
        await store.close()
        await store.close()  # idempotent
        with pytest.raises(stashpoint.UsageError, match="closed"):
            await run.checkpoint({"x": 2})
        with pytest.raises(stashpoint.UsageError, match="closed"):
            await store.sessions()
        again = stashpoint.open(tmp_path / "store")
        assert len(again.session("s").history()) == 1
        again.close()

    _run(main())


# Sync names deliberately without an async twin of the same name, and why.
_NO_TWIN: dict[type, set[str]] = {
    stashpoint.Session: {
        "head",  # a property that may read the store: `await run.get_head()` instead
        "durable",  # the engine itself, used through the sync session (`run.sync.durable`)
        "fence",  # a property that may renew the lease (a store round trip): see its lease
        "run",  # a sync program: `await run.run_sync(stashpoint.Session.run, fn)`
        "resume",  # an alias of run
    },
    stashpoint.Store: {
        "gc_epoch",  # plumbing the store's sessions stamp their caches with (reads the store)
        "committed",  # a hook sessions call after each commit
        "open_row",  # verification plumbing on raw rows
        "last_good",
        "with_last_good",
    },
}
# AsyncLease *is* a Lease (it inherits every sync name); these need no awaitable twin, every
# other public Lease name needs one named with an ``a`` (as ``arun`` for ``run``).
_LEASE_NO_IO = {"lost", "mark_lost"}
# Twins that do no store I/O, so they are plain methods rather than coroutines.
_NOT_AWAITED = {
    "trial",  # returns an async context manager (AsyncTrial): `async with run.trial(n)`
    "step",
    "tool",
    "plan",
    "task",
    "set_task",
    "track",
    "validator",
    "validate",
    "resource",
    "get_resource",
}
_DUNDER_TWINS = {"__enter__": "__aenter__", "__exit__": "__aexit__"}
_INTERNAL_PARAMS = {"checkpoint": {"journal"}}  # the durable engine's own parameter


def test_the_async_names_mirror_the_sync_signatures() -> None:
    """Every public name of the sync classes has a twin (minus _NO_TWIN), with the same
    parameter names, kinds and defaults, so a new sync method without a twin fails here."""
    for sync_cls, async_cls in [(stashpoint.Session, AsyncSession), (stashpoint.Store, AsyncStore)]:
        public = [n for n in dir(sync_cls) if not n.startswith("_")] + list(_DUNDER_TWINS)
        for name in public:
            if name in _NO_TWIN[sync_cls] or not hasattr(sync_cls, name):
                continue
            where = f"{async_cls.__name__}.{name}"
            if name in _DUNDER_TWINS:
                twin = getattr(async_cls, _DUNDER_TWINS[name], None)
                assert twin is not None and inspect.iscoroutinefunction(twin), where
                continue
            sync_attr = inspect.getattr_static(sync_cls, name)
            assert hasattr(async_cls, name), f"{where} is missing"
            if isinstance(sync_attr, property):
                assert isinstance(inspect.getattr_static(async_cls, name), property), where
                continue
            want = [
                (p.name, p.kind, p.default)
                for p in inspect.signature(getattr(sync_cls, name)).parameters.values()
                if p.name not in _INTERNAL_PARAMS.get(name, set())
            ]
            got = [
                (p.name, p.kind, p.default)
                for p in inspect.signature(getattr(async_cls, name)).parameters.values()
            ]
            assert got == want, where
            io = name not in _NOT_AWAITED
            assert inspect.iscoroutinefunction(getattr(async_cls, name)) == io, where
    for name in ("keep", "rollback"):  # an async trial's outcomes take what a trial's take
        want = [
            (p.name, p.kind, p.default)
            for p in inspect.signature(getattr(stashpoint.trial.Trial, name)).parameters.values()
        ]
        got = [
            (p.name, p.kind, p.default)
            for p in inspect.signature(getattr(stashpoint.aio.AsyncTrial, name)).parameters.values()
        ]
        assert got == want and inspect.iscoroutinefunction(
            getattr(stashpoint.aio.AsyncTrial, name)
        ), name
    alease = stashpoint.aio.AsyncLease
    assert issubclass(alease, stashpoint.Lease)
    for name in _DUNDER_TWINS.values():
        assert inspect.iscoroutinefunction(getattr(alease, name)), name
    for name in dir(stashpoint.Lease):
        if name.startswith("_") or name in _LEASE_NO_IO:
            continue
        twin = getattr(alease, "a" + name, None)
        assert twin is not None and inspect.iscoroutinefunction(twin), f"AsyncLease.a{name}"
        sig = inspect.signature(getattr(stashpoint.Lease, name))
        assert inspect.signature(twin).parameters == sig.parameters, name
    sync_open = inspect.signature(stashpoint.open).parameters
    async_open = inspect.signature(stashpoint.aio.open).parameters
    assert list(sync_open) == [p for p in async_open if p != "max_workers"]
    assert stashpoint.open_async is stashpoint.aio.open
    assert stashpoint.AsyncStore is AsyncStore and stashpoint.AsyncSession is AsyncSession


# -- order, concurrency, responsiveness --------------------------------------------------------
def test_fifty_concurrent_checkpoints_keep_call_order_in_one_linear_chain(tmp_path: Path) -> None:
    async def main() -> None:
        async with await stashpoint.aio.open(tmp_path / "store") as store:
            run = await store.session("s")
            made = await asyncio.gather(*(run.checkpoint({"i": i}) for i in range(50)))
            history = await run.history()
            assert len(history) == 50 == len({c.id for c in made})
            _linear(history)
            # made in the order they were called, not in whatever order threads ran them
            assert [c.id for c in reversed(history)] == [c.id for c in made]
            assert [c.step for c in made] == list(range(1, 51))
            assert await run.state() == {"i": 49}
            assert (await store.run_sync(verify_store)).ok

    _run(main())


def test_two_async_sessions_on_one_session_run_in_parallel_and_lose_nothing(
    tmp_path: Path,
) -> None:
    """Separate queues run in parallel threads; the head compare-and-set keeps one chain."""

    async def main() -> None:
        async with await stashpoint.aio.open(tmp_path / "store", max_workers=4) as store:
            a, b = await store.session("s"), await store.session("s")
            await asyncio.gather(
                *(a.checkpoint({"who": "a", "i": i}) for i in range(25)),
                *(b.checkpoint({"who": "b", "i": i}) for i in range(25)),
            )
            history = await a.history()
            assert len(history) == 50
            _linear(history)
            seen = [(await a.state(c))["who"] for c in reversed(history)]
            assert seen.count("a") == seen.count("b") == 25

    _run(main())


def test_the_event_loop_keeps_running_during_a_20_mb_snapshot(tmp_path: Path) -> None:
    """A heartbeat coroutine ticking every 5 ms keeps ticking while 20 MiB are hashed and
    stored; run inline, the same snapshot would give it no tick at all."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(20):
        (ws / f"f{i}.bin").write_bytes(os.urandom(MiB))

    async def main() -> tuple[float, list[float], stashpoint.Checkpoint]:
        loop = asyncio.get_running_loop()
        ticks: list[float] = []
        stop = asyncio.Event()

        async def heartbeat() -> None:
            while not stop.is_set():
                ticks.append(loop.time())
                await asyncio.sleep(0.005)

        async with await stashpoint.aio.open(tmp_path / "store") as store:
            run = await store.session("s", workspace=ws)
            beat = asyncio.create_task(heartbeat())
            await asyncio.sleep(0.02)
            t0 = loop.time()
            cp = await run.checkpoint({"n": 1})
            t1 = loop.time()
            stop.set()
            await beat
        during = [t for t in ticks if t0 < t < t1]
        return t1 - t0, [t0, *during, t1], cp

    took, window, cp = _run(main())
    assert cp.workspace is not None and cp.workspace.files == 20
    assert cp.workspace.bytes == 20 * MiB
    gaps = [b - a for a, b in itertools.pairwise(window)]
    assert len(window) - 2 >= 5, f"{len(window) - 2} ticks in a {took:.3f} s snapshot"
    assert max(gaps) < max(0.1, took / 3), f"the loop stalled {max(gaps):.3f} s of {took:.3f} s"


# -- cancellation ---------------------------------------------------------------------------
def test_a_cancelled_checkpoint_that_started_completes_and_the_store_verifies(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(8):
        (ws / f"f{i}.bin").write_bytes(os.urandom(MiB // 2))
    started, release = threading.Event(), threading.Event()

    def progress(files: int, nbytes: int) -> None:
        if files == 1:  # mid-scan: hold the worker here until the awaiting task is cancelled
            started.set()
            release.wait(10)

    async def main() -> None:
        async with await stashpoint.aio.open(tmp_path / "store") as store:
            run = await store.session("s", workspace=ws)
            base = await run.checkpoint({"n": 0}, files=False)
            task = asyncio.create_task(run.checkpoint({"n": 1}, progress=progress))
            while not started.is_set():
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert task.cancelled()
            # the worker is still mid-snapshot: nothing new is visible yet
            assert (await store.run_sync(lambda s: s.meta.get_head("s", "main"))) == base.id
            release.set()
            history = await run.history()  # queued behind the cancelled call: sees it
            assert len(history) == 2 and history[1].id == base.id
            _linear(history)
            assert await run.state() == {"n": 1}
            assert history[0].workspace is not None and history[0].workspace.files == 8
            assert (await store.run_sync(verify_store)).ok

    try:
        _run(main())
    finally:
        release.set()


@pytest.mark.parametrize("how", ["lease", "session"])
def test_a_lease_acquired_for_a_cancelled_caller_is_released(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled (or timed out) while its worker acquires the lease (``wait=`` polling, a slow
    store), the caller is gone when the worker gets it: it must be released, not renewed by
    its thread until the process exits with the session locked for everyone."""
    acquiring, go_on = threading.Event(), threading.Event()

    async def main() -> None:
        async with await stashpoint.aio.open(tmp_path / "store") as store:
            real = store.sync.meta.acquire_lease
            held: list[bool] = []

            def slow_acquire(*args: Any, **kwargs: Any) -> Any:
                got = real(*args, **kwargs)
                if not held:  # the first acquisition waits until its caller has given up
                    held.append(True)
                    acquiring.set()
                    go_on.wait(10)
                return got

            monkeypatch.setattr(store.sync.meta, "acquire_lease", slow_acquire)
            call = (
                store.lease("s", ttl=2, wait=30) if how == "lease" else store.session("s", lease=2)
            )
            task: asyncio.Task[Any] = asyncio.create_task(call)
            while not acquiring.is_set():
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            go_on.set()
            # another worker gets the session (it waits while the orphan is being released)
            other = await store.run_sync(lambda s: s.lease("s", ttl=2, wait=10))
            assert other.token == 2
            await asyncio.get_running_loop().run_in_executor(None, other.release)

    try:
        _run(main())
    finally:
        go_on.set()


def test_a_cancelled_call_that_had_not_started_never_runs(tmp_path: Path) -> None:
    busy, release = threading.Event(), threading.Event()

    def hold(session: stashpoint.Session) -> str:
        busy.set()
        release.wait(10)
        return "held"

    async def main() -> None:
        async with await stashpoint.aio.open(tmp_path / "store") as store:
            run = await store.session("s")
            first = asyncio.create_task(run.run_sync(hold))
            second = asyncio.create_task(run.checkpoint({"must": "not run"}))
            while not busy.is_set():
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.01)  # both submitted; the second waits in the queue
            second.cancel()
            with pytest.raises(asyncio.CancelledError):
                await second
            release.set()
            assert await first == "held"
            assert await run.history() == []
            with pytest.raises(asyncio.TimeoutError):  # a timeout is a cancellation too
                await asyncio.wait_for(
                    asyncio.gather(run.run_sync(hold), run.checkpoint({"x": 1})), 0
                )
            assert await run.history() == []
            await run.checkpoint({"x": 2})
            assert await run.state() == {"x": 2}

    try:
        _run(main())
    finally:
        release.set()


def test_calls_run_in_the_callers_context(tmp_path: Path) -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")

    async def main() -> None:
        async with await stashpoint.aio.open(tmp_path / "store") as store:
            run = await store.session("s")
            var.set("agent-7")
            seen = await run.run_sync(lambda _s: (var.get(), threading.current_thread().name))
            assert seen[0] == "agent-7"
            assert seen[1].startswith("stashpoint-aio")

    _run(main())


# -- durable programs -----------------------------------------------------------------------
def _program(run: AsyncSession, calls: list[str]) -> Callable[[], Awaitable[str]]:
    @run.step
    async def ask(question: str) -> str:
        calls.append(question)
        await asyncio.sleep(0.001 if question == "a" else 0)
        return question.upper()

    @run.tool(irreversible=True, approval=True)
    async def deploy(env: str) -> str:
        calls.append(f"deploy {env}")
        return f"deployed {env}"

    async def main() -> str:
        run.plan([("think", "Think"), ("ship", "Ship it")])
        with run.task("think"):
            a, b = await asyncio.gather(ask("a"), ask("b"))
            cp = await run.checkpoint({"answers": [a, b]}, message="mid-run")
            assert cp.journal is not None and cp.journal.length >= 4  # plan, task, 2 steps
        with run.task("ship"):
            return await deploy("prod")

    return main


def test_a_durable_program_pauses_is_approved_and_resumes_without_rerunning(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with await stashpoint.aio.open(tmp_path / "store") as store:
            calls: list[str] = []
            run = await store.session("d")
            res = await run.arun(_program(run, calls))
            assert res.status == "awaiting_approval" and sorted(calls) == ["a", "b"]
            pending = await run.pending()
            assert pending is not None and pending.kind == "approval"
            assert pending.tool.endswith("deploy")
            tasks = {t.id: t.status for t in await run.tasks()}
            assert tasks["think"] == "completed"
            head = await run.get_head()
            assert head is not None and head.status == "awaiting_approval"
            assert (await run.state(head))["answers"] == ["A", "B"]

            decided = await run.approve(reason="fine", by="ops")
            assert decided.kind == "approval"
            assert await run.pending() is None

            again = await store.session("d")  # as a new process would
            res = await again.arun(_program(again, calls))
            assert res.status == "completed" and res.value == "deployed prod"
            assert sorted(calls) == ["a", "b", "deploy prod"]  # the steps replayed
            assert res.replayed >= 2
            effects = await again.effects()
            assert [(e.tool.split(".")[-1], e.status) for e in effects] == [("deploy", "done")]
            assert {t.status for t in await again.tasks()} == {"completed"}
            # a warning raised in the worker thread reaches the awaiting caller
            with pytest.warns(stashpoint.StashpointWarning, match="cannot be undone"):
                back = await again.rewind(head.id)
            assert [e.status for e in back.effects] == ["done"]
            assert (await store.run_sync(verify_store)).ok

            rejected = await store.session("r")
            assert (await rejected.arun(_program(rejected, []))).status == "awaiting_approval"
            cp = await rejected.reject(reason="not today")
            assert cp.kind == "approval" and await rejected.pending() is None

    _run(main())


def test_arun_starts_and_closes_its_run_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's start (journal, compensations) and its closing "completed" / "failed"
    checkpoint (a workspace snapshot) run in worker threads, not on the loop: a callback
    scheduled on the loop runs while the closing checkpoint is being taken."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")

    async def main() -> dict[str, set[str]]:
        loop = asyncio.get_running_loop()
        async with await stashpoint.aio.open(tmp_path / "store") as store:
            run = await store.session("d", workspace=ws)
            engine = run.sync.durable
            threads: dict[str, set[str]] = {}
            for name in ("begin", "_finish", "_failed"):

                def spy(
                    *a: Any, _real: Any = getattr(engine, name), _n: str = name, **k: Any
                ) -> Any:
                    threads.setdefault(_n, set()).add(threading.current_thread().name)
                    return _real(*a, **k)

                monkeypatch.setattr(engine, name, spy)

            def state() -> dict[str, Any]:
                # called by the closing checkpoint: only a free loop runs this callback
                loop_ran = threading.Event()
                loop.call_soon_threadsafe(loop_ran.set)
                return {"loop_ran": loop_ran.wait(5)}

            run.track(state)

            @run.step
            async def work(x: int) -> int:
                return x + 1

            async def ok() -> int:
                return await work(1)

            async def bad() -> None:
                await work(2)
                raise ValueError("boom")

            res = await run.arun(ok)
            assert res.status == "completed" and res.value == 2
            assert await run.state() == {"loop_ran": True}
            with pytest.raises(ValueError, match="boom"):
                await run.arun(bad, fresh=True)
            head = await run.get_head()
            assert head is not None and head.status == "failed"
            assert await run.state() == {"loop_ran": True}
            return threads

    threads = _run(main())
    assert set(threads) == {"begin", "_finish", "_failed"}
    assert all(t.startswith("stashpoint-aio") for seen in threads.values() for t in seen)


def test_the_other_twins_work_without_blocking_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """edit / validators, read_artifact, resources, remaining_tasks, ``async with`` on a
    session and a lease, and the store's resolve / get / durability: the sync behaviour,
    with the blocking part (here: every lease release) in a worker thread."""
    from stashpoint.edit import ValidationError

    art = tmp_path / "weights.bin"
    art.write_bytes(os.urandom(300_000))

    async def main() -> set[str]:
        async with await stashpoint.aio.open(tmp_path / "store") as store:
            released_in: set[str] = set()
            real_release = store.sync.meta.release_lease

            def release_lease(*args: Any, **kwargs: Any) -> Any:
                released_in.add(threading.current_thread().name)
                return real_release(*args, **kwargs)

            monkeypatch.setattr(store.sync.meta, "release_lease", release_lease)

            async with await store.session("s", lease=30) as run:

                @run.validator
                def no_debt(state: dict[str, Any]) -> bool | str:
                    return state.get("budget", 0) >= 0 or "negative budget"

                cp = await run.checkpoint({"budget": 1}, artifacts={"w": art})
                with pytest.raises(ValidationError, match="negative budget"):
                    await run.edit(assign={"budget": -1})
                with pytest.raises(ValidationError):
                    run.validate({"budget": -5})
                edited = await run.edit(assign={"budget": 5}, reason="more")
                assert edited.kind == "edit" and await run.state() == {"budget": 5}
                chunks = [c async for c in await run.read_artifact(cp.id, "w")]
                assert b"".join(chunks) == art.read_bytes()
                with pytest.raises(stashpoint.NotFoundError):
                    await run.read_artifact(cp.id, "nope")

                @run.resource("conn")
                def conn() -> object:
                    return object()

                assert run.get_resource("conn") is run.get_resource("conn")
                await run.check_may_write()
                assert await run.complete_interrupted_restore() is False

            # `async with` released the session's lease: another lease can be had at once
            async with await store.lease("s", ttl=30) as lease:
                assert isinstance(lease, stashpoint.Lease) and not lease.lost
                await lease.acheck()
                await lease.arenew()
            assert lease.lost

            assert await store.resolve(cp.id[:12]) == cp.id
            assert (await store.get(cp.id)).id == cp.id
            assert str(await store.set_durability("exit")) == "exit"
            assert (await store.durability_report())["backend"] == store.sync.meta.durability

            durable = await store.session("d")

            async def program() -> list[str]:
                durable.plan(["think", "ship"])
                with durable.task("think"):
                    pass
                return [t.id for t in await durable.remaining_tasks()]

            assert (await durable.arun(program)).value == ["ship"]
            return released_in

    released_in = _run(main())
    assert len(released_in) >= 1
    assert threading.main_thread().name not in released_in  # the loop's thread


# -- shared stores ----------------------------------------------------------------------------
PG_URL = os.environ.get("STASHPOINT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("STASHPOINT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _absent(what: str, url: str, exc: Exception) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{what} at {url} is required under CI: {exc}")
    pytest.skip(f"no {what} at {url}: {exc}")


@pytest.fixture
def pg_url() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        _absent("PostgreSQL", PG_URL, exc)
    schema = "sp_" + uuid.uuid4().hex[:12]
    with psycopg.connect(PG_URL, autocommit=True) as db:
        db.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in PG_URL else "?"
    yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(PG_URL, autocommit=True) as db:
        db.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def redis_url() -> Iterator[str]:
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        client.close()
        _absent("Redis", REDIS_URL, exc)
    prefix = f"sptest{uuid.uuid4().hex[:10]}:"
    yield f"{REDIS_URL}?prefix={prefix}"
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        client.delete(key)
    client.close()


def _shared_store_round_trip(url: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one")
    (ws / "big.bin").write_bytes(os.urandom(2 * MiB + 5))

    async def main() -> None:
        async with await stashpoint.aio.open(url) as store:
            run = await store.session("s", workspace=ws)
            before = snapshot_tree(ws)
            cp = await run.checkpoint({"messages": [{"role": "user", "content": "hi"}]})
            (ws / "a.txt").write_text("two")
            (ws / "big.bin").unlink()
            await asyncio.gather(*(run.checkpoint({"i": i}) for i in range(20)))
            history = await run.history()
            assert len(history) == 21
            _linear(history)
            await run.rewind(cp.id)
            assert snapshot_tree(ws) == before
            assert await run.state() == {"messages": [{"role": "user", "content": "hi"}]}
            assert (await store.run_sync(verify_store)).ok

    _run(main())


def test_postgres_through_the_async_api(pg_url: str, tmp_path: Path) -> None:
    _shared_store_round_trip(pg_url, tmp_path)


def test_redis_through_the_async_api(redis_url: str, tmp_path: Path) -> None:
    _shared_store_round_trip(redis_url, tmp_path)


def test_store_wraps_a_sync_store_and_opens_sessions_without_blocking(tmp_path: Path) -> None:
    async def main() -> None:
        sync = stashpoint.open(tmp_path / "store")
        store = AsyncStore(sync, max_workers=2)
        assert store.sync is sync and store.url == sync.url and store.id == sync.id
        run = await store.session("x")
        assert repr(run) == "<AsyncSession 'x' branch 'main'>"
        await asyncio.gather(*(run.checkpoint({"i": i}) for i in range(5)))
        await store.close()
        again = stashpoint.open(tmp_path / "store")
        assert len(again.session("x").history()) == 5
        again.close()

    _run(main())


def test_file_store_through_the_async_api(tmp_path: Path) -> None:
    _shared_store_round_trip(f"file://{tmp_path / 'fs'}", tmp_path)


def _calls_in_a_child(made_before: SerialQueue) -> None:
    ok = False
    try:
        ok = asyncio.run(made_before.call(int, "2")) == 2
        ok = ok and asyncio.run(SerialQueue().call(int, "3")) == 3
    finally:
        os._exit(0 if ok else 1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_queue_forked_while_it_runs_a_call_works_in_the_child() -> None:
    """A fork that lands while one of the parent's workers is running a queue's call (or has
    delivered its result and not yet marked the queue idle): the child's queue is idle and
    empty, not waiting forever for a drain by a thread the child does not have."""
    queue = SerialQueue()
    release = threading.Event()
    started = threading.Event()

    def blocking() -> None:
        started.set()
        release.wait(30)

    running = queue.submit(blocking)
    assert started.wait(10)
    queue.submit(lambda: None)  # queued behind it: the parent's, not to be run by the child
    try:
        child = multiprocessing.get_context("fork").Process(target=_calls_in_a_child, args=(queue,))
        child.start()
        child.join(20)
        if child.exitcode is None:  # the failure this test is about: the child hangs
            child.kill()
            child.join()
        assert child.exitcode == 0
    finally:
        release.set()
        running.result(10)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_serial_queues_work_in_a_forked_child() -> None:
    """The integrations' queues share one pool: a child forked after it started threads (an
    agent worker forked from a service) gets its own, instead of waiting forever on the
    parent's threads, which do not exist in the child."""
    queue = SerialQueue()
    assert asyncio.run(queue.call(int, "1")) == 1  # the shared pool has an idle thread now
    child = multiprocessing.get_context("fork").Process(target=_calls_in_a_child, args=(queue,))
    child.start()
    child.join(60)
    if child.exitcode is None:  # pragma: no cover - the failure this test is about
        child.kill()
        child.join()
    assert child.exitcode == 0
