"""Leases across processes: one worker owns a session; a stalled or crashed worker
is taken over after its lease expires and is fenced off; others are refused with exit 3."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import stashpoint
from stashpoint.errors import LeaseHeld, LeaseLost
from stashpoint.lease import acquire

from .conftest import STASHPOINT
from .test_postgres import pg_url  # noqa: F401 - fixture

ENV_SRC = {**os.environ, "PYTHONPATH": str(Path(stashpoint.__file__).parents[1])}


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "store")
    else:
        yield request.getfixturevalue("pg_url")


def test_stalled_worker_is_fenced_after_takeover(url: str, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("a")
    with stashpoint.open(url) as store_a, stashpoint.open(url) as store_b:
        # Worker A stops renewing (a long GC pause, a frozen VM): its lease runs out.
        stalled = acquire(store_a.meta, "job", ttl=3, owner="worker-a", renew=False)
        run_a = store_a.session("job", workspace=ws, lease=stalled)
        first = run_a.checkpoint({"step": 1})
        with pytest.raises(LeaseHeld, match="worker-a"):
            store_b.session("job", lease=True)
        while (info := store_b.meta.lease_info("job")) is not None and info.expires_in > 0:
            time.sleep(0.1)
        with store_b.session("job", lease=5.0) as run_b:
            assert run_b.lease is not None and run_b.lease.token == stalled.token + 1
            (ws / "f.txt").write_text("b")
            with pytest.raises(LeaseLost, match="taken over"):
                run_a.checkpoint({"step": 2})  # A wakes up: its write is refused
            second = run_b.checkpoint({"step": 2})
        assert second.parent == first.id
        assert [cp.id for cp in store_b.session("job").history()] == [second.id, first.id]
        # B released its lease on close: unleased writers may write again.
        store_b.session("job").checkpoint({"step": 3})


_HOLDER = textwrap.dedent(
    """
    import sys, time, stashpoint
    store = stashpoint.open(sys.argv[1])
    run = store.session("job", lease=float(sys.argv[2]))
    run.checkpoint({"by": "holder"})
    print("ready", run.lease.token, flush=True)
    time.sleep(600)
    """
)


def test_crashed_worker_is_taken_over_after_expiry(url: str, tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url, "1.0"],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV_SRC,
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline().split()
        assert line[0] == "ready", line
        token = int(line[1])
        with stashpoint.open(url) as store:
            with pytest.raises(LeaseHeld):
                store.lease("job")  # alive and renewing
            holder.send_signal(signal.SIGKILL)
            holder.wait(30)
            lease = store.lease("job", ttl=5, wait=30)  # waits out the dead worker's lease
            assert lease.token == token + 1 and lease.owner != ""
            with store.session("job", lease=lease) as run:
                cp = run.checkpoint({"by": "successor"})
                assert run.head is not None and run.head.id == cp.id
            lease.release()
    finally:
        holder.kill()
        holder.wait(30)
        if holder.stdout is not None:
            holder.stdout.close()


def _lease_worker(url: str, worker: int, rounds: int, per: int, out: object) -> None:
    store = stashpoint.open(url)
    made = []
    for _ in range(rounds):
        with store.lease("shared", ttl=10, wait=120) as lease:
            run = store.session("shared", lease=lease)
            for i in range(per):
                made.append(run.checkpoint({"worker": worker, "i": i}).id)
    store.close()
    out.put(made)  # type: ignore[attr-defined]


def test_workers_take_turns_without_a_conflict(url: str) -> None:
    """4 processes share one session by lease: one linear chain, nothing lost, no retries."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_lease_worker, args=(url, w, 5, 3, out)) for w in range(4)]
    for p in procs:
        p.start()
    made = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    ids = {i for m in made for i in m}
    assert len(ids) == 4 * 5 * 3
    with stashpoint.open(url) as store:
        history = store.session("shared").history()
        assert {cp.id for cp in history} == ids
        assert history[-1].parent is None
        assert all(a.parent == b.id for a, b in itertools.pairwise(history))
        info = store.meta.lease_info("shared")
        assert info is not None and info.token == 4 * 5 and info.expires_in <= 0


def test_cli_write_to_a_leased_session_exits_3(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("x")
    env = {**ENV_SRC, "HOME": str(tmp_path)}
    subprocess.run([*STASHPOINT, "init"], cwd=ws, env=env, check=True, capture_output=True)
    subprocess.run([*STASHPOINT, "snap"], cwd=ws, env=env, check=True, capture_output=True)
    (ws / "f.txt").write_text("x2")
    subprocess.run([*STASHPOINT, "snap"], cwd=ws, env=env, check=True, capture_output=True)
    with stashpoint.open(ws / ".stashpoint") as store, store.lease("main", owner="agent-7"):
        (ws / "f.txt").write_text("y")
        res = subprocess.run(
            [*STASHPOINT, "snap", "-m", "stray"], cwd=ws, env=env, capture_output=True, text=True
        )
        assert res.returncode == 3, res.stderr
        assert "leased by agent-7" in res.stderr
        res = subprocess.run(  # pruning is a write to the session too
            [*STASHPOINT, "prune", "--keep-last", "1"],
            cwd=ws,
            env=env,
            capture_output=True,
            text=True,
        )
        assert res.returncode == 3 and "leased by agent-7" in res.stderr, res.stderr
        assert store.meta.pruned("main") == {}
    res = subprocess.run(
        [*STASHPOINT, "snap", "-m", "after"], cwd=ws, env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr


def test_async_api_takes_and_releases_a_lease(tmp_path: Path) -> None:
    import asyncio

    async def main() -> int:
        async with await stashpoint.open_async(tmp_path / "s") as store:
            lease = await store.lease("job", ttl=10, owner="async-worker")
            run = await store.session("job", lease=lease)
            await run.checkpoint({"n": 1})
            with pytest.raises(LeaseHeld):  # an unleased writer is refused meanwhile
                await store.run_sync(lambda s: s.session("job").checkpoint({"n": 2}))
            lease.release()
            again = await store.lease("job", ttl=10, owner="other")
            again.release()
            return again.token

    assert asyncio.run(main()) == 2


def test_no_durable_step_runs_outside_anothers_lease(url: str) -> None:
    """A process without the lease must not run a step body (a side effect) while another
    worker holds it, nor replace the run record, nor label: refused before anything runs."""
    ran: list[str] = []
    with (
        stashpoint.open(url) as store_b,
        stashpoint.open(url) as store_x,
        store_b.session("job", lease=30.0) as run_b,
    ):
        run_b.checkpoint({"n": 0})
        stray = store_x.session("job")

        @stray.step
        def send(to: str) -> str:
            ran.append(to)
            return f"sent {to}"

        def program() -> str:
            return send("ceo@example.com")

        with pytest.raises(LeaseHeld):
            stray.run(program)
        assert ran == []
        with pytest.raises(LeaseHeld):
            stray.label("HEAD", "mine")
        assert not [k for k, _v in store_b.meta.iter_meta("run:job:")]


def test_leases_in_one_process_exclude_each_other_and_forks_hold_none(tmp_path: Path) -> None:
    with stashpoint.open(tmp_path / "s") as store:
        first = store.lease("job", ttl=30)
        with pytest.raises(LeaseHeld):
            store.lease("job", ttl=30)  # another thread or request of this process
        pid = os.fork()
        if pid == 0:  # the child: the parent's lease is not its own
            code = 0
            try:
                first.check()
                code = 1
            except LeaseLost:
                first.release()  # must not free the parent's session
            os._exit(code)
        _pid, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        info = store.meta.lease_info("job")
        assert info is not None and info.expires_in > 0 and info.token == first.token
        first.check()
        first.release()


def test_a_taken_over_worker_writes_no_label_and_runs_no_step_body(url: str) -> None:
    """Labels and step bodies are not fenced by the store in a write's transaction: the lease
    itself refuses them once it may have expired (past ttl since its last renewal), and after
    the store refused one of the worker's writes."""
    with stashpoint.open(url) as store_a, stashpoint.open(url) as store_b:
        stalled = acquire(store_a.meta, "job", ttl=1.0, owner="worker-a", renew=False)
        run_a = store_a.session("job", lease=stalled)
        first = run_a.checkpoint({"step": 1}, files=False)
        while (info := store_b.meta.lease_info("job")) is not None and info.expires_in > 0:
            time.sleep(0.05)
        taker = store_b.lease("job", ttl=30)
        ran: list[str] = []

        @run_a.step
        def send_email() -> str:
            ran.append("sent")
            return "sent"

        with pytest.raises(LeaseLost):
            run_a.run(send_email)
        assert ran == []
        with pytest.raises(LeaseLost):
            run_a.label(first.id, "by-a")
        assert store_b.session("job").labels() == {}
        taker.release()


def test_a_refused_write_makes_the_lease_refuse_the_next_step(tmp_path: Path) -> None:
    """Within its ttl a lease trusts itself; once the store refused a write of the worker
    (its token is stale), the step bodies that follow are refused too."""
    with stashpoint.open(tmp_path / "store") as store:
        lease = acquire(store.meta, "job", ttl=60, renew=False)
        run = store.session("job", lease=lease)
        run.checkpoint({"step": 1}, files=False)
        store.meta.release_lease(lease.fence)  # the store forgets it behind the worker's back
        taker = store.lease("job", ttl=60)
        with pytest.raises(LeaseLost):
            run.checkpoint({"step": 2}, files=False)
        ran: list[str] = []

        @run.step
        def act() -> None:
            ran.append("ran")

        with pytest.raises(LeaseLost):
            run.run(act)
        assert ran == []
        taker.release()
