"""A rewind (or a fork here) to a checkpoint taken before ``stashpoint hooks install`` keeps
stashpoint's hooks in the agent's settings file: the restored file is the checkpoint's, with our
entries merged back in as ``hooks install`` merges them. Without that, the agent's later actions
were silently no longer checkpointed. The same from the web UI's rewind and fork buttons, and for
a rewind killed between restoring the files and merging the hooks back: the next command, which
finishes the restore, merges them too."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import STASHPOINT, Result

Sp = Callable[..., Result]

SETTINGS = {
    "claude-code": ".claude/settings.local.json",
    "codex": ".codex/hooks.json",
    "aider": ".aider.conf.yml",
}
USER_SETTINGS = {  # what the user had in the file before installing the hooks
    "claude-code": json.dumps({"permissions": {"allow": ["Bash(npm test:*)"]}}, indent=2) + "\n",
    "codex": json.dumps({"hooks": {"Stop": [{"hooks": [{"command": "say done"}]}]}}) + "\n",
    "aider": "# mine\nmodel: sonnet\n",
}


def _project(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hi')\n")
    return root


def _installed(sp: Sp, ws: Path) -> list[str]:
    status = json.loads(sp("hooks", "status", "--json", cwd=ws).out)
    return [i["agent"] for i in status["installed"]]


@pytest.mark.parametrize("agent", ["claude-code", "codex", "aider"])
@pytest.mark.parametrize("own_settings", [False, True], ids=["no-file", "user-file"])
def test_a_rewind_to_before_hooks_install_keeps_the_hooks(
    sp: Sp, tmp_path: Path, agent: str, own_settings: bool
) -> None:
    ws = _project(tmp_path / "proj")
    settings = ws / SETTINGS[agent]
    if own_settings:
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(USER_SETTINGS[agent])
    sp("snap", "-m", "before", "-l", "before", cwd=ws)
    sp("hooks", "install", agent, "--no-snapshot", cwd=ws)
    installed = settings.read_text()
    (ws / "src" / "new.py").write_text("x = 1\n")
    sp("snap", "-m", "after", cwd=ws)

    res = sp("rewind", "before", cwd=ws)
    assert f"kept stashpoint's hooks in {SETTINGS[agent]}" in res.out, res.out
    assert not (ws / "src" / "new.py").exists()  # the rest is the checkpoint's
    assert _installed(sp, ws) == [agent]
    assert settings.read_text() == installed  # merged back exactly as `hooks install` did

    again = sp("rewind", "before", "--json", cwd=ws)
    assert json.loads(again.out)["kept_hooks"] == [SETTINGS[agent]]

    # the escape hatch: the settings file exactly as the checkpoint holds it
    res = sp("rewind", "before", "--no-keep-hooks", cwd=ws)
    assert "kept stashpoint's hooks" not in res.out
    assert _installed(sp, ws) == []
    if own_settings:
        assert settings.read_text() == USER_SETTINGS[agent]
    else:
        assert not settings.exists()


def test_a_rewind_that_keeps_the_hooks_says_nothing_and_a_fork_here_keeps_them(
    sp: Sp, tmp_path: Path
) -> None:
    ws = _project(tmp_path / "proj")
    sp("hooks", "install", "claude-code", "--no-snapshot", cwd=ws)
    first = json.loads(sp("snap", "-m", "with hooks", "--json", cwd=ws).out)
    (ws / "src" / "app.py").write_text("print('changed')\n")
    sp("snap", "-m", "two", cwd=ws)
    res = sp("rewind", first["id"], cwd=ws)  # the checkpoint has them: nothing to keep
    assert "kept" not in res.out

    ws2 = _project(tmp_path / "proj2")
    before = json.loads(sp("snap", "-m", "before", "--json", cwd=ws2).out)
    sp("hooks", "install", "codex", "--no-snapshot", cwd=ws2)
    res = sp("fork", before["id"], "-b", "try", cwd=ws2)
    assert "kept stashpoint's hooks in .codex/hooks.json" in res.out, res.out
    assert _installed(sp, ws2) == ["codex"]


def test_a_checkpoint_settings_file_that_is_not_json_is_a_warning_not_a_failed_rewind(
    sp: Sp, tmp_path: Path
) -> None:
    ws = _project(tmp_path / "proj")
    settings = ws / ".claude" / "settings.local.json"
    settings.parent.mkdir()
    settings.write_text('{"permissions": {,}')
    sp("snap", "-m", "broken settings", "-l", "broken", cwd=ws)
    settings.unlink()
    sp("hooks", "install", "claude-code", "--no-snapshot", cwd=ws)
    sp("snap", "-m", "installed", cwd=ws)

    res = sp("rewind", "broken", cwd=ws, check=False)
    assert res.code == 0, res.err
    assert "not put back" in res.err and "stashpoint hooks install claude-code" in res.err
    assert settings.read_text() == '{"permissions": {,}'  # the checkpoint's, untouched


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    """The environment the ``sp`` fixture runs the CLI in (``HOME`` inside the test)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("STASHPOINT_STORE", "STASHPOINT_SESSION")
    }
    return {**env, "HOME": str(tmp_path), **more}


def _before_and_after(sp: Sp, ws: Path, agent: str) -> str:
    """A checkpoint labelled ``before`` without the hooks, then the hooks installed and a
    checkpoint with a new file: what ``agent``'s settings file holds once installed."""
    settings = ws / SETTINGS[agent]
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(USER_SETTINGS[agent])
    sp("snap", "-m", "before", "-l", "before", cwd=ws)
    sp("hooks", "install", agent, "--no-snapshot", cwd=ws)
    (ws / "src" / "new.py").write_text("x = 1\n")
    sp("snap", "-m", "after", cwd=ws)
    return settings.read_text()


class _Browser:
    """Forms posted to a running ``stashpoint ui`` as a browser posts them (cookie, CSRF
    field, redirects followed): the page each action ends on."""

    def __init__(self, url: str) -> None:
        self.base = url.split("/?")[0]
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        self.get(url)  # the token becomes a cookie

    def get(self, path: str) -> str:
        url = path if path.startswith("http") else self.base + path
        with self.opener.open(url, timeout=60) as resp:
            return str(resp.read().decode())

    def post(self, path: str, form_page: str, **fields: str) -> str:
        found = re.search(r"name='csrf' value='([0-9a-f]+)'", self.get(form_page))
        assert found, "no CSRF field on the page"
        data = urllib.parse.urlencode({**fields, "csrf": found.group(1)}).encode()
        with self.opener.open(self.base + path, data=data, timeout=120) as resp:
            return str(resp.read().decode())


@contextlib.contextmanager
def _ui(tmp_path: Path, ws: Path) -> Iterator[_Browser]:
    """``stashpoint ui`` serving ``ws``, a real server in its own process."""
    log = (tmp_path / "ui.log").open("w")
    server = subprocess.Popen(
        [*STASHPOINT, "ui", "--port", "0", "--json"],
        cwd=ws,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line, (tmp_path / "ui.log").read_text()
        yield _Browser(json.loads(line)["url"])
    finally:
        server.terminate()
        server.wait(30)
        if server.stdout is not None:
            server.stdout.close()
        log.close()


def test_the_web_ui_rewind_and_fork_keep_the_hooks(sp: Sp, tmp_path: Path) -> None:
    ws = _project(tmp_path / "proj")
    installed = _before_and_after(sp, ws, "claude-code")
    settings = ws / SETTINGS["claude-code"]
    before = json.loads(sp("show", "before", "--json", cwd=ws).out)["id"]
    with _ui(tmp_path, ws) as browser:
        page = browser.post("/s/main/rewind", f"/s/main/c/{before}", ref=before, mode="both")
        assert "Rewound to this checkpoint" in page
        assert "Kept stashpoint's hooks in <code>.claude/settings.local.json</code>" in page
        assert not (ws / "src" / "new.py").exists()  # the rest is the checkpoint's
        assert settings.read_text() == installed
        assert _installed(sp, ws) == ["claude-code"]

        settings.write_text(USER_SETTINGS["claude-code"])  # lost by hand: a fork here keeps
        sp("hooks", "install", "claude-code", "--no-snapshot", cwd=ws)  # ... what is there now
        page = browser.post("/s/main/fork", f"/s/main/c/{before}", ref=before, branch="try")
        assert "Forked branch <b>try</b>" in page and "Kept stashpoint" in page, page
        assert settings.read_text() == installed


def test_a_rewind_killed_before_the_hooks_are_merged_back_is_finished_with_them(
    sp: Sp, tmp_path: Path
) -> None:
    ws = _project(tmp_path / "proj")
    installed = _before_and_after(sp, ws, "codex")
    settings = ws / SETTINGS["codex"]
    before = json.loads(sp("show", "before", "--json", cwd=ws).out)["id"]
    killed = subprocess.run(
        [*STASHPOINT, "rewind", "before"],
        cwd=ws,
        env=_env(tmp_path, STASHPOINT_TEST_KILL_AT="rewind-hooks"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (ws / "src" / "new.py").exists()  # killed after the files were restored
    assert settings.read_text() == USER_SETTINGS["codex"]  # ... and before the merge

    sp("log", cwd=ws)  # any command finishes the interrupted restore
    assert settings.read_text() == installed
    assert _installed(sp, ws) == ["codex"]
    head = json.loads(sp("show", "HEAD", "--json", cwd=ws).out)
    assert head["id"] == before  # finished as that rewind: no checkpoint of "work found"


def test_the_library_rewind_keeps_the_hooks_and_says_where(tmp_path: Path) -> None:
    """``Session.rewind`` itself keeps them (every front end restores through it);
    ``keep_hooks=False`` restores the checkpoint's file as it is."""
    import stashpoint

    ws = _project(tmp_path / "proj")
    store = stashpoint.open(tmp_path / "store")
    s = store.session("main", workspace=ws)
    before = s.checkpoint(message="before")
    settings = ws / ".codex" / "hooks.json"
    settings.parent.mkdir()
    hook = {"type": "command", "command": "/usr/bin/stashpoint hooks run codex", "timeout": 120}
    settings.write_text(json.dumps({"hooks": {"Stop": [{"hooks": [hook]}]}}))
    s.checkpoint(message="installed")

    result = s.rewind(before.id)
    assert result.kept_hooks == [".codex/hooks.json"] and result.reinstall_hooks == []
    assert s.last_restore is result
    assert "hooks run codex" in settings.read_text()
    assert s.rewind(before.id, keep_hooks=False).kept_hooks == []
    assert not settings.exists()
    store.close()
