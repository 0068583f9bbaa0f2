"""Hostile bundles that cost resources rather than break rules: each is refused by a limit the
user can raise, or imported in bounded memory, and a restore that fails part way leaves
nothing half made.

Each bundle is a few KiB to a few hundred KiB on disk (see ``tests/hostile/bundles.py``); the
sizes are scaled down so the file runs in seconds, and ``tests/hostile/measure.py`` runs the
same bundles at full size (1 GiB values, 40 GiB of bombs, 1 TiB chunk lists, a million files)
with time and peak memory. The CLI runs as a user types it, in a subprocess.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import stashpoint
from stashpoint.bundle import BLOB, RawEntry

from .conftest import Result
from .hostile import bundles as hb
from .hostile.bundles import GIB, MIB
from .test_bundle import listing

Sp = Callable[..., Result]
EXIT_USER, EXIT_INTEGRITY = 1, 2


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hb.base_bundle(tmp_path_factory.mktemp("limits"))


@pytest.fixture
def here(tmp_path: Path) -> Path:
    d = tmp_path / "here"
    d.mkdir()
    return d


def refused(sp: Sp, tmp_path: Path, cwd: Path, bundle: Path, match: str, *args: str) -> None:
    """The import exits 1 naming ``match``, and nothing under the test's directory changed."""
    before = listing(tmp_path)
    r = sp("import", str(bundle), *args, cwd=cwd, check=False)
    assert (r.code, "Traceback" in r.err) == (EXIT_USER, False), r.err + r.out
    assert match in r.err, r.err
    assert listing(tmp_path) == before


def padding(size: int) -> tuple[bytes, RawEntry]:
    """A referenced value of incompressible bytes: makes a bundle as large as an attacker
    needs for its declared sizes to pass the 1000x rule, as the measured bundles were."""
    return hb.raw(BLOB, random.Random(size).randbytes(size))


def peak_rss_import(tmp_path: Path, bundle: Path, cwd: Path, *args: str) -> tuple[int, int]:
    """(exit code, peak RSS in MiB) of ``stashpoint import BUNDLE ARGS`` in a process of its own."""
    out = tmp_path / "rss.json"
    code = (
        "import json, runpy, sys\n"
        f"sys.argv = ['stashpoint', 'import', {str(bundle)!r}, *{list(args)!r}]\n"
        "rc = 0\n"
        "try:\n"
        "    runpy.run_module('stashpoint', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as exc:\n"
        "    rc = exc.code if isinstance(exc.code, int) else 1\n"
        # VmHWM: this image's own peak. ru_maxrss would also count the parent's size at fork
        # (Linux keeps the larger of the two across exec): a pytest worker that imported the
        # agent frameworks is bigger than the limit measured here.
        "peak = next(int(line.split()[1]) for line in open('/proc/self/status')"
        " if line.startswith('VmHWM:')) // 1024\n"
        f"open({str(out)!r}, 'w').write(json.dumps([rc, peak]))\n"
    )
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("STASHPOINT_STORE", None)
    subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, check=False, timeout=300)
    rc, peak = json.loads(out.read_text())
    return int(rc), int(peak)


def head_id(cwd: Path) -> str:
    with stashpoint.open(cwd / ".stashpoint") as store:
        head = store.session("main").head
        assert head is not None
        return head.id


# -- the rows ---------------------------------------------------------------------------------
def test_a_huge_value_imports_in_bounded_memory(tmp_path: Path, base: Path, here: Path) -> None:
    """192 MiB of zeros as one state value (a 6 KiB frame), in a bundle padded to 220 KiB so
    the 1000x rule lets it through: checked and imported decompressing 1 MiB at a time (the
    whole value was held in memory before)."""
    size = 192 * MIB
    digest = hb.run_digest(size)
    pad, pad_entry = padding(220_000)
    bomb = RawEntry(BLOB, digest.hex(), 1, size, hb.rle_frame(size))
    bundle = hb.forge(
        base, tmp_path / "value.spb", values={"plan": digest, "pad": pad}, added=[bomb, pad_entry]
    )
    assert bundle.stat().st_size < 300_000
    rc, peak = peak_rss_import(tmp_path, bundle, here)
    assert rc == 0
    assert peak < 160, f"peak RSS {peak} MiB for a {size >> 20} MiB value"


def test_unreferenced_objects_are_refused_before_any_content_is_inflated(
    sp: Sp, tmp_path: Path, base: Path, here: Path
) -> None:
    """Three 256 MiB bombs nothing refers to, named by digests that are not theirs: refused
    for what the manifest and records say, so their contents (and forged digests) are never
    looked at; they were each inflated before (a wrong digest was found first, exit 2)."""
    pad, pad_entry = padding(800_000)
    bombs = [
        RawEntry(BLOB, os.urandom(32).hex(), 1, 256 * MIB + i, hb.rle_frame(256 * MIB + i))
        for i in range(3)
    ]
    bundle = hb.forge(base, tmp_path / "bombs.spb", values={"plan": pad}, added=[*bombs, pad_entry])
    refused(sp, tmp_path, here, bundle, "3 object(s) no checkpoint refers to")


def test_a_chunk_list_too_large_is_refused_before_hashing(
    sp: Sp, tmp_path: Path, base: Path, here: Path
) -> None:
    """A 5 GiB file as one zero MiB named 5,120 times, under a wrong digest: refused by its
    declared size, before a chunk is hashed (the digest was found wrong after hashing all)."""
    bundle = hb.chunked_zeros(base, tmp_path / "list.spb", 5 * GIB, true_digest=False)
    assert bundle.stat().st_size < 20_000
    refused(sp, tmp_path, here, bundle, "'zeros.bin' would expand to more than")


def test_a_file_many_times_the_bundle_is_refused_unless_allowed(
    sp: Sp, tmp_path: Path, base: Path, here: Path
) -> None:
    """An 80 MiB file in a 2 KiB bundle is over the 1000x rule (a bomb's tell): refused; with
    --max-size it imports and a fork writes exactly it, into the directory named only."""
    bundle = hb.chunked_zeros(base, tmp_path / "file.spb", 80 * MIB, true_digest=True)
    refused(sp, tmp_path, here, bundle, "1000x the bundle's size; --max-size SIZE")
    sp("import", str(bundle), "--max-size", "100MiB", cwd=here)
    outside = {p for p in listing(tmp_path) if "/here/.stashpoint" not in p}
    sp("fork", head_id(here), "--into", str(tmp_path / "fork"), cwd=here)
    made = {p for p in listing(tmp_path) if "/here/.stashpoint" not in p} - outside
    fork = tmp_path / "fork"
    assert made == {str(fork), str(fork / ".stashpoint"), str(fork / "zeros.bin")}
    assert (tmp_path / "fork" / "zeros.bin").stat().st_size == 80 * MIB


@pytest.mark.parametrize(
    ("build", "args", "limit"),
    [
        pytest.param(lambda b, p: hb.wide_tree(b, p, 260_000), (), 250_000, id="one-directory"),
        pytest.param(lambda b, p: hb.fan_out(b, p, 6, 10), (), 250_000, id="10^6-fan-out"),
        pytest.param(
            lambda b, p: hb.fan_out(b, p, 3, 11), ("--max-files", "1000"), 1000, id="flag"
        ),
    ],
)
def test_trees_of_too_many_files_are_refused(
    sp: Sp,
    tmp_path: Path,
    base: Path,
    here: Path,
    build: Callable[[Path, Path], Path],
    args: tuple[str, ...],
    limit: int,
) -> None:
    """One directory of 260,000 files (refused from the tree's header, before it is decoded),
    and a 3 KiB tree naming one subtree ten times at six levels (a million files): over the
    250,000 a checkpoint may restore by default. --max-files moves the limit."""
    bundle = build(base, tmp_path / "wide.spb")
    refused(sp, tmp_path, here, bundle, f"more than {limit} files, directories and symlinks", *args)


def test_a_path_too_long_is_refused_and_a_failed_fork_leaves_nothing(
    sp: Sp, tmp_path: Path, base: Path, here: Path
) -> None:
    """255 directories of 200-character names: refused (a 51 KB path; most tools fail on
    paths over 4 KiB). Let in with --max-path, the fork into a new directory fails cleanly:
    the directory and the branch are not there (the directory was wedged: every later command
    in it failed "File name too long"), so the same fork into it, of another checkpoint,
    works, and commands run in it do."""
    bundle = hb.long_path(base, tmp_path / "long.spb", 255, 200)
    refused(sp, tmp_path, here, bundle, "has a path of 51263 bytes (limit 1024: --max-path)")
    sp("import", str(bundle), "--max-path", "100000", cwd=here)
    dest = tmp_path / "fork"
    before = {p for p in listing(tmp_path) if "/here/.stashpoint" not in p}
    r = sp("fork", head_id(here), "--into", str(dest), "-b", "deep", cwd=here, check=False)
    assert r.code == EXIT_USER and "File name too long" in r.err, r.err
    assert "Traceback" not in r.err and "run the command again" not in r.err
    assert not dest.exists()
    assert {p for p in listing(tmp_path) if "/here/.stashpoint" not in p} == before
    sp("import", str(base), "--as", "other", cwd=here)
    sp("--session", "other", "fork", "HEAD", "--into", str(dest), "-b", "deep", cwd=here)
    assert (dest / "a.txt").read_text() == "a\n"
    assert sp("log", "--json", cwd=dest).out  # a command run there finds its branch
