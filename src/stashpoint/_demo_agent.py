"""A scripted durable agent (offline, deterministic): the demo's crash/approval scenes run it,
and the kill -9 harness in the tests kills it at random instants.

    python -m stashpoint._demo_agent --store DIR --workspace DIR --outside DIR

It plans four tasks, "thinks" with a fake model (durable steps that take a few milliseconds,
so kills land inside them), writes files in the workspace, deploys (an irreversible tool that
needs approval) and sends a notification (irreversible). Every step body appends ``START`` and
``END`` lines to ``OUTSIDE/executions.log`` and every effect appends to ``OUTSIDE/effects.log``
- outside the workspace, like the real world: that is how the harness counts what ran.

Exit codes: 0 completed (the result as JSON on the last stdout line), 10 waiting for approval,
11 waiting for a decision on an effect whose outcome is unknown.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from .durable import fingerprint
from .errors import ToolRejected
from .opening import open_store
from .session import Session

EXIT_APPROVAL, EXIT_IN_DOUBT = 10, 11
SESSION = "durable-demo"


def _append(path: Path, line: str) -> None:
    """One write() on an O_APPEND file: a SIGKILL leaves the line whole or absent."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def build(run: Session, outside: Path, delay: float) -> Any:
    ws = run.root
    assert ws is not None
    log = outside / "executions.log"

    def body(event: str, step: str, *args: Any) -> None:
        # The call's fingerprint, as the journal records it: the harness matches them up.
        _append(log, f"{event} {fingerprint(step, args, {})} {os.getpid()} {step}{args!r}")

    @run.step(name="think")
    def think(prompt: str) -> str:
        body("START", "think", prompt)
        time.sleep(delay)  # the "model" takes a while: kills land inside steps too
        answer = hashlib.sha256(prompt.encode()).hexdigest()[:8]
        body("END", "think", prompt)
        return f"{prompt} -> {answer}"

    @run.step(name="write_file")
    def write_file(rel: str, text: str) -> int:
        body("START", "write_file", rel, text)
        path = ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        body("END", "write_file", rel, text)
        return len(text)

    @run.step(name="run_tests")
    def run_tests() -> str:
        body("START", "run_tests")
        time.sleep(delay)
        ok = "return a + b" in (ws / "calc.py").read_text()
        body("END", "run_tests")
        return "passed" if ok else "failed"

    def effect(kind: str, what: str) -> str:
        from .durable import current_effect_key  # the idempotency key a real API would get

        _append(outside / "effects.log", f"{kind} {what} {current_effect_key()}")
        time.sleep(delay / 2)  # the outcome is written after this: kills land in between
        return f"{kind} {what}"

    def rollback(result: str, version: str) -> str:
        _append(outside / "effects.log", f"rolled-back {version} compensation")
        return f"rolled back {version}"

    @run.tool(name="deploy", irreversible=True, approval=True, compensate=rollback)
    def deploy(version: str) -> str:
        return effect("deployed", version)

    @run.tool(name="notify", irreversible=True)
    def notify(channel: str, text: str) -> str:
        return effect("notified", f"{channel}:{text}")

    def main() -> dict[str, Any]:
        run.plan(
            [
                ("analyse", "Understand the bug report"),
                ("fix", "Fix calc.add and its test"),
                ("verify", "Run the tests"),
                ("ship", "Deploy and tell the team"),
            ]
        )
        with run.task("analyse"):
            a = think("why does add() subtract?")
            b = think("where is add() tested?")
        with run.task("fix"):
            n = write_file("calc.py", "def add(a, b):\n    return a + b\n")
            n += write_file("test_calc.py", "from calc import add\nassert add(2, 3) == 5\n")
        with run.task("verify"):
            tests = run_tests()
        try:
            with run.task("ship"):
                shipped = deploy("v1.0.1")
                told = notify("#releases", f"v1.0.1 is out; tests {tests}")
        except ToolRejected as exc:  # a human said no: the task is skipped, the run goes on
            shipped, told = f"not deployed: {exc.reason}", "nothing to tell"
        return {"analysis": [a, b], "bytes": n, "tests": tests, "ship": [shipped, told]}

    return main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stashpoint._demo_agent")
    p.add_argument("--store", required=True)
    p.add_argument("--workspace", required=True)
    p.add_argument("--outside", required=True, help="where the 'real world' logs go")
    p.add_argument("--delay", type=float, default=0.02, help="seconds each model call takes")
    args = p.parse_args(argv)
    outside = Path(args.outside)
    outside.mkdir(parents=True, exist_ok=True)
    store = open_store(args.store)
    run = store.session(SESSION, workspace=args.workspace, checkpoint_every="task")
    result = run.run(build(run, outside, args.delay))
    store.close()
    if result.status == "awaiting_approval":
        assert result.pending is not None
        print(f"waiting for approval of {result.pending.tool}", flush=True)
        return EXIT_APPROVAL
    if result.status == "in_doubt":
        print("waiting for a decision on an effect whose outcome is unknown", flush=True)
        return EXIT_IN_DOUBT
    print(json.dumps(result.value), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
