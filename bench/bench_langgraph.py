"""One LangGraph graph, two checkpointers: stashpoint's saver vs LangGraph's SqliteSaver.

The workload: a ``StateGraph(MessagesState)`` whose one node appends a user
and an assistant message of ~500 B each (``workload.conversation``) and loops, 1,000 steps in
one run with ``durability="sync"`` (each checkpoint is saved before the next step starts), on
thread ``bench``. LangGraph drives both savers the same way: ``put`` per step with the whole
channel values, ``put_writes`` per task.

Equal durability: both databases are SQLite in WAL mode at ``synchronous=FULL`` (one fsync per
commit; stashpoint's default). The floor is one bare WAL commit of a 1 KB row at that setting,
sampled just before each stashpoint ``put``, so both see the disk at the same moment.

    python bench/bench_langgraph.py [--quick] [--steps N]   # prints the table, writes JSON
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import LATEST_VERSION
from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import END, START, MessagesState, StateGraph

import stashpoint
from _common import Config, Floor, median, row
from bench_state import _db_bytes, _windows
from stashpoint.integrations.langgraph import StashpointSaver
from workload import conversation, message_bytes

FLOOR_BAR, FLAT_BAR, LIST_BAR_MS = 1.5, 1.25, 20.0
COLD_REPS = 5  # reads from a new saver: each one sample, so take a median
THREAD = "bench"


def _graph(conv: list[list[dict[str, Any]]], saver: Any) -> Any:
    steps = len(conv)

    def agent(state: MessagesState) -> dict[str, Any]:
        user, assistant = conv[len(state["messages"]) // 2]
        return {
            "messages": [
                HumanMessage(content=user["content"]),
                AIMessage(content=assistant["content"]),
            ]
        }

    def route(state: MessagesState) -> str:
        return END if len(state["messages"]) >= 2 * steps else "agent"

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route)
    return g.compile(checkpointer=saver)


_SYNC = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def _durability(conn: Any) -> str:
    """What a connection really runs at (read back, not assumed): journal mode and sync."""
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    return f"journal_mode={mode} synchronous={_SYNC.get(sync, sync)}"


class Timed:
    """Wraps a saver's ``put`` / ``put_writes`` (the graph calls them through the instance)."""

    def __init__(self, saver: Any, before_put: Callable[[], None] | None = None) -> None:
        self.puts: list[float] = []
        self.writes: list[float] = []
        self.starts: list[float] = []
        put, put_writes = saver.put, saver.put_writes

        @functools.wraps(put)
        def timed_put(*args: Any, **kwargs: Any) -> Any:
            if before_put is not None:
                before_put()
            self.starts.append(time.perf_counter())
            t0 = time.perf_counter()
            out = put(*args, **kwargs)
            self.puts.append(time.perf_counter() - t0)
            return out

        @functools.wraps(put_writes)
        def timed_writes(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = put_writes(*args, **kwargs)
            self.writes.append(time.perf_counter() - t0)
            return out

        saver.put, saver.put_writes = timed_put, timed_writes

    def steps(self, floor: list[float]) -> list[float]:
        """Wall time of each graph step (node, put_writes, put), less the floor samples."""
        gaps = [b - a for a, b in zip(self.starts, self.starts[1:], strict=False)]
        if floor:
            gaps = [g - f for g, f in zip(gaps, floor[1:], strict=False)]
        return gaps


def _run(saver: Any, conv: list[list[dict[str, Any]]], timed: Timed) -> float:
    config: Any = {"configurable": {"thread_id": THREAD}, "recursion_limit": len(conv) + 10}
    t0 = time.perf_counter()
    out = _graph(conv, saver).invoke({"messages": []}, config, durability="sync")
    assert len(out["messages"]) == 2 * len(conv)
    return time.perf_counter() - t0


def _list_ms(saver: Any, reps: int) -> tuple[list[float], int]:
    times, n = [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        n = sum(1 for _ in saver.list({"configurable": {"thread_id": THREAD}}))
        times.append((time.perf_counter() - t0) * 1000)
    return times, n


def _puts(saver: Any, conv: list[Any], floor: Floor | None) -> list[float]:
    """``put`` called directly, as LangGraph's loop calls it after each step of this graph:
    the whole channel values, the versions that moved. Returns each put's seconds."""
    config: Any = {"configurable": {"thread_id": "direct", "checkpoint_ns": ""}}
    msgs: list[Any] = []
    version: Any = None
    times = []
    for step, (user, assistant) in enumerate(conv):
        msgs = [
            *msgs,
            HumanMessage(content=user["content"], id=str(uuid.uuid4())),
            AIMessage(content=assistant["content"], id=str(uuid.uuid4())),
        ]
        seen = version
        version = saver.get_next_version(version, None)
        checkpoint: Any = {
            "v": LATEST_VERSION,
            "id": str(uuid6(clock_seq=step)),
            "ts": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "channel_values": {"messages": msgs, "branch:to:agent": None},
            "channel_versions": {"messages": version, "branch:to:agent": version},
            "versions_seen": {"agent": {"branch:to:agent": seen}} if seen else {},
            "updated_channels": ["branch:to:agent", "messages"],
        }
        meta: Any = {"source": "loop", "step": step, "parents": {}}
        if floor is not None:
            floor.sample()
        t0 = time.perf_counter()
        config = saver.put(
            config, checkpoint, meta, {"messages": version, "branch:to:agent": version}
        )
        times.append(time.perf_counter() - t0)
    return times


def _statements_per_put(tmp: Path, conv: list[Any]) -> dict[str, float]:
    """SQL statements and transactions per ``put`` (a traced run, apart from the timed one:
    the trace callback costs time). Each transaction is one WAL commit: one fsync."""
    saver = StashpointSaver(stashpoint.open(tmp))
    seen: list[str] = []
    db = saver.store.backend._db  # type: ignore[attr-defined]
    db.set_trace_callback(seen.append)
    n = len(_puts(saver, conv, None))
    db.set_trace_callback(None)
    saver.close()
    begins = sum(s.startswith("BEGIN") for s in seen)
    return {"statements": len(seen) / n, "transactions": begins / n}


def bench_stashpoint(tmp: Path, conv: list[Any], reps: int) -> dict[str, Any]:
    floor = Floor(tmp / "floor.db")
    saver = StashpointSaver(stashpoint.open(tmp / "sp-direct"))
    out: dict[str, Any] = {
        "durability": _durability(saver.store.backend._db),  # type: ignore[attr-defined]
        "floor_durability": _durability(floor.conn),
    }
    out["puts"], out["floor"] = _puts(saver, conv, floor), list(floor.times)
    out["sql"] = _statements_per_put(tmp / "sp-traced", conv[:100])
    floor.close()
    saver.close()
    path = tmp / "sp"
    saver = StashpointSaver(stashpoint.open(path))
    timed = Timed(saver)
    out["wall"] = _run(saver, conv, timed)
    out["writes"], out["steps"] = timed.writes, timed.steps([])
    out["list"], out["checkpoints"] = _list_ms(saver, reps + 1)  # the first call, then warm
    session = saver.store.session(saver.session_name(THREAD))
    out["history"] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        assert len(session.history()) >= out["checkpoints"]
        out["history"].append((time.perf_counter() - t0) * 1000)
    saver.store.close()
    out["get"], out["cold_list"] = [], []
    for _ in range(COLD_REPS):  # each a new saver, as in a new process: index built, then read
        cold = StashpointSaver(path)
        t0 = time.perf_counter()
        tup = cold.get_tuple({"configurable": {"thread_id": THREAD}})
        out["get"].append((time.perf_counter() - t0) * 1000)
        assert tup is not None
        assert len(tup.checkpoint["channel_values"]["messages"]) == 2 * len(conv)
        cold.close()
        cold = StashpointSaver(path)
        out["cold_list"] += _list_ms(cold, 1)[0]
        cold.close()
    out["db"] = _db_bytes(path / "store.db")
    return out


def bench_sqlite_saver(tmp: Path, conv: list[Any], reps: int) -> dict[str, Any] | None:
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:
        return None
    direct = tmp / "lg-direct.sqlite"
    conn = sqlite3.connect(direct, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()  # journal_mode=WAL
    conn.execute("PRAGMA synchronous=FULL")
    out: dict[str, Any] = {"durability": _durability(conn), "puts": _puts(saver, conv, None)}
    conn.close()
    db = tmp / "lg.sqlite"
    conn = sqlite3.connect(db, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    conn.execute("PRAGMA synchronous=FULL")
    timed = Timed(saver)
    out["wall"] = _run(saver, conv, timed)
    out["writes"], out["steps"] = timed.writes, timed.steps([])
    out["list"], out["checkpoints"] = _list_ms(saver, reps)
    conn.close()
    out["get"] = []
    for _ in range(COLD_REPS):
        conn = sqlite3.connect(db, check_same_thread=False)
        cold = SqliteSaver(conn)
        t0 = time.perf_counter()
        assert cold.get_tuple({"configurable": {"thread_id": THREAD}}) is not None
        out["get"].append((time.perf_counter() - t0) * 1000)
        conn.close()
    out["db"] = _db_bytes(db)
    return out


def _ms(xs: list[float]) -> list[float]:
    return [x * 1000 for x in xs]


def _rows(sp: dict[str, Any], lg: dict[str, Any] | None, raw: int, steps: int) -> list[Any]:
    rows = [row("floor: bare SQLite WAL commit, 1 KB row", median(_ms(sp["floor"])), "ms")]
    n = len(sp["puts"])
    sp_win, fl_win = _windows(_ms(sp["puts"]), n), _windows(_ms(sp["floor"]), n)
    lg_win = _windows(_ms(lg["puts"]), len(lg["puts"])) if lg else {}
    for s, xs in sp_win.items():
        fig = f"put at step {s:,}"
        rows.append(
            row(
                fig,
                median(xs),
                "ms",
                peer=median(fl_win[s]),
                peer_name="floor",
                bar=FLOOR_BAR,
                samples=xs,
                peer_samples=fl_win[s],
            )
        )
        if s in lg_win:
            rows.append(row(fig, median(xs), "ms", peer=median(lg_win[s]), peer_name="SqliteSaver"))
    first, last = min(sp_win), max(sp_win)
    rel = {s: median(sp_win[s]) / median(fl_win[s]) for s in (first, last)}
    rows.append(
        row(
            f"flatness: put at step {last:,} vs {first}, in floors",
            rel[last],
            "x floor",
            peer=rel[first],
            peer_name=f"@{first}",
            bar=FLAT_BAR,
        )
    )
    sql = sp["sql"]
    rows.append(
        row(
            "SQL statements per put, BEGIN and COMMIT included",
            sql["statements"],
            "",
            note=f"{sql['transactions']:.2f} transactions (WAL commits, one fsync each) per put",
        )
    )
    st_win = _windows(_ms(sp["steps"]), len(sp["steps"]))
    lg_st = _windows(_ms(lg["steps"]), len(lg["steps"])) if lg else {}
    for s in (min(st_win), max(st_win)):
        rows.append(
            row(
                f"graph step at {s:,} (node, put_writes, put)",
                median(st_win[s]),
                "ms",
                peer=median(lg_st[s]) if s in lg_st else None,
                peer_name="SqliteSaver" if s in lg_st else "",
            )
        )
    rows.append(
        row(
            "put_writes, median",
            median(_ms(sp["writes"])),
            "ms",
            peer=median(_ms(lg["writes"])) if lg else None,
            peer_name="SqliteSaver" if lg else "",
        )
    )
    cps = sp["checkpoints"]
    rows.append(
        row(
            f"database after {steps:,} steps (db+wal)",
            sp["db"] / 2**20,
            "MiB",
            peer=lg["db"] / 2**20 if lg else None,
            peer_name="SqliteSaver" if lg else "",
            bar=(2 * raw + 1024 * cps) / 2**20,
            bar_kind="abs",
            note=f"raw messages {raw / 2**20:.2f} MiB, {cps} checkpoints",
        )
    )
    rows.append(
        row(
            f"list {cps:,} checkpoints of the thread (stashpoint session history)",
            median(sp["history"]),
            "ms",
            bar=LIST_BAR_MS,
            bar_kind="abs",
        )
    )
    rows.append(
        row(
            f"list() {cps:,} LangGraph tuples, first call (every message decoded)",
            sp["list"][0],
            "ms",
            peer=median(lg["list"]) if lg else None,
            peer_name="SqliteSaver" if lg else "",
        )
    )
    rows.append(
        row(
            f"list() {cps:,} LangGraph tuples again (decoded messages kept by the saver)",
            median(sp["list"][1:]),
            "ms",
            bar=LIST_BAR_MS,
            bar_kind="abs",
            samples=sp["list"][1:],
        )
    )
    rows.append(
        row(
            "list() from a new saver (index built, every message decoded)",
            median(sp["cold_list"]),
            "ms",
            samples=sp["cold_list"],
        )
    )
    rows.append(
        row(
            "get_tuple(latest) from a new saver",
            median(sp["get"]),
            "ms",
            peer=median(lg["get"]) if lg else None,
            peer_name="SqliteSaver" if lg else "",
            samples=sp["get"],
            peer_samples=lg["get"] if lg else (),
        )
    )
    if lg:
        rows.append(
            row(
                "(peer) SqliteSaver database",
                lg["db"] / 2**20,
                "MiB",
                note=f"{lg['db'] / raw:.0f}x its raw message bytes; ours {sp['db'] / raw:.1f}x",
            )
        )
    return rows


def run(cfg: Config) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="sp-bench-langgraph-", dir=cfg.tmp))
    steps = cfg.lg_steps
    conv = conversation(steps)
    raw = message_bytes([m for pair in conv for m in pair])
    try:
        sp = bench_stashpoint(tmp, conv, cfg.reps)
        lg = bench_sqlite_saver(tmp, conv, 1)
    finally:
        if not cfg.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    notes = [
        f"{steps:,} steps; every database in WAL mode at synchronous=FULL (one fsync per commit),"
        f" read back from each connection: stashpoint {sp['durability']}, floor "
        f"{sp['floor_durability']}" + (f", SqliteSaver {lg['durability']}" if lg else ""),
        "put: put() called directly with what LangGraph's loop passes after each step of this "
        "graph (all channel values, the versions that moved), median over steps s-w..s+w "
        "around step s (w = max(5, s/10)); the floor is sampled just before each stashpoint "
        "put, same window, from a WAL in steady state (past its first reset, as the store's "
        "own is after ~100 puts: a still-growing WAL file makes each fsync ~0.1 ms dearer); "
        "SqliteSaver gets the same calls",
        "graph: one run of the graph (durability='sync'); a step is the time between "
        "consecutive puts: the node, put_writes (one more durable commit per step, for both "
        "savers) and put, with LangGraph's own work (its add_messages reducer is O(n))",
        "sizes: db + -wal + -shm after PRAGMA wal_checkpoint(TRUNCATE); bar: 2x raw message "
        "bytes (compact JSON of role + content) + 1 KiB per checkpoint",
        "list() returns LangGraph tuples with every channel value and pending write decoded "
        "(both savers); stashpoint decodes each message once per saver (kept for later reads, "
        "an LRU of 64 conversation logs), LangGraph's saver once per checkpoint per call. "
        "Decoding a LangChain message costs LangGraph's serializer ~20 us, so a first list() "
        "of 2,000 messages costs >= 40 ms in any saver; the "
        f"{LIST_BAR_MS:g} ms bar applies to listing the checkpoints (session history: every "
        "record and chain link verified) and to list() once the messages are decoded",
        f"get_tuple(latest) and list() from a new saver, median of {COLD_REPS}: ours builds the "
        "thread's index (every record verified) and decodes the whole conversation; "
        "LangGraph's serializer alone takes ~40 ms to decode its 2,000 messages",
    ]
    if lg is None:
        notes.append(
            "LangGraph's SqliteSaver not installed: pip install langgraph-checkpoint-sqlite"
        )
    return {"name": "langgraph", "rows": _rows(sp, lg, raw, steps), "notes": notes}


def main(argv: list[str] | None = None) -> int:
    from run_all import RESULTS, table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="200 steps, fewer repetitions")
    p.add_argument("--steps", type=int, help="graph steps (default 1,000)")
    p.add_argument("--tmp", help="scratch directory (default: the system temp dir)")
    p.add_argument("--keep", action="store_true", help="keep scratch files")
    p.add_argument("--out", default=str(RESULTS), help="where to write langgraph.json")
    args = p.parse_args(argv)
    cfg = Config.quick() if args.quick else Config()
    if args.steps:
        cfg.lg_steps = args.steps
    cfg.tmp, cfg.keep = (Path(args.tmp) if args.tmp else None), args.keep
    t0 = time.perf_counter()
    result = run(cfg)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "langgraph.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return sum(r["status"] == "MISS" for r in result["rows"])


if __name__ == "__main__":
    sys.exit(main())
