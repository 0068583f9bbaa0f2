"""Scale-out at equal work: 8 processes run the same LangGraph graph on one PostgreSQL server.

``bench_scale`` races stashpoint sessions (with file snapshots) against bare ``PostgresSaver.put``
calls: not the same work. Here both sides run the SAME compiled graph, only the checkpointer
differs:

- stashpoint: ``StashpointSaver(<PostgreSQL store URL>)`` (state only), and once more with
  ``workspace=`` (each root-namespace checkpoint also snapshots the process's 4-file workspace,
  which the graph's ``plan`` node rewrites one file of at every turn);
- LangGraph: ``PostgresSaver.from_conn_string(url)`` + ``setup()``, its own schema.

The graph: ``StateGraph`` over ``{messages: Annotated[list, add_messages], turn: int}``, nodes
``plan`` (turn + 1) -> ``reply`` (appends one ~500 B ``AIMessage``). One invoke is one user turn:
``graph.invoke({"messages": [HumanMessage(~500 B)]}, config, durability="sync")``, so LangGraph
reads the thread's latest checkpoint, then saves 4 checkpoints (the input, after the input is
taken in by ``__start__``, after ``plan``, after ``reply``) and 3 ``put_writes`` (one a task).
Each of the 8 spawned processes has its own ``thread_id``, runs one untimed warm-up turn, waits
at a barrier that starts all 8 together, then runs ``turns`` turns (``steps / 10``: 100,
``--quick`` 20). The conversation grows by 2 messages a turn, as a
chat's does: LangGraph's saver stores the whole ``messages`` list again at each checkpoint
that changed it, stashpoint's appends only the new messages (that is the saver's design, and
part of the work each does for this graph).

Figures, per round (rounds alternate stashpoint / LangGraph / stashpoint+files, so a slow spell
on the shared VM hits all of them):

- throughput = checkpoints acknowledged by ``put`` in the timed window / (last process's end -
  the barrier);
- server CPU per checkpoint = utime + stime (``/proc/<pid>/stat``) of the PostgreSQL backends
  serving the run's connections (found in ``pg_stat_activity`` by the ``application_name``
  every connection of the round carries), read after the warm-up and after the last turn
  (connections still open), divided by the checkpoints; the server's background processes
  (WAL writer, checkpointer, background writer) are read too and shown apart, since other
  users of the server may be running;
- client CPU per checkpoint = ``getrusage(RUSAGE_SELF)`` of each worker over its timed turns
  (the graph's own work included: it is the same on both sides).

Zero lost: afterwards a new saver of each kind lists each thread: every acknowledged checkpoint
id must be there, no duplicates, one root, every parent among them, the count = 4 per turn, and
the latest state holds all 2 x (turns + 1) messages in order.

    python bench/bench_scale_graph.py [--quick]     # or: python bench/run_all.py --only scale
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Config, median, pg_base, pg_schema, row

PROCS = 8
BARRIER_TIMEOUT = 300.0
JOIN_TIMEOUT = 1800.0
CKPTS_PER_TURN = 4  # the input, after the input is taken in (__start__), after plan, after reply
KINDS = ("stashpoint", "langgraph", "stashpoint+files")


# -- the graph (built in each worker) -------------------------------------------------------


def build_graph(saver: Any, answers: list[str], files: dict[Path, bytes] | None) -> Any:
    """The graph both savers run: plan (turn + 1, and with ``files`` one file rewritten),
    then reply (one AIMessage). ``answers[t]`` is the reply of turn ``t``."""
    from bench_scale import _touch
    from stashpoint.testing.graphs import chat_graph

    def touch(turn: int) -> None:
        if files is not None:
            _touch(files, turn, "graph")

    return chat_graph(saver, lambda turn: answers[turn - 1], on_plan=touch)


def _turns_text(turns: int, seed: int) -> tuple[list[str], list[str]]:
    from workload import conversation

    pairs = conversation(turns, seed=seed)
    return [u["content"] for u, _ in pairs], [a["content"] for _, a in pairs]


def _counting(saver: Any, acked: list[str]) -> None:
    """Record the id of every checkpoint ``put`` acknowledged (LangGraph calls ``saver.put``)."""
    put = saver.put

    def counted(config: Any, checkpoint: Any, *a: Any, **k: Any) -> Any:
        out = put(config, checkpoint, *a, **k)
        acked.append(checkpoint["id"])
        return out

    saver.put = counted


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _worker(
    kind: str, url: str, thread: str, turns: int, seed: int, ws: str, bars: Any, out: Any
) -> None:
    """Run ``turns`` timed turns of the graph on ``thread`` (after one warm-up turn)."""
    try:
        from contextlib import ExitStack

        from langchain_core.messages import HumanMessage

        users, answers = _turns_text(turns + 1, seed)
        with ExitStack() as stack:
            files = None
            if kind == "langgraph":
                from langgraph.checkpoint.postgres import PostgresSaver

                saver = stack.enter_context(PostgresSaver.from_conn_string(url))
            else:
                from stashpoint.integrations.langgraph import StashpointSaver

                if kind == "stashpoint+files":
                    from bench_scale import _make_workspace

                    files = _make_workspace(Path(ws), seed)
                saver = StashpointSaver(url, workspace=ws if files is not None else None)
                stack.callback(saver.close)
            acked: list[str] = []
            _counting(saver, acked)
            graph = build_graph(saver, answers, files)
            config: Any = {"configurable": {"thread_id": thread}}

            def turn(t: int) -> None:
                graph.invoke(
                    {"messages": [HumanMessage(content=users[t])]}, config, durability="sync"
                )

            turn(0)  # warm-up: connections, prepared statements, imports
            warm = len(acked)
            bars[0].wait(BARRIER_TIMEOUT)  # all warm: the parent reads the backends' CPU
            bars[1].wait(BARRIER_TIMEOUT)  # go
            cpu0, start = _cpu_self(), time.monotonic()
            times = []
            for t in range(1, turns + 1):
                t0 = time.perf_counter()
                turn(t)
                times.append(time.perf_counter() - t0)
            end, cpu1 = time.monotonic(), _cpu_self()
            bars[2].wait(BARRIER_TIMEOUT)  # done: the parent reads the backends' CPU again
            bars[3].wait(BARRIER_TIMEOUT)  # then the connections may close
        out.put(
            {
                "seed": seed,
                "thread": thread,
                "acked": acked,
                "timed": len(acked) - warm,
                "times": times,
                "start": start,
                "end": end,
                "client_cpu": cpu1 - cpu0,
            }
        )
    except BaseException:
        for b in bars:
            b.abort()
        out.put({"seed": seed, "error": traceback.format_exc()})


# -- server CPU ------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float | None:
    """utime + stime of a local process in seconds (None: gone, or not on this machine)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # fields 14 and 15 of stat(5)


def _server_cpu(base: str, app: str) -> tuple[dict[int, float], dict[int, float]]:
    """CPU seconds so far of the backends whose connections say ``application_name = app``,
    and of the server's background processes (shared with anyone else using the server)."""
    import psycopg

    with psycopg.connect(base, autocommit=True) as db:
        rows = db.execute(
            "SELECT pid, application_name = %s FROM pg_stat_activity "
            "WHERE application_name = %s OR backend_type <> 'client backend'",
            (app, app),
        ).fetchall()
    ours: dict[int, float] = {}
    aux: dict[int, float] = {}
    for pid, mine in rows:
        cpu = _proc_cpu(int(pid))
        if cpu is not None:
            (ours if mine else aux)[int(pid)] = cpu
    return ours, aux


def _delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU spent between two readings (a process that appeared since counts from 0)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


# -- a round ---------------------------------------------------------------------------------


def _race(kind: str, base: str, url: str, turns: int, tmp: Path) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    bars = [ctx.Barrier(PROCS + 1) for _ in range(4)]
    out = ctx.Queue()
    app = f"spbg_{uuid.uuid4().hex[:10]}"
    tagged = f"{url}&application_name={app}"
    wss = [tmp / f"ws-{app}-{w}" for w in range(PROCS)]
    for ws in wss:
        ws.mkdir(parents=True)
    procs = [
        ctx.Process(target=_worker, args=(kind, tagged, f"t{w}", turns, w, str(wss[w]), bars, out))
        for w in range(PROCS)
    ]
    for p in procs:
        p.start()
    results: list[dict[str, Any]] = []
    server: dict[str, float] = {}
    try:
        bars[0].wait(BARRIER_TIMEOUT)
        ours0, aux0 = _server_cpu(base, app)
        bars[1].wait(BARRIER_TIMEOUT)
        bars[2].wait(JOIN_TIMEOUT)
        ours1, aux1 = _server_cpu(base, app)
        bars[3].wait(BARRIER_TIMEOUT)
        server = {
            "backends": _delta(ours0, ours1),
            "background": _delta(aux0, aux1),
            "connections": float(len(ours1)),
        }
    except Exception:
        pass  # a worker failed and broke the barriers: its report says why
    finally:
        deadline = time.monotonic() + JOIN_TIMEOUT
        for _ in procs:
            try:
                results.append(out.get(timeout=max(1.0, deadline - time.monotonic())))
            except Exception:
                break
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join()
        for ws in wss:
            shutil.rmtree(ws, ignore_errors=True)
    errors = [r["error"] for r in results if "error" in r]
    if errors or len(results) < PROCS or not server:
        raise RuntimeError(f"a {kind} worker failed:\n" + (errors[0] if errors else "no report"))
    results.sort(key=lambda r: r["seed"])
    count = sum(r["timed"] for r in results)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {
        "count": count,
        "turns": sum(len(r["times"]) for r in results),
        "wall": wall,
        "per_s": count / wall,
        "server_ms": server["backends"] / count * 1000,
        "background_ms": server["background"] / count * 1000,
        "client_ms": sum(r["client_cpu"] for r in results) / count * 1000,
        "connections": int(server["connections"]),
        "turn_p50_ms": median([t for r in results for t in r["times"]]) * 1000,
        **_check(kind, url, turns, results),
    }


def _check(kind: str, url: str, turns: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Every thread, read back by a new saver: all acknowledged checkpoints, in one tree."""
    from contextlib import ExitStack

    lost = dup = bad = 0
    problems: list[str] = []
    with ExitStack() as stack:
        if kind == "langgraph":
            from langgraph.checkpoint.postgres import PostgresSaver

            saver: Any = stack.enter_context(PostgresSaver.from_conn_string(url))
        else:
            from stashpoint.integrations.langgraph import StashpointSaver

            saver = StashpointSaver(url)
            stack.callback(saver.close)
        for r in results:
            config = {"configurable": {"thread_id": r["thread"]}}
            tuples = list(saver.list(config))
            ids = [t.config["configurable"]["checkpoint_id"] for t in tuples]
            found = set(ids)
            lost += len(set(r["acked"]) - found)
            dup += len(ids) - len(found)
            parents = [
                t.parent_config["configurable"]["checkpoint_id"] for t in tuples if t.parent_config
            ]
            want = CKPTS_PER_TURN * (turns + 1)
            latest = saver.get_tuple(config)
            msgs = latest.checkpoint["channel_values"].get("messages", []) if latest else []
            users, answers = _turns_text(turns + 1, r["seed"])
            texts = [m.content for m in msgs]
            expect = [x for pair in zip(users, answers, strict=True) for x in pair]
            if len(ids) - len(parents) != 1 or not set(parents) <= found or len(ids) != want:
                bad += 1
                problems.append(f"{r['thread']}: {len(ids)} checkpoints, {want} expected")
            if texts != expect:
                bad += 1
                problems.append(f"{r['thread']}: {len(texts)} messages, {len(expect)} expected")
    return {"lost": lost, "duplicated": dup, "bad_threads": bad, "problems": problems}


def _round(kind: str, base: str, turns: int, tmp: Path) -> dict[str, Any]:
    with pg_schema(base, "g" + kind[:2]) as url:
        if kind == "langgraph":
            from langgraph.checkpoint.postgres import PostgresSaver

            with PostgresSaver.from_conn_string(url) as saver:
                saver.setup()
        else:
            import stashpoint

            stashpoint.open(url).close()  # the schema, once, before the race
        return _race(kind, base, url, turns, tmp)


# -- table -----------------------------------------------------------------------------------


def _combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("per_s", "server_ms", "background_ms", "client_ms", "turn_p50_ms")
    out: dict[str, Any] = {k: median([r[k] for r in rounds]) for k in keys}
    out.update({f"{k}_rounds": [r[k] for r in rounds] for k in keys})
    for k in ("count", "lost", "duplicated", "bad_threads"):
        out[k] = sum(r[k] for r in rounds)
    out["connections"] = max(r["connections"] for r in rounds)
    out["problems"] = [p for r in rounds for p in r["problems"]][:10]
    return out


def _sound(c: dict[str, Any]) -> bool:
    return not (c["lost"] or c["duplicated"] or c["bad_threads"])


def _rows(res: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    lg = res.get("langgraph")
    rows: list[dict[str, Any]] = []
    labels = {
        "stashpoint": "StashpointSaver on the PostgreSQL store, state only",
        "stashpoint+files": "StashpointSaver on the PostgreSQL store + workspace snapshots",
    }
    for kind, label in labels.items():
        c = res.get(kind)
        if c is None:
            continue
        note = "" if _sound(c) else "; ".join(c["problems"]) or "lost or duplicated"
        bar = kind == "stashpoint"
        r = row(
            f"{label}: 8 procs x same graph, lost {c['lost']}"
            + (" [bar >= LangGraph]" if bar else ""),
            c["per_s"],
            "ckpt/s",
            peer=lg["per_s"] if lg else None,
            peer_name="LangGraph PostgresSaver ckpt/s" if lg else "",
            samples=c["per_s_rounds"],
            peer_samples=lg["per_s_rounds"] if lg else (),
            note=note,
        )
        if bar:
            r["status"] = "PASS" if lg and _sound(c) and c["per_s"] >= lg["per_s"] else "MISS"
        elif not _sound(c):
            r["status"] = "MISS"
        rows.append(r)
        for what, key, unit in (
            ("server CPU per checkpoint (its backends)", "server_ms", "ms"),
            ("client CPU per checkpoint (graph included)", "client_ms", "ms"),
        ):
            sub = row(
                f"  {what}" + (" [bar <= LangGraph]" if bar and key == "server_ms" else ""),
                c[key],
                unit,
                peer=lg[key] if lg else None,
                peer_name=f"LangGraph {unit}" if lg else "",
                bar=1.0 if bar and key == "server_ms" and lg else None,
                samples=c[f"{key}_rounds"],
                peer_samples=lg[f"{key}_rounds"] if lg else (),
            )
            rows.append(sub)
    if lg is not None:
        rows.append(
            row(
                f"(peer) LangGraph PostgresSaver: 8 procs x same graph, lost {lg['lost']}",
                lg["per_s"],
                "ckpt/s",
                samples=lg["per_s_rounds"],
                note="" if _sound(lg) else "; ".join(lg["problems"]),
            )
        )
    for kind, c in res.items():
        rows.append(
            row(
                f"  ({kind}) server background processes' CPU per checkpoint (shared)",
                c["background_ms"],
                "ms",
                samples=c["background_ms_rounds"],
            )
        )
    return rows


def run(cfg: Config) -> dict[str, Any]:
    turns = max(5, cfg.steps // 10)
    rounds = 3 if cfg.steps >= 1000 else 1
    base = pg_base()
    notes: list[str] = []
    try:
        import psycopg

        psycopg.connect(base, connect_timeout=3).close()
        import langgraph.checkpoint.postgres  # noqa: F401
    except Exception as exc:
        return {"name": "scale-graph", "rows": [], "notes": [f"skipped: {exc}"]}
    tmp = Path(tempfile.mkdtemp(prefix="sp-bench-graph-", dir=cfg.tmp))
    got: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    try:
        for _ in range(rounds):
            for kind in KINDS:
                got[kind].append(_round(kind, base, turns, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res = {k: _combine(v) for k, v in got.items() if v}
    rows = _rows(res)
    notes += [
        f"{PROCS} spawned processes, each its own thread_id, x {turns} timed turns (after 1 "
        f"untimed warm-up turn; a barrier starts all together); a turn = graph.invoke(one "
        f"HumanMessage, durability='sync') = {CKPTS_PER_TURN} checkpoints (input, __start__, "
        "plan, reply) + 3 put_writes + 1 read of the latest checkpoint; the same "
        "StateGraph(messages: add_messages, turn) with nodes plan -> reply on both sides; "
        "messages ~500 B, "
        f"2 per turn ({2 * (turns + 1)} at the end); {rounds} round(s), each on a fresh "
        "schema, the kinds alternating; figures are medians over rounds",
        "ckpt/s = checkpoints acknowledged by put in the timed window / (last process's end - "
        "the barrier); ratio = stashpoint / LangGraph (higher is better for ckpt/s, lower for "
        "CPU)",
        "server CPU = utime+stime from /proc/<pid>/stat of the PostgreSQL backends of the "
        "round's connections (by application_name), read after the warm-up and after the last "
        "turn, / checkpoints; 'background' = WAL writer, checkpointer, background writer over "
        "the same window (shared with anything else on the server); client CPU = "
        "getrusage(RUSAGE_SELF) of each worker over its timed turns / checkpoints",
        "LangGraph: PostgresSaver.from_conn_string(url) + setup(), one connection a process; "
        "stashpoint: StashpointSaver(<store URL>) (a connection pool, up to "
        f"{res.get('stashpoint', {}).get('connections', '?')} backends seen for 8 processes); "
        "the +files row: workspace= a 4-file directory (0.5-2 KB files), one file rewritten by "
        "the plan node each turn, snapshotted with every root-namespace checkpoint",
        "lost = acknowledged checkpoint ids missing from a new saver's list(); also checked: "
        "no duplicates, one root, every parent present, 4 checkpoints a turn, and the latest "
        "state's messages are exactly the conversation",
    ]
    return {"name": "scale-graph", "rows": rows, "notes": notes}


if __name__ == "__main__":
    from run_all import main

    main(["--only", "scale-graph", *sys.argv[1:]])
