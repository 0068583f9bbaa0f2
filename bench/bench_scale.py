"""Scale-out: 8 processes checkpointing concurrently into one store.

Each of 8 worker processes (``spawn``) opens the store by URL, opens its own session ``w0…w7``
on its own small workspace (4 files, 0.5-2 KB) and, after one untimed warm-up checkpoint and a
barrier that starts them together, checkpoints N times (N = steps / 4: 250, ``--quick`` 50):
before each checkpoint it rewrites one file and appends one ~500 B message to its conversation;
the state is ``{"messages": [...growing by one...], "counter": i}``. Each ``checkpoint()`` call
is timed. Throughput = all timed checkpoints / (last worker's finish - the barrier).

A second variant puts all 8 processes on ONE session (one branch head, compare-and-set retries):
each still has its own workspace, and its state is ``{"counter": i, "worker": w, "note": <one
~500 B message>}`` (8 different conversations cannot share one branch without each checkpoint
forking the conversation, which is not what this measures).

Zero lost: afterwards every session's ``history()`` (which verifies every record and its parent
link) must hold exactly the acknowledged checkpoints, every acknowledged id must be there, the
chain must be one line (one root, no parent used twice), and ``verify_store`` must pass.

Peer, same server, same run, just after stashpoint's PostgreSQL rounds: LangGraph's
``PostgresSaver`` (``from_conn_string`` + ``setup()``, its own schema), 8 processes x N ``put``
calls, each its own ``thread_id``, with a small fixed-size state ``channel_values = {"counter":
i, "messages": [the one new ~500 B message]}`` (LangGraph itself would re-store the whole
growing list at every step, which would only slow it down). It snapshots no files.

Servers: ``STASHPOINT_BENCH_POSTGRES_URL`` (default: ``STASHPOINT_TEST_POSTGRES_URL`` or
``postgresql://postgres@127.0.0.1:5432/test``; a fresh schema per round, dropped afterwards) and
``STASHPOINT_BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``; a unique key prefix per
round, its keys deleted afterwards). A backend whose server or driver is missing is skipped
with a note.

    python bench/bench_scale.py [--quick]      # or: python bench/run_all.py --only scale
    python bench/bench_scale.py --profile      # cProfile + SQL statements of one PG worker

The run ends with ``bench_scale_graph``'s rows: the same LangGraph graph, 8 processes, on
stashpoint's saver and on ``PostgresSaver`` (equal work, which the rows above are not).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import Config, median, pg_base, pg_schema, row
from workload import conversation

PROCS = 8
BAR_PER_S = 1000.0
REDIS_DEFAULT = "redis://127.0.0.1:6379/0"
BARRIER_TIMEOUT = 120.0
JOIN_TIMEOUT = 900.0
GIVE_UP_LIMIT = 100

FILES = {  # path -> size in bytes
    "src/main.py": 2048,
    "src/util.py": 1024,
    "README.md": 1024,
    "notes/todo.txt": 512,
}


def _redis_base() -> str:
    return os.environ.get(
        "STASHPOINT_BENCH_REDIS_URL",
        os.environ.get("STASHPOINT_TEST_REDIS_URL", REDIS_DEFAULT),
    )


def _messages(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` messages of ~500 B each (compact JSON), alternating user/assistant."""
    return [m for pair in conversation((n + 1) // 2, seed=seed) for m in pair][:n]


def _make_workspace(root: Path, seed: int) -> dict[Path, bytes]:
    """The 4 files of a worker's workspace; returns each path with its original content."""
    out = {}
    for rel, size in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        line = f"# worker {seed} file {rel}\n".encode()
        data = (line * (size // len(line) + 1))[:size]
        p.write_bytes(data)
        out[p] = data
    return out


def _touch(files: dict[Path, bytes], i: int, tag: str) -> None:
    """Change exactly one file (round-robin); its new content names the step, so it differs.

    The new content is never shorter than the old (the step number only grows), so it is
    written over the old bytes without truncating first: the same file content as
    ``write_bytes``, without a cost that belongs to this VM rather than to checkpointing (its
    ext4 is mounted with ``discard``, and a truncating rewrite of a 2 KB file took ~0.1 ms of
    CPU against ~0.01 ms for an overwrite, in the timed window of 8 processes on 2 cores while
    the peer writes no file at all).
    """
    paths = list(files)
    p = paths[i % len(paths)]
    data = files[p] + f"# {tag} step {i}\n".encode()
    with open(p, "r+b") as f:
        f.write(data)
        if f.tell() < os.fstat(f.fileno()).st_size:
            f.truncate()  # shorter than before (not in this workload): same content anyway


# -- workers (run in spawned processes) ------------------------------------------------------


def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))  # nearest rank
    return s[k]


def _sp_worker(
    url: str,
    session: str,
    ws: str,
    per: int,
    shared: bool,
    seed: int,
    barrier: Any,
    out: Any,
) -> None:
    """Checkpoint ``per`` times into ``session``; report times, ids and CAS retries."""
    try:
        import stashpoint
        from stashpoint.errors import ConflictError

        root = Path(ws)
        files = _make_workspace(root, seed)
        msgs_all = _messages(per + 1, seed)
        store = stashpoint.open(url)
        conflicts = gave_up = 0
        commit = store.meta.commit

        def counting(c: Any) -> None:
            nonlocal conflicts
            try:
                commit(c)
            except ConflictError:
                conflicts += 1
                raise

        store.meta.commit = counting  # type: ignore[method-assign]
        # A shared session's workers each snapshot a directory of their own into one branch:
        # each names its directory explicitly (a branch is otherwise bound to one directory).
        run = store.session(session, workspace=root, bind=shared)

        def state(i: int) -> dict[str, Any]:
            if shared:
                return {"counter": i, "worker": seed, "note": msgs_all[i]}
            return {"messages": msgs_all[: i + 1], "counter": i}

        ids = [run.checkpoint(state(0), message="warm-up").id]  # first snapshot: all files
        times = []
        barrier.wait(BARRIER_TIMEOUT)
        start = time.monotonic()
        for i in range(1, per + 1):
            _touch(files, i, f"w{seed}")
            st = state(i)
            t0 = time.perf_counter()
            while True:
                try:
                    cp = run.checkpoint(st)
                    break
                except ConflictError:  # the session gave up after its own retries
                    gave_up += 1  # an application would retry, as we do; counted
                    if gave_up > GIVE_UP_LIMIT:
                        raise
            times.append(time.perf_counter() - t0)
            ids.append(cp.id)
        end = time.monotonic()
        store.close()
        out.put(
            {
                "seed": seed,
                "times": times,
                "ids": ids,
                "start": start,
                "end": end,
                "conflicts": conflicts,
                "gave_up": gave_up,
            }
        )
    except BaseException:
        barrier.abort()
        out.put({"seed": seed, "error": traceback.format_exc()})


def lg_put_args(step: int, version: Any, message: dict[str, Any]) -> tuple[Any, Any, Any]:
    """What LangGraph's loop passes to ``put`` after a step of the peer's small fixed state:
    the checkpoint, its metadata and the channel versions that moved."""
    import datetime

    from langgraph.checkpoint.base import LATEST_VERSION
    from langgraph.checkpoint.base.id import uuid6

    checkpoint: Any = {
        "v": LATEST_VERSION,
        "id": str(uuid6(clock_seq=step)),
        "ts": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "channel_values": {"counter": step, "messages": [message]},
        "channel_versions": {"counter": version, "messages": version},
        "versions_seen": {"agent": {"counter": version, "messages": version}},
        "updated_channels": ["counter", "messages"],
    }
    meta: Any = {"source": "loop", "step": step, "parents": {}}
    return checkpoint, meta, {"counter": version, "messages": version}


def _lg_worker(url: str, thread: str, per: int, seed: int, barrier: Any, out: Any) -> None:
    """``per`` LangGraph ``PostgresSaver.put`` calls on ``thread``, as LangGraph's loop makes."""
    try:
        from langgraph.checkpoint.postgres import PostgresSaver

        msgs_all = _messages(per + 1, seed)
        with PostgresSaver.from_conn_string(url) as saver:
            config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            version = None

            def put(step: int) -> Any:
                nonlocal version
                version = saver.get_next_version(version, None)
                return saver.put(config, *lg_put_args(step, version, msgs_all[step]))

            config = put(0)  # warm-up
            ids = [config["configurable"]["checkpoint_id"]]
            times = []
            barrier.wait(BARRIER_TIMEOUT)
            start = time.monotonic()
            for i in range(1, per + 1):
                t0 = time.perf_counter()
                config = put(i)
                times.append(time.perf_counter() - t0)
                ids.append(config["configurable"]["checkpoint_id"])
            end = time.monotonic()
        out.put(
            {
                "seed": seed,
                "times": times,
                "ids": ids,
                "start": start,
                "end": end,
                "conflicts": 0,
                "gave_up": 0,
            }
        )
    except BaseException:
        barrier.abort()
        out.put({"seed": seed, "error": traceback.format_exc()})


def _race(target: Callable[..., None], arg_sets: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Start one spawned process per argument tuple behind one barrier; collect their reports."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(arg_sets))
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, barrier, out)) for a in arg_sets]
    for p in procs:
        p.start()
    results = []
    deadline = time.monotonic() + JOIN_TIMEOUT
    try:
        for _ in procs:
            results.append(out.get(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError("a worker failed:\n" + errors[0])
    return sorted(results, key=lambda r: r["seed"])


def _summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    times = [t for r in results for t in r["times"]]
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {
        "count": len(times),
        "wall": wall,
        "per_s": len(times) / wall,
        "times": times,
        "conflicts": sum(r["conflicts"] for r in results),
        "gave_up": sum(r["gave_up"] for r in results),
    }


# -- stashpoint ------------------------------------------------------------------------------


def _check_sessions(url: str, expected: dict[str, list[str]]) -> dict[str, Any]:
    """Every acknowledged checkpoint is in its session's verified history, in one line."""
    import stashpoint
    from stashpoint.verify import verify_store

    lost = dup = bad_chain = same_files = 0
    problems: list[str] = []
    with stashpoint.open(url) as store:
        for session, acked in expected.items():
            history = store.session(session).history()  # verifies records and parent links
            ids = [c.id for c in history]
            found = set(ids)
            lost += len(set(acked) - found)
            dup += len(ids) - len(found)
            extra = len(found - set(acked))
            trees = {c.workspace.tree if c.workspace else None for c in history}
            same_files += len(history) - len(trees)  # a file change the snapshot missed
            parents = [c.parent for c in history if c.parent is not None]
            roots = len(history) - len(parents)
            if roots != 1 or len(set(parents)) != len(parents) or not set(parents) <= found:
                bad_chain += 1
            if extra:
                problems.append(f"{session}: {extra} checkpoint(s) nobody acknowledged")
        report = verify_store(store)
        problems += [p.message for p in report.problems[:5]]
        checked = report.checkpoints
    return {
        "lost": lost,
        "duplicated": dup,
        "bad_chains": bad_chain,
        "same_files": same_files,
        "verify_ok": report.ok,
        "verified_checkpoints": checked,
        "problems": problems,
    }


def _sp_round(url: str, tmp: Path, per: int, shared: bool) -> dict[str, Any]:
    import stashpoint

    stashpoint.open(url).close()  # create the schema once, before the race
    args = []
    for w in range(PROCS):
        ws = tmp / f"ws-{uuid.uuid4().hex[:8]}-w{w}"
        ws.mkdir(parents=True)
        session = "shared" if shared else f"w{w}"
        args.append((url, session, str(ws), per, shared, w))
    try:
        results = _race(_sp_worker, args)
    finally:
        for a in args:
            shutil.rmtree(a[2], ignore_errors=True)
    expected: dict[str, list[str]] = {}
    for r in results:
        expected.setdefault("shared" if shared else f"w{r['seed']}", []).extend(r["ids"])
    summary = _summary(results)
    summary.update(_check_sessions(url, expected))
    return summary


@contextmanager
def _redis_prefix(base: str) -> Iterator[str]:
    import redis

    prefix = f"spbench{uuid.uuid4().hex[:10]}:"
    client = redis.Redis.from_url(base)
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}prefix={prefix}"
    finally:
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
        client.close()


@contextmanager
def _sqlite_dir(tmp: Path) -> Iterator[str]:
    path = tmp / f"store-{uuid.uuid4().hex[:8]}"
    try:
        yield str(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- LangGraph -------------------------------------------------------------------------------


def _lg_round(base: str, per: int) -> dict[str, Any]:
    from langgraph.checkpoint.postgres import PostgresSaver

    with pg_schema(base, "lg") as url:
        with PostgresSaver.from_conn_string(url) as saver:
            saver.setup()
        threads = [f"t{w}" for w in range(PROCS)]
        results = _race(_lg_worker, [(url, threads[w], per, w) for w in range(PROCS)])
        summary = _summary(results)
        lost = dup = bad = 0
        with PostgresSaver.from_conn_string(url) as saver:
            for r in results:
                tuples = list(saver.list({"configurable": {"thread_id": threads[r["seed"]]}}))
                ids = [t.config["configurable"]["checkpoint_id"] for t in tuples]
                found = set(ids)
                lost += len(set(r["ids"]) - found)
                dup += len(ids) - len(found)
                parents = [
                    t.parent_config["configurable"]["checkpoint_id"]
                    for t in tuples
                    if t.parent_config
                ]
                if len(ids) - len(parents) != 1 or not set(parents) <= found:
                    bad += 1
        summary.update(
            lost=lost,
            duplicated=dup,
            bad_chains=bad,
            same_files=0,
            verify_ok=True,
            verified_checkpoints=0,
            problems=[],
        )
    return summary


# -- servers and durability ------------------------------------------------------------------


def _pg_available(base: str) -> tuple[bool, str]:
    try:
        import psycopg

        with psycopg.connect(base, connect_timeout=3, autocommit=True) as db:
            settings = {
                name: db.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
                for name in ("synchronous_commit", "fsync", "wal_sync_method")
            }
            version = db.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
    except Exception as exc:
        return False, f"no PostgreSQL at {base}: {exc}"
    text = ", ".join(f"{k}={v}" for k, v in settings.items())
    return True, f"PostgreSQL {version}: {text} (both stashpoint and LangGraph commit per write)"


def _redis_available(base: str) -> tuple[bool, str]:
    try:
        import redis

        client = redis.Redis.from_url(base, socket_connect_timeout=3)
        client.ping()
    except Exception as exc:
        return False, f"no Redis at {base}: {exc}"
    try:
        conf: dict[str, Any] = {}
        for name in ("appendonly", "appendfsync", "save"):
            conf.update(client.config_get(name))
        text = ", ".join(f"{k}={(v or '')!s}" for k, v in conf.items())
        if str(conf.get("appendonly")) == "no" and not conf.get("save"):
            text += ": nothing is persisted, a server restart loses everything"
        elif str(conf.get("appendonly")) == "yes" and conf.get("appendfsync") != "always":
            text += ": up to ~1 s of acknowledged writes can be lost on a crash"
    except Exception as exc:
        text = f"CONFIG GET refused ({exc}): durability unknown"
    client.close()
    return True, f"Redis: {text}"


# -- table -----------------------------------------------------------------------------------


def _ms(x: float) -> str:
    return f"{x * 1000:.2f}" if x < 0.01 else f"{x * 1000:.1f}"


def _combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median throughput over rounds; percentiles over every timed checkpoint of all rounds."""
    times = [t for r in rounds for t in r["times"]]
    keys = ("lost", "duplicated", "bad_chains", "same_files", "conflicts", "gave_up")
    return {
        "per_s": median([r["per_s"] for r in rounds]),
        "per_s_rounds": [r["per_s"] for r in rounds],
        "count": sum(r["count"] for r in rounds),
        "p50": _percentile(times, 50),
        "p99": _percentile(times, 99),
        "mean": statistics.fmean(times) if times else float("nan"),
        **{k: sum(r[k] for r in rounds) for k in keys},
        "verify_ok": all(r["verify_ok"] for r in rounds),
        "verified_checkpoints": sum(r["verified_checkpoints"] for r in rounds),
        "problems": [p for r in rounds for p in r["problems"]][:10],
    }


def _scale_row(label: str, c: dict[str, Any], lg: dict[str, Any] | None, bar: bool) -> dict:
    sound = c["verify_ok"] and not any(
        c[k] for k in ("lost", "duplicated", "bad_chains", "same_files")
    )
    retries = f", {c['conflicts']} CAS retries" if c["conflicts"] else ""
    if c["gave_up"]:
        retries += f", session gave up {c['gave_up']}x (re-called)"
    figure = (
        f"{label}: p50 {_ms(c['p50'])} ms, p99 {_ms(c['p99'])} ms, "
        f"lost {c['lost']}{retries}" + (" [bar >= 1,000/s and >= LangGraph]" if bar else "")
    )
    r = row(
        figure,
        c["per_s"],
        "ckpt/s",
        peer=lg["per_s"] if lg else None,
        peer_name="LangGraph puts/s" if lg else "",
        samples=c["per_s_rounds"],
        peer_samples=lg["per_s_rounds"] if lg else (),
        note="" if sound else "; ".join(map(str, c["problems"])) or "chain or count mismatch",
    )
    if bar:
        ok = c["per_s"] >= BAR_PER_S and (lg is None or c["per_s"] >= lg["per_s"])
        r["status"] = "PASS" if ok and sound and lg is not None else "MISS"
        r["bar_min_per_s"] = BAR_PER_S
    elif not sound:
        r["status"] = "MISS"  # none lost or duplicated, one consistent chain
    r.update({k: v for k, v in c.items() if k not in ("problems",)})
    r["p50_ms"], r["p99_ms"] = c["p50"] * 1000, c["p99"] * 1000
    return r


# -- run -------------------------------------------------------------------------------------


def run(cfg: Config) -> dict[str, Any]:
    per = max(10, cfg.steps // 4)
    rounds = 3 if cfg.steps >= 1000 else 1
    tmp = Path(tempfile.mkdtemp(prefix="sp-bench-scale-", dir=cfg.tmp))
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    durability: dict[str, str] = {}
    results: dict[str, dict[str, Any]] = {}
    pg_url, redis_base = pg_base(), _redis_base()
    try:
        pg_ok, durability["postgres"] = _pg_available(pg_url)
        if pg_ok:
            own, lg_rounds = [], []
            for _ in range(rounds):  # alternate, so a slow spell on the VM hits both
                with pg_schema(pg_url, "sp") as url:
                    own.append(_sp_round(url, tmp, per, shared=False))
                try:
                    lg_rounds.append(_lg_round(pg_url, per))
                except ImportError:
                    notes.append(
                        "LangGraph not installed: pip install langgraph-checkpoint-postgres"
                    )
            results["postgres"] = _combine(own)
            if lg_rounds:
                results["langgraph"] = _combine(lg_rounds)
            shared = []
            for _ in range(rounds):
                with pg_schema(pg_url, "sp") as url:
                    shared.append(_sp_round(url, tmp, per, shared=True))
            results["postgres-shared"] = _combine(shared)
        durability["sqlite"] = "SQLite WAL, synchronous=FULL (stashpoint.open's default)"
        for variant in (False, True):
            got = []
            for _ in range(rounds):
                with _sqlite_dir(tmp) as url:
                    got.append(_sp_round(url, tmp, per, shared=variant))
            results["sqlite-shared" if variant else "sqlite"] = _combine(got)
        redis_ok, durability["redis"] = _redis_available(redis_base)
        if redis_ok:
            for variant in (False, True):
                got = []
                for _ in range(rounds):
                    with _redis_prefix(redis_base) as url:
                        got.append(_sp_round(url, tmp, per, shared=variant))
                results["redis-shared" if variant else "redis"] = _combine(got)
    finally:
        if not cfg.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    lg = results.get("langgraph")
    labels = {
        "postgres": ("PostgreSQL, 8 procs x own session", True),
        "postgres-shared": ("PostgreSQL, 8 procs x ONE session", False),
        "sqlite": ("SQLite, 8 procs x own session", False),
        "sqlite-shared": ("SQLite, 8 procs x ONE session", False),
        "redis": ("Redis, 8 procs x own session", False),
        "redis-shared": ("Redis, 8 procs x ONE session", False),
    }
    for key, (label, bar) in labels.items():
        if key in results:
            rows.append(_scale_row(label, results[key], lg, bar))
    if lg is not None:
        rows.append(
            _scale_row("(peer) LangGraph PostgresSaver.put, 8 procs x own thread", lg, None, False)
        )
    for name in ("postgres", "redis"):
        if name not in results:
            notes.append(f"skipped {name}: {durability[name]}")
    notes += [
        f"{PROCS} spawned processes x {per} timed checkpoints each (after 1 untimed warm-up "
        f"each, started together by a barrier); {rounds} round(s) per row, each on a fresh "
        "store; ckpt/s = median over rounds of (timed checkpoints / barrier-to-last-finish "
        "wall time); p50/p99 over every timed checkpoint call of all rounds; ratio = ours / "
        "LangGraph's puts/s (higher is better)",
        "own session: state {messages: growing by one ~500 B message, counter} + a 4-file "
        "workspace (0.5-2 KB files) with 1 file rewritten before each checkpoint; ONE "
        "session: state {counter, worker, note: one ~500 B message}, each process its own "
        "workspace, all on one branch head (compare-and-set, retried by the session)",
        "LangGraph: PostgresSaver.from_conn_string(url) + setup() in its own schema on the "
        "same server; put() with a small fixed state channel_values={counter, messages: [the "
        "one new ~500 B message]} (not the growing list LangGraph would store), no files; "
        "each process its own thread_id",
        "lost = acknowledged checkpoints missing from history(); also checked: no duplicates, "
        "one root and no parent used twice per session, every checkpoint a distinct "
        "workspace tree (the changed file was seen), verify_store(store).ok; a session that "
        "gives up after its CAS retries (ConflictError) is called again, and counted",
        *(f"durability {k}: {v}" for k, v in durability.items()),
        f"machine: {os.cpu_count()} CPUs shared by the {PROCS} workers and the servers",
    ]
    # At equal work: the same LangGraph graph on both savers (bench_scale_graph, alone:
    # --only scale-graph).
    from bench_scale_graph import run as run_graph

    graph = run_graph(cfg)
    rows += graph["rows"]
    notes += [f"same-graph rows: {note}" for note in graph["notes"]]
    return {"name": "scale", "rows": rows, "notes": notes, "durability": durability}


# -- profile ---------------------------------------------------------------------------------


@contextmanager
def lone_worker(
    tag: str, per: int, *, query: str = "", files: bool = True, watch: bool = False
) -> Iterator[tuple[Any, Callable[[int], dict[str, Any]]]]:
    """One worker's session on a fresh schema (``query`` appended to its URL), warmed up by
    one checkpoint, and ``prepare(i)``: rewrite one file, return the state of step ``i``."""
    import stashpoint

    tmp = Path(tempfile.mkdtemp(prefix=f"sp-bench-{tag}-"))
    try:
        with pg_schema(pg_base(), tag) as url:
            ws = tmp / "ws"
            ws.mkdir()
            written = _make_workspace(ws, 0)
            msgs = _messages(per + 1, 0)
            with stashpoint.open(url + query) as store:  # the URL has a query already
                run = store.session("w0", workspace=ws if files else None, watch=watch)
                run.checkpoint({"messages": msgs[:1], "counter": 0})

                def prepare(i: int) -> dict[str, Any]:
                    _touch(written, i, "w0")  # with or without a workspace: the same work
                    return {"messages": msgs[: i + 1], "counter": i}

                yield run, prepare
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def profile(per: int = 200) -> None:
    """One PostgreSQL worker alone, under cProfile, counting the SQL statements it issues."""
    import cProfile
    import pstats

    import psycopg

    from stashpoint.stores.postgres import PostgresStore

    counts: dict[str, int] = {"execute": 0, "executemany": 0, "commit/tx": 0, "libpq": 0}
    orig_libpq = PostgresStore._libpq_call
    orig_exec, orig_many = psycopg.Cursor.execute, psycopg.Cursor.executemany
    orig_tx = psycopg.Connection.transaction
    stmts: dict[str, int] = {}

    def execute(self: Any, query: Any, *a: Any, **k: Any) -> Any:
        counts["execute"] += 1
        key = " ".join(str(query).split())[:90]
        stmts[key] = stmts.get(key, 0) + 1
        return orig_exec(self, query, *a, **k)

    def executemany(self: Any, query: Any, *a: Any, **k: Any) -> Any:
        counts["executemany"] += 1
        key = "MANY " + " ".join(str(query).split())[:85]
        stmts[key] = stmts.get(key, 0) + 1
        return orig_many(self, query, *a, **k)

    def transaction(self: Any, *a: Any, **k: Any) -> Any:
        counts["commit/tx"] += 1
        return orig_tx(self, *a, **k)

    def libpq_call(self: Any, sql: bytes, *a: Any) -> Any:  # the hot path, beside psycopg
        counts["libpq"] += 1
        key = "LIBPQ " + sql.decode()[:84]
        stmts[key] = stmts.get(key, 0) + 1
        return orig_libpq(self, sql, *a)

    try:
        with lone_worker("prof", per) as (run_, prepare):
            psycopg.Cursor.execute = execute  # type: ignore[method-assign]
            psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]
            psycopg.Connection.transaction = transaction  # type: ignore[method-assign]
            PostgresStore._libpq_call = libpq_call  # type: ignore[method-assign]
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            for i in range(1, per + 1):
                st = prepare(i)
                prof.enable()
                run_.checkpoint(st)
                prof.disable()
            took = time.perf_counter() - t0
            psycopg.Cursor.execute, psycopg.Cursor.executemany = orig_exec, orig_many  # type: ignore[method-assign]
            psycopg.Connection.transaction = orig_tx  # type: ignore[method-assign]
        print(f"{per} checkpoints, one worker alone: {took / per * 1000:.2f} ms each (profiled)")
        print(
            f"per checkpoint: {counts['libpq'] / per:.1f} libpq calls, "
            f"{counts['execute'] / per:.1f} execute + "
            f"{counts['executemany'] / per:.1f} executemany calls, "
            f"{counts['commit/tx'] / per:.1f} transactions"
        )
        for text, n in sorted(stmts.items(), key=lambda kv: -kv[1]):
            print(f"  {n / per:5.2f}/ckpt  {text}")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    finally:
        psycopg.Cursor.execute, psycopg.Cursor.executemany = orig_exec, orig_many  # type: ignore[method-assign]
        psycopg.Connection.transaction = orig_tx  # type: ignore[method-assign]
        PostgresStore._libpq_call = orig_libpq  # type: ignore[method-assign]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if "--profile" in sys.argv:
        profile()
    else:
        from run_all import main

        main(["--only", "scale", *sys.argv[1:]])
