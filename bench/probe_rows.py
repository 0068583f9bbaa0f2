"""Deterministic drivers of single benchmark rows, to compare two source trees by instructions.

Wall time on a shared machine swings by tens of percent; the instructions a process executes
do not. Each mode runs one row's own workload (fewer repetitions) once; run it twice per tree
under ``valgrind --tool=callgrind``, once with ``N`` operations and once with fewer (or none),
and the difference divided by the operations left is the row's cost alone, start-up and
warm-up subtracted::

    PYTHONPATH=SRC valgrind --tool=callgrind --callgrind-out-file=cg.OUT \\
        python bench/probe_rows.py MODE N [ARGS]

Modes (N is the number of operations; run with N=0 for the subtracted run):

- ``sync`` / ``async``: a new session's program of N no-op durable steps (bench_durable);
- ``replay``: N recorded steps, then (``replay N 1``) the same program on a fresh Session;
- ``mirror`` / ``plain``: state checkpoints 1..N of the growing conversation, SQLite
  mirrored to SQLite or alone (bench_mirror); compare N=140 with N=100;
- ``lgput``: N direct LangGraph ``put`` calls (bench_langgraph's loop);
- ``lgwrites``: N ``put_writes`` of one step's two messages;
- ``graph``: an N-step LangGraph graph run (node, put_writes, put; compare 30 with 10);
- ``bundle DIR STAGE``: ``prep`` builds a 1,000-file, 30-checkpoint store in DIR once;
  ``none`` opens and closes it, ``export`` exports it, ``open2`` also opens and closes a
  second store, ``import`` imports the exported bundle into that store.

Compare callgrind outputs function by function with ``callgrind_annotate`` (C functions:
CPython's own, SQLite's, libcrypto's; Python functions appear as the interpreter's frames).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stashpoint
from workload import conversation


def _durable(mode: str, n: int, replay: bool) -> None:
    from bench_durable import _program

    tmp = Path(tempfile.mkdtemp(prefix="sp-probe-rows-"))
    store = stashpoint.open(tmp / "sp")
    loop = asyncio.new_event_loop()
    for kind in ("sync", "async"):  # the bench's warm-up: first statements, lazy imports
        run = store.session(f"w-{kind}")
        main, amain = _program(run, 20)
        run.run(main) if kind == "sync" else loop.run_until_complete(run.arun(amain))
    run = store.session(f"x-{n}")
    main, amain = _program(run, n)
    res = loop.run_until_complete(run.arun(amain)) if mode == "async" else run.run(main)
    assert res.executed == n, res
    if replay:
        run = store.session(f"x-{n}")
        main, _ = _program(run, n)
        res = run.run(main)
        assert res.replayed == n, res
    loop.close()
    store.close()
    shutil.rmtree(tmp)


def _checkpoints(mirrored: bool, n: int, warm: int = 140) -> None:
    from stashpoint.redact import make_redactor

    conv = conversation(max(n, warm))
    scrub = make_redactor(None, None)
    for pair in conv:  # rules compile on first match: not inside the steps
        for m in pair:
            scrub(m)
    tmp = Path(tempfile.mkdtemp(prefix="sp-probe-rows-"))
    mirror = str(tmp / "m1") if mirrored else None
    with stashpoint.open(str(tmp / "p1"), mirror=mirror) as store:
        run = store.session("bench")
        run.checkpoint({"messages": [], "step": -1})
        msgs: list[Any] = []
        for i, pair in enumerate(conv[:n]):
            msgs = [*msgs, *pair]
            run.checkpoint({"messages": msgs, "step": i})
    shutil.rmtree(tmp)


def _langgraph(mode: str, n: int) -> None:
    from langchain_core.messages import AIMessage, HumanMessage

    import bench_langgraph

    tmp = Path(tempfile.mkdtemp(prefix="sp-probe-rows-"))
    saver = bench_langgraph.StashpointSaver(stashpoint.open(tmp / "l"))
    if mode == "lgput":
        bench_langgraph._puts(saver, conversation(max(n, 1))[:n], None)
    elif mode == "lgwrites":
        conv = conversation(11)
        bench_langgraph._puts(saver, conv[:10], None)
        thread: Any = {"configurable": {"thread_id": "direct", "checkpoint_ns": ""}}
        tup = saver.get_tuple(thread)
        assert tup is not None
        user, assistant = conv[10]
        for i in range(n + 1):  # the first one outside: first statements
            msgs = [
                HumanMessage(content=user["content"], id=str(uuid.UUID(int=2 * i))),
                AIMessage(content=assistant["content"], id=str(uuid.UUID(int=2 * i + 1))),
            ]
            writes = [("messages", msgs), ("branch:to:agent", None)]
            saver.put_writes(tup.config, writes, str(uuid.UUID(int=10**6 + i)))
    else:
        config: Any = {"configurable": {"thread_id": "w"}, "recursion_limit": 50}
        bench_langgraph._graph(conversation(3), saver).invoke(
            {"messages": []}, config, durability="sync"
        )
        if n:
            config = {"configurable": {"thread_id": "t"}, "recursion_limit": n + 40}
            bench_langgraph._graph(conversation(n), saver).invoke(
                {"messages": []}, config, durability="sync"
            )
    saver.close()
    shutil.rmtree(tmp)


def _bundle(tmp: Path, stage: str) -> None:
    from stashpoint.bundle import export_bundle, import_bundle, read_bundle
    from workload import make_workspace, modify_files

    if stage == "prep":
        ws = make_workspace(tmp / "ws", 1000)
        with stashpoint.open(tmp / "src") as store:
            session = store.session("bench", workspace=ws.root)
            msgs: list[Any] = []
            for i, pair in enumerate(conversation(30)):
                if i:
                    modify_files(ws, 3, seed=10_000 + i)
                msgs = [*msgs, *pair]
                session.checkpoint({"messages": msgs}, message=f"step {i}")
            export_bundle(store, tmp / "b.spb", session="bench")
        return
    with stashpoint.open(tmp / "src") as store:
        if stage == "export":
            export_bundle(store, tmp / "again.spb", session="bench")
            (tmp / "again.spb").unlink()
        if stage in ("open2", "import"):
            with stashpoint.open(tmp / "imp") as dst:
                if stage == "import":
                    with read_bundle(tmp / "b.spb", hasher=dst.hasher) as bundle:
                        import_bundle(dst, bundle)
            shutil.rmtree(tmp / "imp")


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "bundle":
        _bundle(Path(argv[1]), argv[2])
        return
    n = int(argv[1])
    if mode in ("sync", "async", "replay"):
        _durable(mode, n, replay=mode == "replay" and len(argv) > 2)
    elif mode in ("mirror", "plain"):
        _checkpoints(mode == "mirror", n)
    elif mode in ("lgput", "lgwrites", "graph"):
        _langgraph(mode, n)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
