"""``kill -9`` of ``stashpoint copy`` and ``stashpoint import --as`` at chosen writes.

The CLI runs as a user types it; ``$STASHPOINT_TEST_KILL_AT`` (a kill point the code has for
tests only) SIGKILLs it exactly between two writes, so every test is deterministic. What must
hold after the kill: a copy leaves no temporary bundle behind (and never a plaintext one of an
encrypted store, anywhere), and an import or a copy is finished by running the same command
again, with nothing left over.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import stashpoint
from stashpoint._fsutil import TMP_MARK
from stashpoint.bundle import MAGIC, export_bundle
from stashpoint.verify import verify_store

from .test_postgres import pg_url  # noqa: F401 - fixture: a fresh schema per test
from .test_redis import redis_url  # noqa: F401 - fixture: a fresh key prefix per test

KEY = bytes(range(32))
SHM = Path("/dev/shm")


def _env(tmp_path: Path, key: bytes | None = None, kill: str | None = None) -> dict[str, str]:
    """The user's environment, with a private TMPDIR the test can inspect."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STASHPOINT_")}
    env["HOME"] = str(tmp_path)
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmpdir)
    if key is not None:
        env["STASHPOINT_KEY"] = key.hex()
    if kill is not None:
        env["STASHPOINT_TEST_KILL_AT"] = kill
    return env


def _run(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stashpoint", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _killed(env: dict[str, str], *args: str, cwd: Path) -> None:
    proc = _run(env, *args, cwd=cwd)
    assert proc.returncode == -signal.SIGKILL, (
        f"not killed at {env['STASHPOINT_TEST_KILL_AT']}: exit {proc.returncode}\n"
        f"{proc.stderr}{proc.stdout}"
    )


def _ok(env: dict[str, str], *args: str, cwd: Path) -> str:
    proc = _run(env, *args, cwd=cwd)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stderr}{proc.stdout}"
    return proc.stdout


def _history(path: Path, secret: str, key: bytes | None = None) -> None:
    """A session with two branches, a label, a conversation and a value worth hiding."""
    with stashpoint.open(path, encryption_key=key) as store:
        s = store.session("run")
        hi = [{"role": "user", "content": "hi"}]
        first = s.checkpoint({"messages": hi, "note": secret}, label="start")
        s.checkpoint({"messages": [*hi, {"role": "assistant", "content": "yo"}], "step": 2})
        s.checkpoint({"messages": hi, "step": 3})
        s.fork(first.id, "alt").checkpoint({"step": "alt", "note": secret})


def _files(*roots: Path) -> Iterator[Path]:
    for root in roots:
        if root.is_dir():
            yield from (p for p in root.rglob("*") if p.is_file())


def _plaintext(paths: Iterator[Path], secret: str) -> list[str]:
    """Files that hold the secret in the clear or are a plaintext bundle."""
    found = []
    for p in paths:
        try:
            data = p.read_bytes()
        except OSError:  # another test's file, gone meanwhile
            continue
        if secret.encode() in data or data.startswith(MAGIC):
            found.append(str(p))
    return found


def _shm_temps() -> Iterator[Path]:
    """Temporary directories of copies in memory (other processes' too: judged by content)."""
    if SHM.is_dir():
        for p in SHM.iterdir():
            if p.name.startswith(TMP_MARK):
                yield from _files(p)


# -- copy ----------------------------------------------------------------------------------


def test_killed_copy_of_an_encrypted_store_leaves_no_plaintext_anywhere(tmp_path: Path) -> None:
    secret = f"launch code {secrets.token_hex(8)}"
    _history(tmp_path / "src", secret, KEY)
    dest = tmp_path / "dest"
    env = _env(tmp_path, KEY, kill="copy-exported")
    _killed(env, "copy", "--from", str(tmp_path / "src"), "--to", str(dest), cwd=tmp_path)
    tmpdir = Path(env["TMPDIR"])
    assert list(tmpdir.iterdir()) == []
    assert _plaintext(_shm_temps(), secret) == []
    assert _plaintext(_files(dest, tmpdir), secret) == []
    # The same command finishes the copy, and leaves nothing either.
    _ok(
        _env(tmp_path, KEY),
        "copy",
        "--from",
        str(tmp_path / "src"),
        "--to",
        str(dest),
        cwd=tmp_path,
    )
    assert list(tmpdir.iterdir()) == []
    assert _plaintext(_files(dest), secret) == []
    with stashpoint.open(dest, encryption_key=KEY) as store:
        assert verify_store(store).problems == []
        assert store.session("run").state()["step"] == 3
        assert len(store.meta.list_checkpoints("run")) == 4


def test_killed_plain_copy_leaves_no_temporary_bundle(tmp_path: Path) -> None:
    secret = f"not secret {secrets.token_hex(8)}"
    _history(tmp_path / "src", secret)
    args = ["copy", "--from", str(tmp_path / "src"), "--to", str(tmp_path / "dest")]
    env = _env(tmp_path, kill="copy-exported")
    _killed(env, *args, cwd=tmp_path)
    tmpdir = Path(env["TMPDIR"])
    assert list(_files(tmpdir)) == [] and list(tmpdir.iterdir()) == []
    assert not [p for p in _files(tmp_path / "dest") if TMP_MARK in p.name]
    _ok(_env(tmp_path), *args, cwd=tmp_path)
    assert list(tmpdir.iterdir()) == []
    with stashpoint.open(tmp_path / "dest") as store:
        assert verify_store(store).problems == []
        assert store.meta.branches("run").keys() == {"main", "alt"}


def test_a_copy_never_writes_an_encrypted_stores_plaintext_to_its_temporary_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary bundle has no name (nothing to leave behind) and, for an encrypted store,
    holds only ciphertext: read through /proc while the copy writes and reads it."""
    from stashpoint.copy import copy_sessions

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc")
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    secret = f"launch code {secrets.token_hex(8)}"
    seen: list[bytes] = []
    named: list[str] = []

    def watch(_n: int, _b: int) -> None:  # called while the bundle is written and read
        named.extend(str(p) for p in _files(tmpdir))
        named.extend(str(p) for p in _shm_temps())
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith((str(tmpdir), str(SHM))):
                with open(f"/proc/self/fd/{fd}", "rb") as f:
                    seen.append(f.read())

    _history(tmp_path / "src", secret, KEY)
    with (
        stashpoint.open(tmp_path / "src", encryption_key=KEY) as src,
        stashpoint.open(tmp_path / "dest", encryption_key=KEY) as dest,
    ):
        report = copy_sessions(src, dest, progress=watch)
        assert report.verified and dest.session("run").state("start")["note"] == secret
    assert seen, "the temporary bundle was not found"
    assert all(secret.encode() not in data and not data.startswith(MAGIC) for data in seen)
    assert not [n for n in named if secret in Path(n).read_bytes().decode("latin-1")]


def test_killed_copy_as_a_new_session_is_finished_by_running_it_again(tmp_path: Path) -> None:
    """``copy --as`` re-exports the source on each run (a new bundle): the re-run still
    recognises the half-done session as its own and completes it."""
    secret = f"launch code {secrets.token_hex(8)}"
    _history(tmp_path / "src", secret)
    args = ["copy", "--from", str(tmp_path / "src"), "--to", str(tmp_path / "vault")]
    args += ["--session", "run", "--as", "sealed"]
    _killed(_env(tmp_path, KEY, kill="import-record:2"), *args, cwd=tmp_path)
    _ok(_env(tmp_path, KEY), *args, cwd=tmp_path)
    assert _plaintext(_files(tmp_path / "vault", tmp_path / "tmpdir"), secret) == []
    with stashpoint.open(tmp_path / "vault", encryption_key=KEY) as store:
        assert verify_store(store).problems == []
        assert len(store.meta.list_checkpoints("sealed")) == 4
        assert store.meta.branches("sealed").keys() == {"main", "alt"}
        assert store.session("sealed").state("start")["note"] == secret


# -- import --as ---------------------------------------------------------------------------


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    _history(tmp_path / "src", "a value")
    path = tmp_path / "run.spb"
    with stashpoint.open(tmp_path / "src") as store:
        export_bundle(store, path, session="run")
    return path


def _logs_of(path: Path, session: str) -> int:
    with stashpoint.open(path) as store:
        return sum(1 for _i, info in store.meta.iter_logs() if info.session == session)


def _check_imported(store: stashpoint.Store, name: str) -> None:
    assert verify_store(store).problems == []
    assert len(store.meta.list_checkpoints(name)) == 4  # none twice, none missing
    heads = store.meta.branches(name)
    assert heads.keys() == {"main", "alt"}
    s = store.session(name)
    assert s.state()["step"] == 3
    assert s.state("start")["note"] == "a value"
    assert store.session(name, branch="alt").state()["step"] == "alt"


@pytest.mark.parametrize("kill", ["import-log", "import-record", "import-record:3", "import-head"])
def test_killed_import_as_is_finished_by_running_it_again(
    tmp_path: Path, bundle: Path, kill: str
) -> None:
    store_dir = tmp_path / "dest"
    args = ["--store", str(store_dir), "import", str(bundle), "--as", "copy"]
    _killed(_env(tmp_path, kill=kill), *args, cwd=tmp_path)
    _ok(_env(tmp_path), *args, cwd=tmp_path)
    with stashpoint.open(store_dir) as store:
        _check_imported(store, "copy")
        logs = [i for i, info in store.meta.iter_logs() if info.session == "copy"]
        assert len(logs) == _logs_of(tmp_path / "src", "run")  # the re-run reused them
    # Done: the same import now finds the session complete and says so.
    again = _run(_env(tmp_path), *args, cwd=tmp_path)
    assert again.returncode == 1 and "exists" in again.stderr


def test_half_done_import_as_refuses_another_bundle(tmp_path: Path, bundle: Path) -> None:
    other = tmp_path / "other"
    with stashpoint.open(other) as store:
        store.session("run").checkpoint({"x": 1})
        export_bundle(store, tmp_path / "other.spb", session="run")
    store_dir = tmp_path / "dest"
    args = ["--store", str(store_dir), "import"]
    _killed(_env(tmp_path, kill="import-record"), *args, str(bundle), "--as", "copy", cwd=tmp_path)
    refused = _run(_env(tmp_path), *args, str(tmp_path / "other.spb"), "--as", "copy", cwd=tmp_path)
    assert refused.returncode == 1 and "interrupted import" in refused.stderr
    _ok(_env(tmp_path), *args, str(bundle), "--as", "copy", cwd=tmp_path)
    with stashpoint.open(store_dir) as store:
        _check_imported(store, "copy")


@pytest.mark.parametrize("backend", ["postgres", "redis"])
def test_killed_import_as_is_finished_on_server_stores(
    tmp_path: Path,
    bundle: Path,
    backend: str,
    pg_url: str,  # noqa: F811
    redis_url: str,  # noqa: F811
) -> None:
    url = pg_url if backend == "postgres" else redis_url
    args = ["--store", url, "import", str(bundle), "--as", "copy"]
    _killed(_env(tmp_path, kill="import-record:2"), *args, cwd=tmp_path)
    _ok(_env(tmp_path), *args, cwd=tmp_path)
    with stashpoint.open(url) as store:
        _check_imported(store, "copy")


def test_killed_import_into_its_own_session_is_finished_by_running_it_again(
    tmp_path: Path, bundle: Path
) -> None:
    store_dir = tmp_path / "dest"
    args = ["--store", str(store_dir), "import", str(bundle)]
    _killed(_env(tmp_path, kill="import-record:2"), *args, cwd=tmp_path)
    _ok(_env(tmp_path), *args, cwd=tmp_path)
    with stashpoint.open(store_dir) as store:
        _check_imported(store, "run")
