"""One process alone runs ``bench_scale_graph``'s graph: round trips, server and client CPU per
checkpoint, for stashpoint's saver on the PostgreSQL store and LangGraph's ``PostgresSaver``.

The race of 8 processes on 2 shared cores is noisy; CPU per checkpoint of one process alone
is what the race is made of, and steadier. Statements are counted by their text (the first
80 characters), so a change that removes a round trip shows here first.

    python bench/probe_graph_pg.py [TURNS] [sp|lg|files ...]   # default 60 turns, sp and lg

The server must run on this machine (its backends' CPU is read from /proc).
"""

from __future__ import annotations

import resource
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import pg_base, pg_schema
from bench_scale_graph import CKPTS_PER_TURN, _server_cpu, _turns_text, build_graph
from probe_pg_round_trips import counting

WARM = 5


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _statements() -> tuple[Counter[str], Any]:
    """Count statements by text, through psycopg's cursors and stashpoint's libpq path."""
    import psycopg

    from stashpoint.stores.postgres import PostgresStore

    texts: Counter[str] = Counter()
    c_exec, libpq = psycopg.Cursor.execute, PostgresStore._libpq_call

    def cursor_execute(self: Any, query: Any, *a: Any, **k: Any) -> Any:
        q = query.as_string(self) if hasattr(query, "as_string") else str(query)
        texts[" ".join(q.split())[:80]] += 1
        return c_exec(self, query, *a, **k)

    def libpq_call(self: Any, sql: bytes, *a: Any, **k: Any) -> Any:
        texts["LIBPQ " + sql.decode()[:74]] += 1
        return libpq(self, sql, *a, **k)

    psycopg.Cursor.execute = cursor_execute  # type: ignore[method-assign]
    PostgresStore._libpq_call = libpq_call  # type: ignore[method-assign]

    def undo() -> None:
        psycopg.Cursor.execute = c_exec  # type: ignore[method-assign]
        PostgresStore._libpq_call = libpq  # type: ignore[method-assign]

    return texts, undo


def probe(kind: str, turns: int) -> None:
    import tempfile
    from contextlib import ExitStack

    from langchain_core.messages import HumanMessage

    app = f"probe-{uuid.uuid4().hex[:8]}"
    users, answers = _turns_text(WARM + turns, 0)
    with ExitStack() as stack:
        url = stack.enter_context(pg_schema(pg_base(), "pg" + kind))
        tagged = f"{url}&application_name={app}"
        files = None
        if kind == "lg":
            from langgraph.checkpoint.postgres import PostgresSaver

            saver: Any = stack.enter_context(PostgresSaver.from_conn_string(tagged))
            saver.setup()
        else:
            from bench_scale import _make_workspace
            from stashpoint.integrations.langgraph import StashpointSaver

            ws = None
            if kind == "files":
                ws = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                files = _make_workspace(ws, 0)
            saver = StashpointSaver(tagged, workspace=ws)
            stack.callback(saver.close)
        graph = build_graph(saver, answers, files)
        config: Any = {"configurable": {"thread_id": "t"}}

        def turn(t: int) -> None:
            graph.invoke({"messages": [HumanMessage(content=users[t])]}, config, durability="sync")

        for t in range(WARM):
            turn(t)
        ours0, _ = _server_cpu(pg_base(), app)
        texts, undo = _statements()
        try:
            with counting() as counts:
                cpu0 = _cpu()
                for t in range(WARM, WARM + turns):
                    turn(t)
                cpu1 = _cpu()
        finally:
            undo()
        ours1, _ = _server_cpu(pg_base(), app)
    n = turns * CKPTS_PER_TURN
    server = sum(v - ours0.get(p, 0.0) for p, v in ours1.items())
    trips = sum(counts.values()) / n
    print(
        f"{kind}: per checkpoint: client CPU {(cpu1 - cpu0) / n * 1e3:.3f} ms, server CPU "
        f"{server / n * 1e3:.3f} ms, round trips {trips:.2f} "
        f"({', '.join(f'{k} {v / n:.2f}' for k, v in sorted(counts.items()))})"
    )
    for text, c in texts.most_common(12):
        print(f"    {c / turns:5.2f}/turn  {text}")


if __name__ == "__main__":
    args = sys.argv[1:]
    n = int(args.pop(0)) if args and args[0].isdigit() else 60
    for kind in args or ["sp", "lg"]:
        probe(kind, n)
