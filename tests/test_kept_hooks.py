"""A rewind (or a fork here) to a checkpoint taken before ``stashpoint hooks install`` keeps
stashpoint's hooks in the agent's settings file: the restored file is the checkpoint's, with our
entries merged back in as ``hooks install`` merges them. Without that, the agent's later actions
were silently no longer checkpointed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from .conftest import Result

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
