"""Measure the web UI on a 10,000-checkpoint session: the first page's size and how long it
takes to render, on the server and in headless Chromium (as the user sees it).

    PYTHONPATH=src python tools/webui_measure.py [--checkpoints 10000] [--runs 5]

The session is built fast: state-only checkpoints (no workspace), durability ``exit``, a fork
every 1,000 checkpoints and a label every 500, so the graph has lanes and badges to draw.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import stashpoint
from stashpoint.webui import create_app

TOKEN = "m" * 24


def build(path: Path, n: int) -> None:
    store = stashpoint.open(path, durability="exit")
    s = store.session("big")
    made = 0
    while made < n:
        cp = s.checkpoint({"n": made}, message=f"step {made}: tool call and reply")
        made += 1
        if made % 500 == 0:
            s.label(cp.id, f"epoch-{made // 500}")
        if made % 1000 == 0 and made < n:
            b = store.session("big", branch=f"try-{made}")
            b.fork(cp.id, f"try-{made}")
            for i in range(3):
                b.checkpoint({"n": made, "b": i}, message=f"branch {made} step {i}")
                made += 1
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoints", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="stashpoint-ui-measure-"))
    t0 = time.perf_counter()
    build(tmp / "store", args.checkpoints)
    print(f"built {args.checkpoints} checkpoints in {time.perf_counter() - t0:.1f} s")

    import uvicorn
    from playwright.sync_api import sync_playwright

    store = stashpoint.open(tmp / "store")
    print(f"history: {len(store.session('big').history())} checkpoints")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    app = create_app(store, token=TOKEN, port=port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    base = f"http://127.0.0.1:{port}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"{base}/?token={TOKEN}")
        served, loaded, sizes = [], [], []
        for _ in range(args.runs + 1):  # the first run warms caches and is left out
            resp = page.goto(f"{base}/s/big")
            assert resp is not None and resp.ok
            sizes.append(len(resp.body()))
            timing = page.evaluate(
                "() => { const t = performance.getEntriesByType('navigation')[0];"
                " return [t.responseEnd - t.requestStart, t.loadEventEnd - t.startTime]; }"
            )
            served.append(timing[0])
            loaded.append(timing[1])
        rows = page.locator("table.graph tbody tr").count()
        filtered = []
        for _ in range(3):
            t = time.perf_counter()
            page.goto(f"{base}/s/big?label=epoch-7")
            filtered.append((time.perf_counter() - t) * 1000)
        found = page.locator("table.graph tbody tr").count()
        t = time.perf_counter()
        page.goto(f"{base}/")
        home = (time.perf_counter() - t) * 1000
        browser.close()
    server.should_exit = True
    thread.join(10)
    store.close()
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"first page: {rows} rows, HTML {sizes[-1] / 1024:.1f} KB")
    print(
        f"request to last byte: median {statistics.median(served[1:]):.0f} ms; "
        f"navigation to load event: median {statistics.median(loaded[1:]):.0f} ms, "
        f"max {max(loaded[1:]):.0f} ms ({args.runs} runs)"
    )
    print(
        f"a filter (label epoch-7, reads the whole history): {found} row(s), "
        f"median {statistics.median(filtered):.0f} ms"
    )
    print(f"sessions page (counts up to 100 checkpoints a session): {home:.0f} ms")


if __name__ == "__main__":
    main()
