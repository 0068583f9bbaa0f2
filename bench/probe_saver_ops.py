"""Instructions of the LangGraph saver's put, get_tuple and list (``valgrind --tool=callgrind``).

Three modes, each a separate process, so that differences cancel out the fixed costs:

- ``imports``: imports, a saver on a fresh SQLite store, the graph compiled;
- ``run``: that plus a 60-step graph run (LangGraph calls ``put`` / ``put_writes``);
- ``all``: that plus 100 ``get_tuple``, 3 ``list`` of the thread and a new saver's first
  ``get_tuple`` (its index built from the verified records).

``run - imports`` is the puts' cost, ``all - run`` the reads'. Compare two trees with::

    PYTHONPATH=src valgrind --tool=callgrind --callgrind-out-file=cg.MODE.out \\
        python bench/probe_saver_ops.py MODE
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stashpoint.aio  # noqa: F401 - imported in every tree compared, so only operations differ
from bench_langgraph import _graph
from stashpoint.integrations.langgraph import StashpointSaver
from workload import conversation


def main(mode: str) -> None:
    steps = 60
    conv = conversation(steps)
    url = f"sqlite:///{tempfile.mkdtemp(prefix='probe-saver')}/s.db"
    thread: Any = {"configurable": {"thread_id": "t"}}
    saver = StashpointSaver(url)
    graph = _graph(conv, saver)
    if mode != "imports":
        config = {**thread, "recursion_limit": steps + 40}
        graph.invoke({"messages": []}, config, durability="sync")
        if mode == "all":
            for _ in range(100):
                saver.get_tuple(thread)
            for _ in range(3):
                sum(1 for _ in saver.list(thread))
            with StashpointSaver(url) as cold:
                cold.get_tuple(thread)
    saver.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "all")
