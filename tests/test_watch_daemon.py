"""The watch daemon (``stashpoint watch``), end to end: real daemons started by the CLI, the
commands handed to them by ``python -m stashpoint`` (the console script's entry point), and
the cases where a client must run the command itself (no daemon, a daemon killed with -9,
another environment). A randomized run checks every daemon snapshot against a full scan."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.watchd.client import request
from stashpoint.watchd.protocol import PASS_ENV, env_to_match, socket_path
from stashpoint.workspace.watch import watch_supported

from .conftest import STASHPOINT, Result, snapshot_tree, stop_watch_daemon

pytestmark = pytest.mark.skipif(not watch_supported(), reason="the daemon needs inotify")

Sp = Callable[..., Result]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("STASHPOINT_")}
    out["HOME"] = str(tmp_path)
    return out


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[int]]:
    """Pids of the daemons a test started: stopped at its end whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        stop_watch_daemon(pid, tmp_path)


@pytest.fixture
def sp(env: dict[str, str], daemons: list[int]) -> Sp:
    """``python -m stashpoint ARGS`` (through the entry point that asks the daemon first)."""

    def run(
        *args: str,
        cwd: Path,
        check: bool = True,
        input: str | None = None,
        extra: dict[str, str] | None = None,
    ) -> Result:
        proc = subprocess.run(
            [*STASHPOINT, *args],
            cwd=cwd,
            env={**env, **(extra or {})},
            capture_output=True,
            text=True,
            input=input,
            timeout=300,
        )
        res = Result(proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise AssertionError(f"stashpoint {' '.join(args)} exited {proc.returncode}:\n{res}")
        if "watch" in args and "start" in args and args[-1] == "--json" and res.code == 0:
            daemons.append(int(json.loads(res.out)["pid"]))
        return res

    return run


def project(root: Path, n: int = 20) -> Path:
    for i in range(n):
        d = root / f"d{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.txt").write_text(f"file {i}\n")
    (root / ".gitignore").write_text("*.log\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    return root


def status(sp: Sp, cwd: Path) -> dict[str, Any]:
    return dict(json.loads(sp("watch", "status", "--json", cwd=cwd).out))


def start(sp: Sp, cwd: Path, *args: str) -> dict[str, Any]:
    return dict(json.loads(sp("watch", "start", *args, "--json", cwd=cwd).out))


def gone(pid: int) -> bool:
    """The process has exited and closed its files: reaped, or a zombie with no thread left.
    A killed multi-threaded daemon's main thread turns zombie first while its other threads
    are still exiting, its listening socket still open: a client connecting then is queued
    and reset when the last thread exits (the test saw "connection reset by peer")."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            zombie = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        return zombie and len(os.listdir(f"/proc/{pid}/task")) <= 1
    except FileNotFoundError:
        return True


def wait_for(cond: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.05)


def test_start_snap_log_rewind_status_stop(sp: Sp, tmp_path: Path) -> None:
    ws = project(tmp_path / "proj")
    sp("snap", "-m", "base", cwd=ws)
    first = start(sp, ws)
    assert first["started_now"] and first["root"] == str(ws) and first["requests"] == 0
    again = start(sp, ws)  # a second start finds it
    assert not again["started_now"] and again["pid"] == first["pid"]
    sock = Path(first["socket"])
    assert sock.parent == ws / ".stashpoint"  # beside the store, not in the workspace
    st = os.stat(sock)
    assert stat.S_ISSOCK(st.st_mode) and st.st_mode & 0o777 == 0o600
    assert st.st_uid == os.getuid()

    (ws / "d1" / "f1.txt").write_text("changed\n")
    (ws / "new.txt").write_text("new\n")
    (ws / "debug.log").write_text("ignored\n")
    snap = json.loads(sp("snap", "-m", "two", "--json", cwd=ws).out)
    assert snap["created"] and snap["message"] == "two"
    after = snapshot_tree(ws)
    assert status(sp, ws)["requests"] == 1  # served by the daemon
    unchanged = sp("snap", "--if-changed", cwd=ws).out
    assert "nothing recorded" in unchanged

    # the same output with and without the daemon
    for args in (("log",), ("log", "--json"), ("--json", "log", "-n", "1")):
        served = sp(*args, cwd=ws).out
        assert served == sp(*args, cwd=ws, extra={"STASHPOINT_NO_DAEMON": "1"}).out
    assert status(sp, ws)["requests"] == 5

    out = sp("rewind", "HEAD~1", cwd=ws).out
    assert out.startswith("rewound to ") and "undo with:" in out
    assert not (ws / "new.txt").exists() and (ws / "d1" / "f1.txt").read_text() == "file 1\n"
    assert (ws / "debug.log").exists()  # ignored files are never touched
    sp("rewind", snap["id"], cwd=ws)
    assert snapshot_tree(ws) == after
    assert status(sp, ws)["requests"] == 7

    stopped = json.loads(sp("watch", "stop", "--json", cwd=ws).out)
    assert stopped["stopped"] and stopped["pid"] == first["pid"]
    assert not sock.exists()
    wait_for(lambda: gone(first["pid"]), "the daemon exits")
    assert status(sp, ws)["running"] is False
    (ws / "later.txt").write_text("x")
    assert json.loads(sp("snap", "--json", cwd=ws).out)["created"]  # no daemon: as before


def test_errors_and_exit_codes_are_the_clis(sp: Sp, tmp_path: Path) -> None:
    ws = project(tmp_path / "proj")
    sp("snap", cwd=ws)
    start(sp, ws)
    for args in (("rewind", "nope"), ("log", "-n", "x"), ("snap", "--kind", "bad")):
        served = sp(*args, cwd=ws, check=False)
        direct = sp(*args, cwd=ws, check=False, extra={"STASHPOINT_NO_DAEMON": "1"})
        assert (served.code, served.out, served.err) == (direct.code, direct.out, direct.err)
        assert served.code != 0
    assert status(sp, ws)["requests"] == 3


def test_idle_daemon_stops_by_itself(sp: Sp, tmp_path: Path) -> None:
    ws = project(tmp_path / "proj")
    started = start(sp, ws, "--idle", "1")
    wait_for(lambda: gone(started["pid"]), "the idle daemon exits")
    assert not Path(started["socket"]).exists()
    assert status(sp, ws)["running"] is False


def test_killed_daemon_leaves_a_stale_socket_that_costs_nothing(sp: Sp, tmp_path: Path) -> None:
    ws = project(tmp_path / "proj")
    first = start(sp, ws)
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(lambda: gone(first["pid"]), "the killed daemon is gone")
    assert Path(first["socket"]).exists()  # nobody removed it
    (ws / "x.txt").write_text("x")
    snap = json.loads(sp("snap", "--json", cwd=ws).out)  # runs itself, correctly
    assert snap["created"] and snap["workspace"]["files"] == 23
    assert status(sp, ws)["running"] is False
    second = start(sp, ws)
    assert second["started_now"] and second["pid"] != first["pid"]
    (ws / "y.txt").write_text("y")
    assert json.loads(sp("snap", "--json", cwd=ws).out)["created"]
    assert status(sp, ws)["requests"] == 1


def test_two_workspaces_have_a_daemon_each(sp: Sp, tmp_path: Path) -> None:
    a, b = project(tmp_path / "a"), project(tmp_path / "b", 5)
    da, db = start(sp, a), start(sp, b)
    assert da["pid"] != db["pid"] and da["socket"] != db["socket"]
    (a / "only-a.txt").write_text("a")
    (b / "only-b.txt").write_text("b")
    sa = json.loads(sp("snap", "--json", cwd=a).out)
    sb = json.loads(sp("snap", "--json", cwd=b / "d0").out)  # from a subdirectory
    assert sa["workspace"]["files"] == 23 and sb["workspace"]["files"] == 8
    assert status(sp, a)["requests"] == 1 and status(sp, b)["requests"] == 1
    # one store, a second workspace (--store, -C): its own daemon, its own socket
    c = project(tmp_path / "c", 3)
    store = ["--store", "a/.stashpoint", "-C", "c"]  # relative to where the command runs
    dc = json.loads(sp(*store, "watch", "start", "--json", cwd=tmp_path).out)
    assert dc["pid"] not in (da["pid"], db["pid"]) and dc["root"] == str(c)
    assert dc["socket"] != da["socket"]
    # beside the store, or (a path too long for a socket address) in a private directory
    private = Path(f"/tmp/stashpoint-{os.getuid()}")
    assert Path(dc["socket"]).parent in (a / ".stashpoint", private)
    sc = json.loads(sp(*store, "--session", "c", "snap", "--json", cwd=tmp_path).out)
    assert sc["workspace"]["files"] == 5
    assert json.loads(sp(*store, "watch", "status", "--json", cwd=tmp_path).out)["requests"] == 1
    sp(*store, "watch", "stop", cwd=tmp_path)


def test_another_environment_is_not_served(sp: Sp, tmp_path: Path) -> None:
    """Keys and durability decide how the store opens: a request whose settings differ from
    the daemon's is run by the client itself."""
    ws = project(tmp_path / "proj")
    start(sp, ws)
    (ws / "x.txt").write_text("x")
    out = sp("snap", "--json", cwd=ws, extra={"STASHPOINT_DURABILITY": "exit"}).out
    assert json.loads(out)["created"]
    (ws / "y.txt").write_text("y")
    sp("--mirror", str(tmp_path / "mirror"), "snap", cwd=ws)
    assert status(sp, ws)["requests"] == 0
    sp("snap", cwd=ws, extra={"STASHPOINT_SESSION": "other"})  # passed through: served
    assert status(sp, ws)["requests"] == 1
    assert len(json.loads(sp("--session", "other", "log", "--json", cwd=ws).out)) == 1


def _raw(path: str, data: bytes, *, close_early: bool = False) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(path)
        s.sendall(data)
        if close_early:
            return b""
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def test_garbled_and_hostile_requests_get_an_error_never_a_crash(
    sp: Sp, tmp_path: Path, env: dict[str, str]
) -> None:
    ws = project(tmp_path / "proj")
    path = start(sp, ws)["socket"]
    good = {
        "v": 1,
        "op": "run",
        "argv": ["log"],
        "cwd": str(ws),
        "env": {},
        "match": env_to_match(env),
        "stdin": None,
        "tty": False,
        "version": stashpoint.__version__,
    }
    bad_bodies = [
        b"not json",
        b"[1, 2]",
        b'"a string"',
        b"\xff\xfe",
        b'{"v": 2, "op": "ping"}',
        b'{"v": 1, "op": "format-disk"}',
        json.dumps({**good, "argv": "log"}).encode(),
        json.dumps({**good, "argv": ["log", 3]}).encode(),
        json.dumps({**good, "cwd": "relative"}).encode(),
        json.dumps({**good, "env": {"LD_PRELOAD": "/tmp/x.so"}}).encode(),
        json.dumps({**good, "stdin": 5}).encode(),
        json.dumps({**good, "tty": "yes"}).encode(),
        json.dumps({**good, "argv": ["log\x00"]}).encode(),
        json.dumps({**good, "argv": ["ui"]}).encode(),  # not a served command
        json.dumps({**good, "argv": ["hooks", "run", "codex", "--exec", "touch pwned"]}).encode(),
        json.dumps({**good, "argv": ["watch", "stop"]}).encode(),
        json.dumps({"v": 1, "op": "run", "argv": ["log"], "match": {}}).encode(),
        json.dumps({**good, "version": "0.0.1"}).encode(),  # another stashpoint: fallback
        b'{"v": 1, "op": "ping", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}",
    ]
    for body in bad_bodies:
        answer = json.loads(_raw(path, _frame(body))[4:])
        assert "error" in answer or "fallback" in answer, (body[:80], answer)
    assert json.loads(_raw(path, (2**32 - 1).to_bytes(4, "big"))[4:])["error"]
    _raw(path, (100).to_bytes(4, "big") + b"{", close_early=True)  # truncated, then gone
    _raw(path, b"\x00\x00", close_early=True)
    assert not (ws / "pwned").exists()
    # still serving, and a well-formed request works
    answer = request(path, good, 60)
    assert answer["code"] == 0 and "no checkpoints yet" in str(answer["out"])
    assert status(sp, ws)["running"]


def test_hook_calls_are_served_and_print_nothing(sp: Sp, tmp_path: Path) -> None:
    ws = project(tmp_path / "proj")
    start(sp, ws)
    payload = {"session_id": "abc", "hook_event_name": "PostToolUse", "tool_name": "Bash"}
    for i in range(2):
        (ws / f"made-by-bash-{i}.txt").write_text("x")
        res = sp("hooks", "run", "claude-code", cwd=ws, input=json.dumps(payload))
        assert res.out == "" and res.err == ""
    cps = json.loads(sp("--session", "claude-abc", "log", "--json", cwd=ws).out)
    assert [c["message"] for c in cps] == ["claude PostToolUse Bash"] * 2
    assert status(sp, ws)["requests"] == 3
    log = (ws / ".stashpoint" / "hooks.log").read_text()
    assert log.count("created") == 2 and "FAILED" not in log


# -- randomized: every daemon snapshot equals a full scan ---------------------------------------


def _reference_tree(tmp_path: Path, ws: Path, i: int) -> str:
    """The tree a plain full scan gives (fresh store: no cache, no watcher)."""
    ref = stashpoint.open(tmp_path / f"ref{i}")
    cp = ref.session("r", workspace=ws).checkpoint()
    ref.close()
    shutil.rmtree(tmp_path / f"ref{i}")
    assert cp.workspace is not None
    return cp.workspace.tree


def _files(ws: Path) -> tuple[list[Path], list[Path]]:
    dirs, files = [ws], []
    for p in ws.rglob("*"):
        if ".stashpoint" in p.parts:
            continue
        if p.is_dir() and not p.is_symlink():
            dirs.append(p)
        elif p.is_file() and not p.is_symlink():
            files.append(p)
    return dirs, files


OPS = (
    "edit",
    "edit",
    "same-size",
    "create",
    "delete",
    "mkdir",
    "rmtree",
    "move-file",
    "move-dir",
    "chmod",
    "chmod-dir",
    "symlink",
    "retarget",
    "hardlink",
    "outside-link",
    "ignore",
    "unignore",
    "nested-ignore",
)


def _mutate(ws: Path, outside: Path, rng: random.Random, i: int) -> str:
    dirs, files = _files(ws)
    op = rng.choice(OPS)
    d = rng.choice(dirs)
    if op == "edit" and files:
        with open(rng.choice(files), "a") as f:
            f.write(f"edit {i}\n")
    elif op == "same-size" and files:
        f = rng.choice(files)
        data = f.read_bytes() or b"x"
        f.write_bytes(data[:-1] + bytes([97 + i % 26]))
    elif op == "create":
        (d / f"new{i}.txt").write_text(f"new {i}\n")
    elif op == "delete" and files:
        rng.choice(files).unlink()
    elif op == "mkdir":
        (d / f"dir{i}").mkdir()
        (d / f"dir{i}" / "inner.txt").write_text(f"inner {i}")
    elif op == "rmtree" and len(dirs) > 3:
        shutil.rmtree(rng.choice(dirs[1:]))
    elif op == "move-file" and files:
        os.rename(rng.choice(files), d / f"moved{i}.txt")
    elif op == "move-dir" and len(dirs) > 3:
        src = rng.choice(dirs[1:])
        dst = rng.choice(dirs) / f"mdir{i}"
        if src not in dst.parents and src != dst:
            os.rename(src, dst)
    elif op == "chmod" and files:
        f = rng.choice(files)
        f.chmod(f.stat().st_mode ^ 0o100)
    elif op == "chmod-dir" and len(dirs) > 1:
        c = rng.choice(dirs[1:])
        c.chmod(c.stat().st_mode ^ 0o020)
    elif op == "symlink":
        os.symlink(rng.choice([f"target{i}", "../d0", "/etc/hostname"]), d / f"link{i}")
    elif op == "retarget":
        links = [p for p in ws.rglob("link*") if p.is_symlink()]
        if links:
            tmp = links[0].with_name(f".tmp{i}")
            os.symlink(f"elsewhere{i}", tmp)
            os.replace(tmp, links[0])
    elif op == "hardlink" and files:
        os.link(rng.choice(files), d / f"hard{i}.txt")
    elif op == "outside-link" and files:
        # a file also linked from outside, then changed through the outside name: no
        # event names a watched path
        name = outside / f"o{i}"
        name.write_text("outside")
        os.link(name, d / f"ext{i}.txt")
        with open(name, "a") as f:
            f.write(" changed")
    elif op == "ignore":
        with open(ws / ".gitignore", "a") as f:
            f.write(rng.choice(["new*.txt\n", "d1/\n", "moved*\n", "*.md\n"]))
    elif op == "unignore":
        (ws / ".gitignore").write_text(rng.choice(["*.log\n", "", "!d1/\n"]))
    elif op == "nested-ignore":
        (d / ".stashpointignore").write_text(rng.choice(["inner.txt\n", "", "*\n!keep\n"]))
    return op


def test_randomized_daemon_snapshots_equal_a_full_scan(
    sp: Sp, tmp_path: Path, env: dict[str, str], daemons: list[int]
) -> None:
    rounds = int(os.environ.get("STASHPOINT_DAEMON_ROUNDS", "200"))
    seed = int(os.environ.get("STASHPOINT_DAEMON_SEED", "24"))
    rng = random.Random(seed)
    ws = project(tmp_path / "ws", 30)
    outside = tmp_path / "outside"
    outside.mkdir()
    sp("snap", "-m", "base", cwd=ws)
    path = socket_path(str(ws / ".stashpoint"), str(ws))
    assert path is not None
    start(sp, ws)

    def served(*argv: str, ok: tuple[int, ...] = (0,)) -> dict[str, Any]:
        message = {
            "v": 1,
            "op": "run",
            "argv": list(argv),
            "cwd": str(ws),
            "env": {k: env[k] for k in PASS_ENV if k in env},
            "match": env_to_match(env),
            "stdin": None,
            "tty": False,
            "version": stashpoint.__version__,
        }
        answer = request(path, message, 120)
        assert answer.get("code") in ok, answer
        if answer["code"]:  # a refusal the CLI would print too, never a traceback
            assert str(answer["err"]).startswith("error: ") and "Traceback" not in answer["err"]
            return {}
        return dict(json.loads(str(answer["out"])))

    history: list[tuple[str, str]] = []  # (checkpoint, tree)
    restarts = 0
    for i in range(rounds):
        ops = [_mutate(ws, outside, rng, 10 * i + j) for j in range(rng.randint(1, 4))]
        roll = rng.random()
        if roll < 0.03:
            os.kill(daemons[-1], signal.SIGKILL)
            wait_for(lambda: gone(daemons[-1]), "the killed daemon is gone")
            start(sp, ws)
            restarts += 1
        elif roll < 0.05:
            sp("watch", "stop", cwd=ws)
            start(sp, ws)
            restarts += 1
        elif roll < 0.07:  # another process snapshots meanwhile (shares the stat cache)
            sp("snap", "-m", "direct", cwd=ws, extra={"STASHPOINT_NO_DAEMON": "1"})
        if history and rng.random() < 0.08:
            # what the rewind itself restores is the rewind tests' business; here, that the
            # daemon's next snapshot still equals a full scan after it wrote the files
            # (a rewind may be refused: an ignored file where the checkpoint has one)
            served("rewind", rng.choice(history)[0], "--json", ok=(0, 1))
        cp = served("snap", "-m", f"round {i}", "--json")
        want = _reference_tree(tmp_path, ws, i)
        assert cp["workspace"]["tree"] == want, f"round {i} (seed {seed}) after {ops}"
        history.append((cp["id"], want))
    assert restarts >= 1
    info = status(sp, ws)
    assert info["running"] and info["requests"] >= 1


def test_hooks_install_watch_and_stashpoint_watch_start_the_daemon(
    sp: Sp, tmp_path: Path, daemons: list[int]
) -> None:
    ws = project(tmp_path / "proj")
    out = json.loads(sp("hooks", "install", "claude-code", "--watch", "--json", cwd=ws).out)
    daemons.append(out["watch_daemon"])
    assert status(sp, ws)["pid"] == out["watch_daemon"]
    sp("watch", "stop", cwd=ws)
    # $STASHPOINT_WATCH=1: a hook that ran without a daemon starts one for the next calls
    payload = json.dumps({"session_id": "s", "hook_event_name": "Stop"})
    on = {"STASHPOINT_WATCH": "1"}
    assert sp("hooks", "run", "claude-code", cwd=ws, input=payload, extra=on).out == ""
    wait_for(lambda: status(sp, ws)["running"], "a hook starts the daemon")
    daemons.append(status(sp, ws)["pid"])
    (ws / "x.txt").write_text("x")
    sp("hooks", "run", "claude-code", cwd=ws, input=payload, extra=on)
    assert status(sp, ws)["requests"] == 1
    log = (ws / ".stashpoint" / "hooks.log").read_text()
    assert "started the watch daemon" in log and "FAILED" not in log


def test_an_edited_ignore_file_makes_the_daemon_scan_everything(sp: Sp, tmp_path: Path) -> None:
    ws = project(tmp_path / "proj")
    assert start(sp, ws)["full_scans"] == 1  # its first scan
    (ws / "d1" / "f1.txt").write_text("changed\n")
    sp("snap", cwd=ws)
    assert status(sp, ws)["full_scans"] == 1  # incremental
    (ws / "d2" / ".gitignore").write_text("f2.txt\n")  # a rule deep down: everything again
    files = json.loads(sp("snap", "--json", cwd=ws).out)["workspace"]["files"]
    assert files == 22  # f2.txt left out, the new .gitignore in
    info = status(sp, ws)
    assert info["full_scans"] == 2 and info["requests"] == 2
