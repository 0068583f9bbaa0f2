"""``stashpoint demo``: a scripted agent (offline, deterministic) and a tour of what it left.

The agent fixes a bug in a tiny project over ten steps - editing files through the API and
through shell commands - checkpointing after each. Step 9 is a bad decision (a destructive
shell command). The demo then rewinds it, forks an alternative into a second directory, and
prints the history tree and a diff.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..opening import open_store
from ..session import Session
from ._app import short
from ._history import draw_graph

__all__ = ["run_demo"]

CALC_BUGGY = """def add(a, b):
    return a - b  # bug: should add


def mul(a, b):
    return a * b
"""
TEST = """from calc import add, mul

assert add(2, 3) == 5, "add is broken"
assert mul(2, 3) == 6
print("all tests pass")
"""

Step = tuple[str, str, Callable[[Path], str]]


def _sh(ws: Path, cmd: str) -> str:
    proc = subprocess.run(
        ["sh", "-c", cmd], cwd=ws, capture_output=True, text=True, check=False, timeout=60
    )
    return (proc.stdout + proc.stderr).strip() or f"(exit {proc.returncode})"


def _write(rel: str, text: str) -> Callable[[Path], str]:
    def act(ws: Path) -> str:
        path = ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return f"wrote {rel} ({len(text)} bytes)"

    return act


def _run(cmd: str) -> Callable[[Path], str]:
    return lambda ws: _sh(ws, cmd)


def _steps(py: str) -> list[Step]:
    return [
        ("plan", "Create the project skeleton", _write("calc.py", CALC_BUGGY)),
        ("tool", "Write the tests", _write("test_calc.py", TEST)),
        ("tool", "Ignore build output", _write(".gitignore", "build/\n__pycache__/\n")),
        ("shell", "Run the tests (they fail)", _run(f"{py} test_calc.py")),
        (
            "shell",
            "Fix add() with sed",
            _run("sed -i 's/return a - b  # bug: should add/return a + b/' calc.py"),
        ),
        ("shell", "Run the tests again", _run(f"{py} test_calc.py")),
        ("tool", "Document the module", _write("README.md", "# calc\n\nadd() and mul().\n")),
        (
            "shell",
            "Build an artifact (ignored)",
            _run("mkdir -p build && cp calc.py build/calc.bak && chmod +x calc.py && echo built"),
        ),
        (
            "shell",
            "Clean up aggressively (a bad idea)",
            _run("rm -f test_calc.py README.md && echo 'def add(a, b): pass' > calc.py && echo ok"),
        ),
        ("tool", "Write the release notes", _write("NOTES.md", "- fixed add()\n")),
    ]


def _executions(outside: Path) -> list[tuple[str, int]]:
    """(event, pid) of every step-body line the demo agent wrote."""
    log = outside / "executions.log"
    if not log.exists():
        return []
    return [(ln.split(" ")[0], int(ln.split(" ")[2])) for ln in log.read_text().splitlines()]


def _durable_scene(base: Path, say: Callable[..., None]) -> dict[str, Any]:
    """Crash and resume, then an approval: the scripted agent of stashpoint._demo_agent in a
    subprocess, killed with SIGKILL mid-run, resumed, paused for approval, approved, finished."""
    import json
    import signal
    import time

    from .._demo_agent import EXIT_APPROVAL, SESSION

    ws = base / "durable-agent"
    ws.mkdir(parents=True, exist_ok=True)
    outside = base / "outside-world"
    cmd = [sys.executable, "-m", "stashpoint._demo_agent", "--store", str(ws / ".stashpoint")]
    cmd += ["--workspace", str(ws), "--outside", str(outside), "--delay", "0.1"]
    say(
        click.style(
            "\nDurable run: a second agent plans 4 tasks and journals every step", bold=True
        )
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        if sum(1 for e, _ in _executions(outside) if e == "END") >= 3:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = sum(1 for e, _ in _executions(outside) if e == "END")
    say(f"  kill -9 after {done_before} finished steps (a crash, mid-task)")
    from ..durable import Journal
    from ..durable.entries import StepEntry

    store = open_store(ws / ".stashpoint")
    journaled = sum(1 for e in Journal(store.session(SESSION)).entries if type(e) is StepEntry)
    store.close()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    executed = sum(1 for e, pid in _executions(outside) if e == "START" and pid != proc.pid)
    say(
        f"  resumed: {journaled} journaled step(s) replayed (bodies not re-run), {executed} "
        f"executed; the run now waits (exit {again.returncode}):"
    )
    store = open_store(ws / ".stashpoint")
    run = store.session(SESSION)
    pending = run.pending()
    tasks = run.tasks()
    say("  tasks: " + ", ".join(f"{t.id} [{t.status}]" for t in tasks))
    if again.returncode == EXIT_APPROVAL and pending is not None:
        from ..durable_surface import args_summary as _args_summary

        say(f"  waiting for approval of {pending.tool}{_args_summary(pending.args)}")
        run.approve(reason="release checklist done", by="demo")
        say("  approved (stashpoint approve); resuming once more:")
    store.close()
    final = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    result = json.loads(final.stdout.strip().splitlines()[-1]) if final.returncode == 0 else None
    effects = (outside / "effects.log").read_text().splitlines() if outside.exists() else []
    say(f"  completed: {result['ship'] if result else final.stderr.strip()[-200:]}")
    say(f"  side-effect ledger: {len(effects)} external effect(s), each exactly once")
    return {
        "workspace": str(ws),
        "session": SESSION,
        "killed_after_steps": done_before,
        "executed_after_resume": executed,
        "result": result,
        "effects": effects,
    }


def run_demo(directory: Path | None, *, json_out: bool = False) -> dict[str, Any]:
    base = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="stashpoint-demo-"))
    ws = base / "agent-workspace"
    ws.mkdir(parents=True, exist_ok=True)
    say = (lambda *a, **k: None) if json_out else click.echo
    store = open_store(ws / ".stashpoint")
    run = store.session("demo", workspace=ws, config={"model": "scripted", "temperature": 0})
    messages: list[dict[str, str]] = [
        {"role": "user", "content": "calc.add() returns wrong results; please fix it."}
    ]
    tasks = {name: "pending" for _k, name, _a in _steps(sys.executable)}
    say(click.style(f"A scripted agent works in {ws}\n", bold=True))
    ids: list[str] = []
    for i, (kind, name, act) in enumerate(_steps(sys.executable), start=1):
        tasks[name] = "in_progress"
        result = act(ws)
        tasks[name] = "completed"
        messages.append({"role": "assistant", "content": f"step {i}: {name}"})
        messages.append({"role": "tool", "content": result[:200]})
        label = "tests-pass" if i == 6 else None
        cp = run.checkpoint(
            {"messages": messages, "tasks": dict(tasks), "last_tool": kind},
            message=name,
            label=label,
            kind="auto",
        )
        ids.append(cp.id)
        say(f"  step {i:>2}  {short(cp.id)}  {name:<36} -> {result.splitlines()[-1][:40]}")
    good, bad = ids[7], ids[8]
    say(
        click.style("\nStep 9 deleted the tests and broke calc.py. Rewinding to step 8:", bold=True)
    )
    undo = run.rewind(good)
    assert undo.files is not None
    say(
        f"  restored {undo.files.written} files, removed {undo.files.deleted}; tests: "
        f"{_sh(ws, f'{sys.executable} test_calc.py')}"
    )
    say(f"  (the rewind itself can be undone: {undo.undo})")
    messages = run.state()["messages"]
    messages.append({"role": "assistant", "content": "step 9 (retry): keep the tests"})
    run.checkpoint(
        {"messages": messages, "tasks": dict(tasks)}, message="Keep the tests, add notes"
    )
    fork_dir = base / "agent-workspace-b"
    say(click.style(f"\nForking 'tests-pass' into {fork_dir} for an A/B run:", bold=True))
    b: Session = run.fork("tests-pass", "try-mul-fix", into=fork_dir)
    (fork_dir / "calc.py").write_text(
        (fork_dir / "calc.py").read_text() + "\n\ndef sub(a, b):\n    return a - b\n"
    )
    b.checkpoint(message="Branch B: add sub()")
    say(f"  branch {b.branch!r} has its own directory; both evolve independently")
    say(click.style("\nHistory (stashpoint log --graph):", bold=True))
    labels = run.labels()
    heads: dict[str, list[str]] = {}
    for branch, head in run.branches().items():
        heads.setdefault(head, []).append(branch)
    if not json_out:
        draw_graph(run.history(), labels, heads, run.head.id if run.head else None)
    d = run.diff(good, bad)
    say(
        click.style(
            f"\nWhat the bad step changed (stashpoint diff {short(good)} {short(bad)} --stat):",
            bold=True,
        )
    )
    for c in d.files:
        say(f"  {c.status:>9}  {c.path.decode()}")
    from ..textdiff import file_diff

    for c in d.files:
        if c.path == b"calc.py":
            say(click.style("\nstashpoint diff, calc.py:", bold=True))
            for line in file_diff(store.blobs, c, "calc.py").splitlines():
                color = "red" if line.startswith("-") else "green" if line.startswith("+") else None
                say("  " + click.style(line, fg=color))
    durable = _durable_scene(base, say)
    say(click.style("\nExplore it yourself:", bold=True))
    say(f"  cd {ws}")
    say("  stashpoint log --graph")
    say(f"  stashpoint diff {short(good)} {short(bad)}")
    say("  stashpoint show HEAD")
    say(f"  stashpoint rewind {short(bad)} --files-only   # see the damage again")
    say("  stashpoint verify")
    say("  stashpoint ui                                 # the same history in your browser")
    say(f"  cd {durable['workspace']} && stashpoint --session {durable['session']} tasks")
    say(f"\nThe store lives in {ws / '.stashpoint'} (SQLite + blobs).")
    out = {
        "workspace": str(ws),
        "fork": str(fork_dir),
        "store": str(ws / ".stashpoint"),
        "checkpoints": ids,
        "durable": durable,
    }
    store.close()
    if json_out:
        import json

        click.echo(json.dumps(out, indent=2))
    return out
