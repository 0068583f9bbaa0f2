"""Writers of one SQLite store queue for their turn in the kernel, not in SQLite's busy handler.

The queue is an ``flock`` on ``store.db-writers``, held for exactly one write transaction. The
tests check who holds it and who waits (with real processes and threads), never time.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import stashpoint
from stashpoint.errors import StoreError
from stashpoint.stores.sqlite import SqliteStore


def _queue_file(root: Path) -> Path:
    return root / "store.db-writers"


def _locked_by_someone(path: Path) -> bool:
    """Whether another descriptor holds the flock (ours is taken and dropped at once)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_write_transaction_holds_the_turn_and_gives_it_back(tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path)
    meta = store.refs.inner
    assert isinstance(meta, SqliteStore)
    seen: list[bool] = []
    meta._tx(lambda db: seen.append(_locked_by_someone(_queue_file(tmp_path))))
    assert seen == [True]
    assert not _locked_by_someone(_queue_file(tmp_path))
    assert _queue_file(tmp_path).stat().st_mode & 0o777 == 0o600
    store.close()


def test_a_checkpoint_waits_while_another_writer_holds_the_turn(tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path)
    session = store.session("s")
    session.checkpoint({"n": 0})
    fd = os.open(_queue_file(tmp_path), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process's writer, as far as the store can tell
    done = threading.Event()

    def write() -> None:
        session.checkpoint({"n": 1})
        done.set()

    worker = threading.Thread(target=write)
    worker.start()
    try:
        assert not done.wait(0.5), "the checkpoint did not wait for its turn"
    finally:
        os.close(fd)  # the turn passes on
    worker.join(30)
    assert done.is_set()
    assert store.session("s").state() == {"n": 1}
    store.close()


def test_a_forked_child_queues_with_its_own_descriptor(tmp_path: Path) -> None:
    """An inherited descriptor shares the parent's lock: a child using it would walk past a
    parent that holds the turn. The child must open its own and wait."""
    store = stashpoint.open(tmp_path)
    meta = store.refs.inner
    assert isinstance(meta, SqliteStore)
    store.session("s").checkpoint({"n": 0})  # the parent's descriptor is open now
    read, write = os.pipe()
    with meta._writers.turn():
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            os.close(read)
            got = threading.Event()

            def take() -> None:
                with meta._writers.turn():
                    got.set()

            threading.Thread(target=take, daemon=True).start()
            waited = not got.wait(0.5)
            os.write(write, b"W" if waited else b"-")
            got.wait(30)  # the parent lets go after reading the verdict
            os.write(write, b"T" if got.is_set() else b"-")
            os._exit(0)
        os.close(write)
        first = os.read(read, 1)
    second = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert (first, second) == (b"W", b"T")
    store.close()


def test_without_a_usable_queue_file_writers_go_straight_to_sqlite(tmp_path: Path) -> None:
    _queue_file(tmp_path).mkdir(parents=True)  # cannot be opened for writing: no queue
    with stashpoint.open(tmp_path) as store:
        session = store.session("s")
        for n in range(3):
            session.checkpoint({"n": n})
        assert [session.state(c.id) for c in session.history()] == [{"n": n} for n in (2, 1, 0)]


def test_a_second_store_object_inside_the_firsts_transaction_does_not_wait_for_itself(
    tmp_path: Path,
) -> None:
    """The turn is this thread's already: the inner write goes to SQLite, whose lock the
    outer transaction holds, and fails after the busy timeout instead of hanging forever."""
    outer = SqliteStore(tmp_path / "store.db")
    inner = SqliteStore(tmp_path / "store.db")
    inner._db.execute("PRAGMA busy_timeout=50")
    errors: list[BaseException] = []

    def nested() -> None:
        try:
            outer._tx(lambda db: inner.set_meta("k", "v"))
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=nested, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "a nested write waited for its own turn"
    assert len(errors) == 1 and isinstance(errors[0], StoreError)
    assert "locked" in str(errors[0])
    outer.close()
    inner.close()


def test_processes_taking_turns_lose_no_checkpoint(tmp_path: Path) -> None:
    import multiprocessing

    procs = 4
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(procs) as pool:
        counts = pool.starmap(_write_many, [(str(tmp_path), f"w{i}", 40) for i in range(procs)])
    assert counts == [40] * procs
    with stashpoint.open(tmp_path) as store:
        for i in range(procs):
            assert len(store.session(f"w{i}").history()) == 40


def _write_many(root: str, name: str, n: int) -> int:
    with stashpoint.open(root) as store:
        session = store.session(name)
        for i in range(n):
            session.checkpoint({"i": i})
        return n
