"""The site-less launcher (``stashpoint.watchd.launcher``): the ``stashpoint`` script that
``make setup`` writes over pip's wrapper. It starts ``python -S``; a command the watch daemon
serves is handed over without ``site``, and any other command first gets the start-up
``site`` would have done, then runs exactly as from pip's wrapper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stashpoint
from stashpoint.watchd import launcher
from stashpoint.workspace.watch import watch_supported

from .conftest import STASHPOINT, stop_watch_daemon

PACKAGE_DIR = str(Path(stashpoint.__file__).resolve().parent.parent)
PIP_WRAPPER = (
    "#!{exe}\nimport sys\nfrom stashpoint.__main__ import main\n"
    "if __name__ == '__main__':\n"
    "    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n"
    "    sys.exit(main())\n"
)


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STASHPOINT_")}
    env["HOME"] = str(home)
    return env


def _script(tmp_path: Path, executable: str = sys.executable) -> Path:
    path = tmp_path / "bin" / "stashpoint"
    path.parent.mkdir(exist_ok=True)
    path.write_text(PIP_WRAPPER.format(exe=executable))
    launcher.write(str(path), executable, PACKAGE_DIR)
    return path


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not watch_supported(), reason="the daemon needs inotify")
def test_served_and_fallback_commands_print_what_the_cli_prints(tmp_path: Path) -> None:
    script, env = _script(tmp_path), _env(tmp_path)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "a.txt").write_text("one\n")
    first = _run([str(script), "snap", "-m", "first"], proj, env)  # no daemon: the CLI
    assert first.returncode == 0, first.stderr
    assert "step 1" in first.stdout
    started = _run([str(script), "watch", "start", "--json"], proj, env)
    assert started.returncode == 0, started.stderr
    pid = int(json.loads(started.stdout)["pid"])
    try:
        (proj / "a.txt").write_text("two\n")
        served = _run([str(script), "snap", "-m", "served"], proj, env)
        assert served.returncode == 0, served.stderr
        assert "step 2" in served.stdout
        status = json.loads(_run([str(script), "watch", "status", "--json"], proj, env).stdout)
        assert status["requests"] == 1  # the snap, and nothing else, went to the daemon
        # What a served command loads: none of these (each costs more than its own work).
        timed = _run([sys.executable, "-S", "-X", "importtime", str(script), "log"], proj, env)
        loaded = {line.rsplit("|", 1)[-1].strip() for line in timed.stderr.splitlines()}
        assert "stashpoint.watchd.client" in loaded
        assert not loaded & {"os", "site", "re", "json", "_json", "_blake2", "__future__", "click"}
        for args in (["log"], ["log", "--json"], ["--version"], ["verify"], ["nosuch"]):
            mine = _run([str(script), *args], proj, env)
            cli = _run([*STASHPOINT, *args], proj, {**env, "STASHPOINT_NO_DAEMON": "1"})
            assert (mine.returncode, mine.stdout, mine.stderr) == (
                cli.returncode,
                cli.stdout,
                cli.stderr,
            ), args
    finally:
        stop_watch_daemon(pid, tmp_path)


PROBE = """
import sys
sys.modules["stashpoint.cli"] = type(sys)("stashpoint.cli")
def main():
    import click  # from site-packages: only on sys.path once site ran
    print(repr((sys.path[1:], sys.prefix, sys.exec_prefix, "site" in sys.modules)))
sys.modules["stashpoint.cli"].main = main
"""


def test_a_fallback_gets_the_start_up_site_would_have_done(tmp_path: Path) -> None:
    """sys.path, the prefixes and the modules .pth files import are those of pip's wrapper."""
    env = _env(tmp_path)
    plain = _run(
        [sys.executable, "-c", PROBE + "main()"],
        tmp_path,
        env,
    )
    site_less = _run(
        [
            sys.executable,
            "-S",
            "-c",
            f"import sys\nsys.path.append({PACKAGE_DIR!r})\n{PROBE}\n"
            "sys.argv[1:] = ['--version']\n"
            f"from stashpoint.__main__ import launch\nlaunch({PACKAGE_DIR!r})",
        ],
        tmp_path,
        env,
    )
    assert plain.returncode == site_less.returncode == 0, (plain.stderr, site_less.stderr)
    assert site_less.stdout == plain.stdout


def test_an_interpreter_path_with_a_space_starts_through_sh(tmp_path: Path) -> None:
    link = tmp_path / "with space"
    link.symlink_to(sys.prefix, target_is_directory=True)
    exe = link / Path(sys.executable).relative_to(sys.prefix)
    script = _script(tmp_path, str(exe))
    assert script.read_text().startswith("#!/bin/sh\n")
    out = _run([str(script), "--version"], tmp_path, _env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"stashpoint, version {stashpoint.__version__}\n"


def test_only_pips_wrapper_or_a_launcher_is_replaced(tmp_path: Path) -> None:
    other = tmp_path / "stashpoint"
    other.write_text("#!/bin/sh\necho mine\n")
    assert launcher.main([str(other)]) == 1
    assert other.read_text() == "#!/bin/sh\necho mine\n"
    wrapper = tmp_path / "bin-stashpoint"
    wrapper.write_text(PIP_WRAPPER.format(exe=sys.executable))
    assert launcher.main([str(wrapper)]) == 0
    text = wrapper.read_text()
    assert text.startswith(f"#!{sys.executable} -S\n")
    assert os.access(wrapper, os.X_OK)
    assert launcher.main([str(wrapper)]) == 0  # a launcher is rewritten (another install)
    assert wrapper.read_text() == text
    assert launcher.main([]) == 2


def test_paths_without_os_are_posixpaths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client names sockets with protocol's own path functions (no ``os``); the daemon and
    the CLI's ``watch`` commands name them from ``Path.resolve()``: they must agree, symbolic
    links (absolute, relative, chained, through ``..``) included."""
    import posixpath
    import random

    from stashpoint.watchd import protocol

    rng = random.Random(7)
    dirs = [tmp_path]
    for i in range(30):  # a tree of directories and links to them
        parent = rng.choice(dirs)
        new = parent / f"d{i}"
        new.mkdir()
        dirs.append(new)
        if i % 3 == 0:
            link, target = rng.choice(dirs) / f"l{i}", rng.choice(dirs)
            if rng.random() < 0.5:
                link.symlink_to(target)
            else:
                link.symlink_to(os.path.relpath(target, link.parent))
            dirs.append(link)
    (tmp_path / "chain").symlink_to(tmp_path / "l0")
    dirs.append(tmp_path / "chain")
    monkeypatch.chdir(dirs[5])
    names = [
        "",
        ".",
        "..",
        "x",
        "/",
        "//",
        "///",
        "a//b/",
        "./a/../b",
        "/a/./b/..",
        "../..",
        "//a/..",
    ]
    for d in dirs:
        for rel in ("", "/.", "/..", "/../..", "/./."):
            p = str(d) + rel
            assert protocol.realpath(p) == posixpath.realpath(p) == str(Path(p).resolve())
        names.append(str(d))
        names.append(os.path.relpath(d))
    for name in names:
        assert protocol.normpath(name) == posixpath.normpath(name), name
        assert protocol.abspath(name) == posixpath.abspath(name), name
        assert protocol.dirname(name) == posixpath.dirname(name), name
        for other in names[:12]:
            assert protocol.join(name, other) == posixpath.join(name, other), (name, other)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for bad in (tmp_path / "loop", tmp_path / "missing" / "x", tmp_path / "missing" / ".."):
        with pytest.raises(OSError):
            protocol.realpath(str(bad))
    assert dict(protocol.environ()) == dict(os.environ)


def test_hooks_run_through_the_script_beside_the_interpreter(tmp_path: Path) -> None:
    """``hooks install`` writes the ``stashpoint`` script beside this interpreter into the
    agent's settings when that script runs stashpoint with it (no ``runpy``, and with the
    launcher no ``site``): else ``python -m stashpoint``."""
    if sys.prefix == sys.base_prefix:
        pytest.skip("needs a virtual environment to make another one of")
    env_dir = tmp_path / "env"  # this virtual environment under another name
    bin_dir = env_dir / "bin"
    bin_dir.mkdir(parents=True)
    (env_dir / "pyvenv.cfg").write_text((Path(sys.prefix) / "pyvenv.cfg").read_text())
    (env_dir / "lib").symlink_to(Path(sys.prefix) / "lib", target_is_directory=True)
    exe = bin_dir / "python"
    exe.symlink_to(sys.executable)
    script = bin_dir / "stashpoint"
    assert launcher.script_for(str(exe)) is None  # none there
    script.write_text("#!/bin/sh\necho mine\n")
    script.chmod(0o755)
    assert launcher.script_for(str(exe)) is None  # not ours
    script.write_text(PIP_WRAPPER.format(exe="/elsewhere/python"))
    assert launcher.script_for(str(exe)) is None  # another interpreter's
    script.write_text(PIP_WRAPPER.format(exe=exe))
    assert launcher.script_for(str(exe)) == str(script)
    launcher.write(str(script), str(exe), PACKAGE_DIR)
    assert launcher.script_for(str(exe)) == str(script)
    proj = tmp_path / "proj"
    proj.mkdir()
    env = _env(tmp_path)
    done = _run([str(script), "hooks", "install", "claude-code", "--json"], proj, env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["command"] == f"{script} hooks run claude-code"
    settings = json.loads(Path(json.loads(done.stdout)["path"]).read_text())
    commands = {h["command"] for e in settings["hooks"].values() for m in e for h in m["hooks"]}
    assert commands and all(c.startswith(f"{script} hooks run claude-code") for c in commands)
    payload = json.dumps({"session_id": "s1", "cwd": str(proj), "hook_event_name": "Stop"})
    (proj / "f.txt").write_text("x\n")
    ran = subprocess.run(
        next(iter(commands)),
        shell=True,
        cwd=proj,
        env=env,
        input=payload.encode(),
        capture_output=True,
    )
    assert ran.returncode == 0, ran.stderr
    log = _run([str(script), "--session", "claude-s1", "log", "--json"], proj, env)
    assert log.returncode == 0 and json.loads(log.stdout), log.stderr
