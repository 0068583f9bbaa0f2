"""``stashpoint hooks``: install into real agent settings files, run the hook command exactly as
the agent would (the installed command line, through ``sh -c``, with the agent's documented
JSON payload on stdin or as an argument), change the workspace with shell commands between hook
calls, then ``stashpoint rewind`` and compare whole trees.

The point is the gap in the agents' own undo: files changed by ``rm``, ``mv`` and ``sed -i``
come back too.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stashpoint

from .conftest import STASHPOINT, Result, snapshot_tree, stop_watch_daemon

Sp = Callable[..., Result]


class _WithDaemon:
    """``sp`` that also starts the project's watch daemon after each ``hooks install`` that
    left a store in the project: every hook call after it is served by the daemon."""

    def __init__(self, sp: Sp) -> None:
        self.sp, self.pids = sp, []

    def __call__(self, *args: str, cwd: Path | None = None, **kw: Any) -> Result:
        res = self.sp(*args, cwd=cwd, **kw)
        installed = args[:2] == ("hooks", "install") and res.code == 0
        if installed and cwd is not None and (Path(cwd) / ".stashpoint").is_dir():
            started = json.loads(self.sp("watch", "start", "--json", cwd=cwd).out)
            self.pids.append(int(started["pid"]))
        return res

    def served(self, cwd: Path) -> int:
        return int(json.loads(self.sp("watch", "status", "--json", cwd=cwd).out)["requests"])


@pytest.fixture(params=["no daemon", "daemon"])
def sp(request: pytest.FixtureRequest, sp: Sp, tmp_path: Path) -> Iterator[Any]:
    """Every test runs as it is, then with the project's watch daemon running."""
    if request.param == "no daemon":
        yield sp
        return
    wrapped = _WithDaemon(sp)
    yield wrapped
    for pid in wrapped.pids:
        stop_watch_daemon(pid, tmp_path)


def write(path: Path, text: str, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)


def sh(cwd: Path, command: str) -> None:
    """A change made by the agent's shell tool."""
    subprocess.run(["sh", "-c", command], cwd=cwd, check=True)


def project(root: Path) -> Path:
    write(root / "README.md", "# demo\n\nhello world\n")
    write(root / "src/app.py", "def main():\n    return 1\n")
    write(root / "notes.txt", "remember the milk\n")
    write(root / "data/config.ini", "[core]\nname = demo\n")
    write(root / "bin/run.sh", "#!/bin/sh\necho run\n", mode=0o755)
    return root


def hook_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STASHPOINT_", "XDG_"))}
    env.pop("CLAUDE_PROJECT_DIR", None)
    env["HOME"] = str(home)
    # the suite's rollback-witness directory, as the daemon the test may start has it
    env["STASHPOINT_WITNESS_DIR"] = os.environ["STASHPOINT_WITNESS_DIR"]
    env.update(extra)
    return env


def installed_command(settings: Path, event: str) -> str:
    data = json.loads(settings.read_text())
    commands = [
        h["command"]
        for group in data["hooks"][event]
        for h in group["hooks"]
        if "hooks run" in h["command"]
    ]
    assert len(commands) == 1, commands
    return str(commands[0])


def run_hook(
    command: str,
    cwd: Path,
    env: dict[str, str],
    payload: dict[str, Any] | str | None = None,
    args: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Run the installed hook command the way the agent does: a shell command line, the
    payload on stdin; it must print nothing and exit 0."""
    line = " ".join([command, *map(shlex.quote, args)])
    stdin = payload if isinstance(payload, str) or payload is None else json.dumps(payload)
    proc = subprocess.run(
        ["sh", "-c", line],
        cwd=cwd,
        env=env,
        input=stdin or "",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "", proc.stdout  # Claude Code feeds some hooks' stdout to the model
    return proc


def log_json(sp: Sp, cwd: Path, session: str) -> list[dict[str, Any]]:
    return list(json.loads(sp("--session", session, "log", "--json", cwd=cwd).out))


def test_claude_code_rewind_restores_what_shell_commands_changed(sp: Sp, tmp_path: Path) -> None:
    ws = project(tmp_path / "proj")
    out = sp("hooks", "install", "claude-code", cwd=ws).out
    assert "installed" in out and "claude-<session id>" in out
    settings = ws / ".claude" / "settings.local.json"
    command = installed_command(settings, "PostToolUse")
    env = hook_env(tmp_path, CLAUDE_PROJECT_DIR=str(ws))
    base = {
        "session_id": "5f0c-e2e",
        "transcript_path": str(tmp_path / ".claude/projects/proj/5f0c-e2e.jsonl"),
        "cwd": str(ws / "src"),  # Claude may have cd'ed: the project dir wins
        "permission_mode": "default",
    }

    def hook(event: str, **fields: Any) -> None:
        run_hook(command, ws, env, {**base, "hook_event_name": event, **fields})

    hook("SessionStart", source="startup")
    hook("UserPromptSubmit", prompt="tidy up the project")
    start = snapshot_tree(ws)

    # Claude's Edit tool, then a Bash tool call that changes files behind the editor's back
    write(ws / "src/app.py", "def main():\n    return 2\n")
    hook("PostToolUse", tool_name="Edit", tool_input={"file_path": str(ws / "src/app.py")})
    after_edit = snapshot_tree(ws)
    bash = (
        "rm notes.txt && mv data/config.ini data/config.old && sed -i 's/hello/goodbye/' README.md"
    )
    sh(ws, bash)
    hook("PostToolUse", tool_name="Bash", tool_input={"command": bash}, tool_response={})
    after_bash = snapshot_tree(ws)
    sh(ws, "rm -rf src bin && echo generated > out.txt")
    hook("PostToolUse", tool_name="Bash", tool_input={"command": "rm -rf src bin"})
    hook("Stop", stop_hook_active=False)
    final = snapshot_tree(ws)

    cps = log_json(sp, ws, "claude-5f0c-e2e")
    messages = [c["message"] for c in reversed(cps)]
    # The prompt and Stop found nothing new: no duplicate checkpoints
    assert messages == [
        "claude SessionStart: startup",
        "claude PostToolUse Edit: src/app.py",
        "claude PostToolUse Bash: " + bash,
        "claude PostToolUse Bash: rm -rf src bin",
    ]
    assert all(c["kind"] == "auto" for c in cps)
    edit_id, start_id = cps[2]["id"], cps[3]["id"]

    # back to before the shell command: rm, mv and sed -i are undone
    sp("--session", "claude-5f0c-e2e", "rewind", edit_id, cwd=ws)
    assert snapshot_tree(ws) == after_edit
    assert (ws / "notes.txt").read_text() == "remember the milk\n"
    assert "hello world" in (ws / "README.md").read_text()
    sp("--session", "claude-5f0c-e2e", "rewind", start_id, cwd=ws)
    assert snapshot_tree(ws) == start
    assert os.access(ws / "bin/run.sh", os.X_OK)
    # and forward again (rewind is undoable)
    sp("--session", "claude-5f0c-e2e", "rewind", cps[0]["id"], cwd=ws)
    assert snapshot_tree(ws) == final
    assert after_bash != final

    status = json.loads(sp("hooks", "status", "--json", cwd=ws).out)
    assert status["installed"] == [
        {"agent": "claude-code", "scope": "local", "path": str(settings)}
    ]
    assert [s["session"] for s in status["sessions"]] == ["claude-5f0c-e2e"]
    log = (ws / ".stashpoint" / "hooks.log").read_text()
    assert log.count("claude-code PostToolUse session=claude-5f0c-e2e created") == 3
    assert "FAILED" not in log
    if isinstance(sp, _WithDaemon):
        assert sp.served(ws) >= 6  # the hook calls went through the daemon


def test_claude_code_failed_tool_calls_and_session_end_are_snapshotted(
    sp: Sp, tmp_path: Path
) -> None:
    """A Bash command that changes files and then fails reaches Claude Code's hooks as
    PostToolUseFailure; changes after the last Stop (an interrupted turn, then /exit) only as
    SessionEnd. Both must give a checkpoint to rewind to."""
    ws = project(tmp_path / "proj")
    sp("hooks", "install", "claude-code", cwd=ws)
    settings = ws / ".claude" / "settings.local.json"
    data = json.loads(settings.read_text())
    assert set(data["hooks"]) == {
        "SessionStart",
        "UserPromptSubmit",
        "PostToolUse",
        "PostToolUseFailure",
        "Stop",
        "SessionEnd",
    }
    assert (
        data["hooks"]["PostToolUseFailure"][0]["matcher"]
        == "Bash|Edit|MultiEdit|Write|NotebookEdit"
    )
    assert "matcher" not in data["hooks"]["SessionEnd"][0]
    env = hook_env(tmp_path, CLAUDE_PROJECT_DIR=str(ws))
    base = {"session_id": "f41l", "cwd": str(ws), "transcript_path": "/dev/null"}

    def hook(event: str, **fields: Any) -> None:
        run_hook(
            installed_command(settings, event),
            ws,
            env,
            {**base, "hook_event_name": event, **fields},
        )

    hook("SessionStart", source="startup")
    before = snapshot_tree(ws)
    failing = "sed -i 's/milk/bread/' notes.txt && rm README.md && false"
    proc = subprocess.run(["sh", "-c", failing], cwd=ws)
    assert proc.returncode == 1
    hook(
        "PostToolUseFailure",
        tool_name="Bash",
        tool_input={"command": failing},
        error="Command exited with non-zero status code 1",
        is_interrupt=False,
    )
    after_failure = snapshot_tree(ws)
    write(ws / "src/app.py", "def main():\n    return 42\n")  # the user, after the last turn
    hook("SessionEnd", reason="prompt_input_exit")
    cps = log_json(sp, ws, "claude-f41l")
    assert [c["message"] for c in reversed(cps)] == [
        "claude SessionStart: startup",
        "claude PostToolUseFailure Bash: " + failing,
        "claude SessionEnd: prompt_input_exit",
    ]
    sp("--session", "claude-f41l", "rewind", cps[1]["id"], cwd=ws)
    assert snapshot_tree(ws) == after_failure
    sp("--session", "claude-f41l", "rewind", cps[2]["id"], cwd=ws)
    assert snapshot_tree(ws) == before  # the failed command's rm and sed -i are undone


def test_codex_hooks_and_notify(sp: Sp, tmp_path: Path) -> None:
    ws = project(tmp_path / "repo")
    sp("hooks", "install", "codex", cwd=ws)
    hooks_file = ws / ".codex" / "hooks.json"
    data = json.loads(hooks_file.read_text())
    assert set(data["hooks"]) == {"SessionStart", "UserPromptSubmit", "PostToolUse", "Stop"}
    assert data["hooks"]["PostToolUse"][0]["matcher"] == "Bash|apply_patch|Edit|Write"
    command = installed_command(hooks_file, "PostToolUse")
    env = hook_env(tmp_path)

    # Codex hooks: JSON on stdin, the same common fields as Claude Code plus turn_id
    common = {"session_id": "th-1", "cwd": str(ws), "transcript_path": None, "model": "gpt-5"}
    run_hook(command, ws, env, {**common, "hook_event_name": "SessionStart", "source": "startup"})
    patch = (
        "*** Begin Patch\n*** Update File: src/app.py\n@@\n-    return 1\n+    return 3\n"
        "*** End Patch\n"
    )
    write(ws / "src/app.py", "def main():\n    return 3\n")
    payload = {
        **common,
        "hook_event_name": "PostToolUse",
        "turn_id": "turn-1",
        "tool_name": "apply_patch",
        "tool_input": {"command": patch},
        "tool_use_id": "call-1",
    }
    run_hook(command, ws, env, payload)
    before_mv = snapshot_tree(ws)

    # the legacy `notify` program: JSON as the last argument, stdin left open by Codex
    sh(ws, "mv notes.txt todo.txt && sed -i 's/demo/renamed/' data/config.ini")
    notify = {
        "type": "agent-turn-complete",
        "thread-id": "th-1",
        "turn-id": "turn-2",
        "cwd": str(ws),
        "input-messages": ["rename the notes"],
        "last-assistant-message": "Renamed.",
    }
    line = command + " " + shlex.quote(json.dumps(notify))
    with subprocess.Popen(
        ["sh", "-c", line], cwd=ws, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as proc:  # stdin left open: the hook must not wait for it
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None and proc.stdout.read() == b""

    cps = log_json(sp, ws, "codex-th-1")
    assert [c["message"] for c in cps] == [
        "codex agent-turn-complete: rename the notes",
        "codex PostToolUse apply_patch: src/app.py",
        "codex SessionStart: startup",
    ]
    sp("--session", "codex-th-1", "rewind", "HEAD~1", cwd=ws)
    assert snapshot_tree(ws) == before_mv
    assert not (ws / "todo.txt").exists()
    if isinstance(sp, _WithDaemon):
        assert sp.served(ws) >= 5  # hooks, notify (JSON argument, stdin left open), rewind


def test_install_merges_idempotently_and_uninstall_removes_only_ours(
    sp: Sp, tmp_path: Path
) -> None:
    ws = project(tmp_path / "proj")
    settings = ws / ".claude" / "settings.json"
    mine = {
        "permissions": {"allow": ["Bash(npm test:*)"], "deny": ["Read(./.env)"]},
        "env": {"FOO": "bar"},
        "hooks": {
            "PostToolUse": [
                {"matcher": "Edit|Write", "hooks": [{"type": "command", "command": "prettier -w"}]}
            ],
            "Stop": [{"hooks": [{"type": "command", "command": "say done", "timeout": 5}]}],
        },
    }
    write(settings, json.dumps(mine, indent=4))
    sp("hooks", "install", "claude-code", "--scope", "project", "--no-snapshot", cwd=ws)
    first = settings.read_text()
    data = json.loads(first)
    assert data["permissions"] == mine["permissions"] and data["env"] == mine["env"]
    assert data["hooks"]["PostToolUse"][0] == mine["hooks"]["PostToolUse"][0]
    assert data["hooks"]["Stop"][0] == mine["hooks"]["Stop"][0]
    for event in ("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop"):
        ours = [
            h
            for g in data["hooks"][event]
            for h in g["hooks"]
            if h["command"].endswith("hooks run claude-code")
        ]
        assert len(ours) == 1 and ours[0]["type"] == "command", event

    again = sp("hooks", "install", "claude-code", "--scope", "project", "--no-snapshot", cwd=ws)
    assert "already installed" in again.out
    assert settings.read_text() == first  # idempotent, byte for byte

    sp("hooks", "uninstall", "claude-code", "--scope", "project", cwd=ws)
    assert json.loads(settings.read_text()) == mine  # only our entries went
    gone = sp("hooks", "uninstall", "claude-code", "--scope", "project", cwd=ws)
    assert "nothing changed" in gone.out and json.loads(settings.read_text()) == mine

    # a file that held only our hooks is removed; user scope lands in $HOME
    sp("hooks", "install", "codex", "--scope", "user", cwd=ws)
    user_file = tmp_path / ".codex" / "hooks.json"
    assert "hooks run codex" in user_file.read_text()
    assert not (ws / ".codex").exists()
    out = json.loads(sp("hooks", "uninstall", "codex", "--scope", "user", "--json", cwd=ws).out)
    assert out["removed"] == 4 and out["deleted"] and not user_file.exists()

    # a settings file that is not JSON is refused, untouched
    bad = ws / ".claude" / "settings.local.json"
    write(bad, '{"permissions": {,}')
    res = sp("hooks", "install", "claude-code", cwd=ws, check=False)
    assert res.code == 1 and "not readable JSON" in res.err
    assert bad.read_text() == '{"permissions": {,}'
    res = sp("hooks", "install", "codex", "--scope", "local", cwd=ws, check=False)
    assert res.code != 0 and "no 'local' scope" in res.err


def test_aider_recipe_merges_into_its_config(sp: Sp, tmp_path: Path) -> None:
    ws = project(tmp_path / "proj")
    conf = ws / ".aider.conf.yml"
    original = "# my aider settings\nmodel: sonnet\ndark-mode: true\n"
    write(conf, original)
    out = sp("hooks", "install", "aider", cwd=ws).out
    assert "aider has no hook system" in out and "--exec" in out and "while sleep" in out
    text = conf.read_text()
    assert text.startswith(original)
    assert "auto-test: true\n" in text and "hooks run aider" in text
    assert "notifications: true\n" in text and "hooks run aider end-of-reply" in text
    sp("hooks", "install", "aider", cwd=ws)
    assert conf.read_text() == text
    sp("hooks", "uninstall", "aider", cwd=ws)
    assert conf.read_text() == original

    # the user's own test command is never overwritten: we say how to wrap it
    write(conf, original + "test-cmd: pytest -q\n")
    res = sp("hooks", "install", "aider", cwd=ws, check=False)
    assert res.code == 1 and "--exec 'pytest -q'" in res.err
    assert conf.read_text() == original + "test-cmd: pytest -q\n"

    # what aider runs after an edit: snapshot, then the wrapped command's status and output
    sh(ws, "rm notes.txt")
    res = sp("hooks", "run", "aider", "--exec", "echo tests ran; exit 3", cwd=ws, check=False)
    assert res.code == 3 and res.out == "tests ran\n"
    cps = log_json(sp, ws, "aider")
    assert cps[0]["message"] == "aider after edit"
    sp("--session", "aider", "rewind", "HEAD~1", cwd=ws)
    assert (ws / "notes.txt").read_text() == "remember the milk\n"

    # a reply that only ran a shell command: aider's notifications-command snapshots it
    sh(ws, "mv README.md README.old")
    res = sp("hooks", "run", "aider", "end-of-reply", cwd=ws)
    assert res.out == ""
    assert log_json(sp, ws, "aider")[0]["message"] == "aider end of reply"

    # notification settings of the user's own are left alone
    write(conf, original + "notifications: false\n")
    sp("hooks", "install", "aider", cwd=ws)
    mine = conf.read_text()
    assert "notifications-command" not in mine and "test-cmd" in mine


def test_bad_payload_broken_store_and_refused_root_exit_0_and_log(sp: Sp, tmp_path: Path) -> None:
    ws = project(tmp_path / "proj")
    sp("init", cwd=ws)
    res = sp("hooks", "run", "claude-code", cwd=ws, input="{not json")
    assert res.out == "" and res.err == ""
    log = (ws / ".stashpoint" / "hooks.log").read_text()
    assert "bad payload (not JSON" in log
    assert log_json(sp, ws, "claude")[0]["message"] == "claude run"  # snapshotted anyway
    res = sp("hooks", "run", "codex", "[1, 2]", cwd=ws, input="[1, 2]")
    assert res.out == "" and "not a JSON object" in (ws / ".stashpoint" / "hooks.log").read_text()

    # a damaged store: the hook still exits 0, and says why in the store's log
    broken = project(tmp_path / "broken")
    (broken / ".stashpoint").mkdir()
    (broken / ".stashpoint" / "store.db").write_bytes(b"this is not a database" * 100)
    payload = json.dumps({"session_id": "x", "hook_event_name": "Stop", "cwd": str(broken)})
    res = sp("hooks", "run", "claude-code", cwd=broken, input=payload)
    assert res.code == 0 and res.out == ""
    log = (broken / ".stashpoint" / "hooks.log").read_text()
    assert "claude-code Stop session=claude-x FAILED" in log
    res = sp("--json", "hooks", "run", "claude-code", cwd=broken, input=payload)
    assert json.loads(res.out)["ok"] is False
    # --exec still runs the wrapped command and passes its status on
    res = sp("hooks", "run", "aider", "--exec", "exit 0", cwd=broken, check=False)
    assert res.code == 0

    # run from $HOME (a refused workspace root): no store is created there, the log goes to
    # the user's state directory
    at_home = json.dumps({"session_id": "x", "hook_event_name": "Stop", "cwd": str(tmp_path)})
    res = sp("hooks", "run", "claude-code", cwd=tmp_path, input=at_home)
    assert res.code == 0 and res.out == ""
    assert not (tmp_path / ".stashpoint").exists()
    state_log = tmp_path / ".local" / "state" / "stashpoint" / "hooks.log"
    assert "FAILED UsageError: refusing to snapshot" in state_log.read_text()


def test_hook_run_imports_little(sp: Sp, tmp_path: Path) -> None:
    """The hook runs on every tool call: no progress bars, frameworks or pydantic loaded."""
    ws = project(tmp_path / "proj")
    sp("init", cwd=ws)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "stashpoint", "hooks", "run", "claude-code"],
        cwd=ws,
        env=hook_env(tmp_path),
        input='{"session_id": "s", "hook_event_name": "Stop"}',
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert "stashpoint.session" in imported  # the measurement works
    assert not {m for m in imported if m.split(".")[0] in ("rich", "agents", "pydantic", "openai")}


def test_user_scope_hook_finds_the_project(sp: Sp, tmp_path: Path) -> None:
    """Installed once for the user, the hook snapshots the repository the agent works in (its
    git root, even from a subdirectory), creating the store there; $HOME itself is refused at
    install time and nothing is written."""
    res = sp("hooks", "install", "claude-code", cwd=tmp_path, check=False)
    assert res.code == 1 and "refusing to snapshot" in res.err
    assert not (tmp_path / ".claude").exists() and not (tmp_path / ".stashpoint").exists()
    sp("hooks", "install", "claude-code", "--scope", "user", cwd=tmp_path)
    command = installed_command(tmp_path / ".claude" / "settings.json", "Stop")

    repo = project(tmp_path / "code" / "repo")
    (repo / ".git").mkdir()
    payload = {"session_id": "u1", "hook_event_name": "Stop", "cwd": str(repo / "src")}
    run_hook(command, repo / "src", hook_env(tmp_path), payload)  # no CLAUDE_PROJECT_DIR
    assert (repo / ".stashpoint").is_dir() and not (repo / "src" / ".stashpoint").exists()
    show = json.loads(sp("--session", "claude-u1", "show", "--json", cwd=repo).out)
    assert show["manifest"]["root"] == str(repo) and show["manifest"]["files"] == 5


def test_a_hook_gives_up_within_its_budget_while_a_gc_holds_the_store(
    tmp_path: Path,
) -> None:
    """A garbage collection holding the store exclusively (its lock on blobs/gc.lock) would
    keep a hook waiting for minutes, past the agent's own hook timeout: the hook gives up
    within its budget (STASHPOINT_HOOK_TIMEOUT), exits 0 and logs why."""
    import fcntl

    ws = project(tmp_path / "proj")
    env = hook_env(tmp_path, STASHPOINT_HOOK_TIMEOUT="2")
    command = f"{shlex.join(STASHPOINT)} hooks run claude-code"
    payload = {"session_id": "s", "hook_event_name": "Stop", "cwd": str(ws)}
    run_hook(command, ws, env, payload)  # the store and its lock file exist now
    (lock,) = (ws / ".stashpoint").rglob("gc.lock")
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what `stashpoint gc` holds while it sweeps
    try:
        write(ws / "new.txt", "made while the store was locked\n")
        run_hook(command, ws, env, payload)  # its own 60 s timeout would fail the test
    finally:
        os.close(fd)
    log = (ws / ".stashpoint" / "hooks.log").read_text().splitlines()
    failed = [line for line in log if "FAILED" in line]
    assert len(failed) == 1 and "HookTimeout: gave up after 2 s" in failed[0], log
    run_hook(command, ws, env, payload)  # once the lock is free, the change is snapshotted
    assert "FAILED" not in (ws / ".stashpoint" / "hooks.log").read_text().splitlines()[-1]


def test_a_hook_hands_the_daily_upkeep_to_a_background_process(sp: Sp, tmp_path: Path) -> None:
    """Retention and GC take as long as the store is big: a hook whose store is due for them
    starts `stashpoint prune --auto` detached instead of running them before it exits."""
    import time

    ws = project(tmp_path / "proj")
    env = hook_env(tmp_path)
    command = f"{shlex.join(STASHPOINT)} hooks run claude-code"
    payload = {"session_id": "s", "hook_event_name": "PostToolUse", "cwd": str(ws)}
    run_hook(command, ws, env, payload)
    sp("prune", "--save", "--keep-last", "1", "--keep-within", "1s", "--every", "1s", cwd=ws)
    for i in range(3):
        write(ws / f"f{i}.txt", f"change {i}\n")
        run_hook(command, ws, env, payload)  # the first of these schedules upkeep
    time.sleep(1.2)  # upkeep is due once its period (1 s) has passed
    write(ws / "last.txt", "the hook that finds upkeep due\n")
    run_hook(command, ws, env, payload)
    log = (ws / ".stashpoint" / "hooks.log").read_text()
    assert "started `stashpoint prune --auto` in the background" in log, log
    import stashpoint

    deadline = time.monotonic() + 60
    pruned: dict[str, str] = {}
    while time.monotonic() < deadline:  # the background process prunes all but the head
        with stashpoint.open(ws / ".stashpoint") as store:
            pruned = store.meta.pruned("claude-s")
            head = store.session("claude-s").head
        if len(pruned) >= 4:
            break
        time.sleep(0.2)
    assert len(pruned) == 4 and head is not None and head.id not in pruned, pruned


def test_install_and_uninstall_write_through_a_symlinked_settings_file(
    sp: Sp, tmp_path: Path
) -> None:
    """Settings kept in a dotfiles repository and linked into place: install and uninstall
    change the linked file, and the link stays a link (it was replaced by a copy)."""
    ws = project(tmp_path / "proj")
    dotfiles = tmp_path / "dotfiles"
    mine = {"model": "opus", "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "x"}]}]}}
    write(dotfiles / "claude" / "settings.json", json.dumps(mine))
    (dotfiles / "claude" / "settings.json").chmod(0o600)
    link = tmp_path / ".claude" / "settings.json"
    link.parent.mkdir()
    link.symlink_to(Path("..") / "dotfiles" / "claude" / "settings.json")  # relative, as usual

    sp("hooks", "install", "claude-code", "--scope", "user", "--no-snapshot", cwd=ws)
    assert link.is_symlink() and os.readlink(link) == "../dotfiles/claude/settings.json"
    target = dotfiles / "claude" / "settings.json"
    data = json.loads(target.read_text())
    assert data["model"] == "opus" and installed_command(target, "Stop")
    assert target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in link.parent.iterdir()] == ["settings.json"]  # no temp file left
    first = target.read_text()
    again = sp("hooks", "install", "claude-code", "--scope", "user", "--no-snapshot", cwd=ws)
    assert "already installed" in again.out and target.read_text() == first

    sp("hooks", "uninstall", "claude-code", "--scope", "user", cwd=ws)
    assert link.is_symlink() and json.loads(target.read_text()) == mine

    # aider's file; one that only held our block is emptied through the link, not unlinked
    write(dotfiles / "aider.conf.yml", "")
    (ws / ".aider.conf.yml").symlink_to(dotfiles / "aider.conf.yml")
    sp("hooks", "install", "aider", "--no-snapshot", cwd=ws)
    assert (ws / ".aider.conf.yml").is_symlink()
    assert "hooks run aider" in (dotfiles / "aider.conf.yml").read_text()
    out = json.loads(sp("hooks", "uninstall", "aider", "--json", cwd=ws).out)
    assert out["removed"] == 1 and not out["deleted"]
    assert (ws / ".aider.conf.yml").is_symlink() and (dotfiles / "aider.conf.yml").read_text() == ""


def test_a_hook_budget_of_inf_is_a_long_budget_not_a_failure(tmp_path: Path) -> None:
    """STASHPOINT_HOOK_TIMEOUT=inf (or 1e300) overflowed the interval timer: every hook failed."""
    ws = project(tmp_path / "proj")
    command = f"{shlex.join(STASHPOINT)} hooks run claude-code"
    payload = {"session_id": "s", "hook_event_name": "Stop", "cwd": str(ws)}
    for budget in ("inf", "1e300"):
        write(ws / "notes.txt", f"changed under budget {budget}\n")
        run_hook(command, ws, hook_env(tmp_path, STASHPOINT_HOOK_TIMEOUT=budget), payload)
        log = ws / ".stashpoint" / "hooks.log"
        if not log.exists():  # failed before it found the store: logged in the state directory
            log = tmp_path / ".local" / "state" / "stashpoint" / "hooks.log"
        last = log.read_text().splitlines()[-1]
        assert "FAILED" not in last and " created " in last, last


def test_a_hook_keeps_library_logging_off_stderr(tmp_path: Path) -> None:
    """A PostgreSQL store that cannot be reached: a hook prints nothing on stderr; the
    failure (one line: the store fails fast, before its pool retries and logs) goes to
    hooks.log, under the hook's own line."""
    pytest.importorskip("psycopg_pool")
    ws = project(tmp_path / "proj")
    command = f"{shlex.join(STASHPOINT)} hooks run claude-code"
    payload = {"session_id": "s", "hook_event_name": "Stop", "cwd": str(ws)}
    env = hook_env(
        tmp_path, STASHPOINT_STORE="postgresql://127.0.0.1:1/x", STASHPOINT_HOOK_TIMEOUT="3"
    )
    proc = run_hook(command, ws, env, payload)
    assert proc.stderr == ""
    log = (tmp_path / ".local" / "state" / "stashpoint" / "hooks.log").read_text()
    assert "FAILED StoreError: cannot connect to PostgreSQL" in log
    assert "psycopg.pool" not in log


def test_agent_session_ids_that_differ_never_share_a_session(sp: Sp, tmp_path: Path) -> None:
    """Ids are cleaned into session names; two that clean alike (``a/b``, ``a_b``) or share
    their first 80 characters still get sessions of their own. A plain id stays as it is."""
    ws = project(tmp_path / "ws")
    sp("hooks", "install", "claude-code", cwd=ws)
    command = installed_command(ws / ".claude" / "settings.local.json", "Stop")
    long = "x" * 90
    for ident in ("a/b", "a_b", long + "1", long + "2", "plain-id"):
        payload = {"session_id": ident, "hook_event_name": "Stop", "cwd": str(ws)}
        run_hook(command, ws, hook_env(tmp_path), payload)
    with stashpoint.open(ws / ".stashpoint") as store:
        names = [n for n in store.sessions() if n.startswith("claude-")]
    assert len(names) == 5 and "claude-a_b" in names and "claude-plain-id" in names
    assert all(len(n) <= len("claude-") + 80 for n in names)
