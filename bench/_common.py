"""Shared pieces of the benchmarks: timing, result rows with their bars, the shadow-git peer.

Every benchmark returns a list of rows (dicts) that ``run_all`` prints as a table and writes as
JSON. A row compares a stashpoint median with a peer's median (or with a fixed bar) and says
PASS or MISS; rows without a bar are context (``info``).
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "PG_DEFAULT",
    "Config",
    "Floor",
    "Gap",
    "ShadowGit",
    "cli_env",
    "dir_size",
    "git_version",
    "median",
    "pg_base",
    "pg_schema",
    "row",
    "stashpoint_cmd",
    "timed",
    "warm_bytecode",
]


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def timed(fn: Callable[[], Any]) -> float:
    """Seconds taken by ``fn()`` (perf_counter, wall clock)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def row(
    figure: str,
    value: float,
    unit: str,
    *,
    peer: float | None = None,
    peer_name: str = "",
    bar: float | None = None,
    bar_kind: str = "ratio",
    samples: Sequence[float] = (),
    peer_samples: Sequence[float] = (),
    note: str = "",
) -> dict[str, Any]:
    """One table row. ``bar_kind``: ``ratio`` (value/peer <= bar) or ``abs`` (value <= bar)."""
    ratio = value / peer if peer else None
    status = "info"
    if bar is not None:
        measured = ratio if bar_kind == "ratio" else value
        status = "PASS" if measured is not None and measured <= bar else "MISS"
    return {
        "figure": figure,
        "stashpoint": value,
        "unit": unit,
        "peer": peer,
        "peer_name": peer_name,
        "ratio": ratio,
        "bar": bar,
        "bar_kind": bar_kind,
        "status": status,
        "samples": list(samples),
        "peer_samples": list(peer_samples),
        "note": note,
    }


PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


def pg_base() -> str:
    """The PostgreSQL server the benchmarks use (the tests' one unless told otherwise)."""
    return os.environ.get(
        "STASHPOINT_BENCH_POSTGRES_URL",
        os.environ.get("STASHPOINT_TEST_POSTGRES_URL", PG_DEFAULT),
    )


@contextmanager
def pg_schema(base: str, tag: str) -> Iterator[str]:
    """A store URL on a fresh schema of ``base``, dropped afterwards."""
    import psycopg

    schema = f"spbench_{tag}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as db:
        db.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(base, autocommit=True) as db:
            db.execute(f"DROP SCHEMA {schema} CASCADE")


def dir_size(path: Path) -> int:
    """Bytes of all regular files under ``path`` (apparent sizes)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


def stashpoint_cmd() -> list[str]:
    """The installed ``stashpoint`` console script next to this interpreter (what users run)."""
    script = Path(sys.executable).parent / "stashpoint"
    if script.exists():
        return [str(script)]
    found = shutil.which("stashpoint")
    return [found] if found else [sys.executable, "-m", "stashpoint"]


def served_cmd(tmp: Path) -> list[str]:
    """A ``stashpoint`` command as installing this tree with ``make setup`` writes it, so the
    rows hold what users pay even where the installed script predates this tree: pip's
    console script of ``stashpoint.__main__:main`` (which hands a command to a running watch
    daemon before importing the CLI), then, over it, the site-less launcher of
    :mod:`stashpoint.watchd.launcher` (``python -S``; ``site`` runs only for a command the
    daemon does not serve). ``STASHPOINT_BENCH_WRAPPER=pip`` keeps pip's wrapper (what a
    plain ``pip install`` leaves), or a tree without the launcher does.

    pip's wrapper is made by the script maker of the pip next to this interpreter (the one
    ``make setup`` installs), so it is byte for byte what ``pip install`` puts on PATH. (The
    hand-written wrapper this replaced began with ``import re``, as older pips' did: that
    import alone costs about half an interpreter start, which no user of the current pip
    pays.) Without pip's internals, pip 26's text is written by hand."""
    bin_dir = tmp / "served-bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "stashpoint"
    try:
        from pip._internal.operations.install.wheel import PipScriptMaker

        maker = PipScriptMaker(None, str(bin_dir))
        maker.clobber, maker.variants, maker.set_mode = True, {""}, True
        maker.executable = sys.executable
        maker.make("stashpoint = stashpoint.__main__:main")
    except Exception:  # another pip (or none): its template as of pip 26
        script.write_text(
            f"#!{sys.executable}\nimport sys\nfrom stashpoint.__main__ import main\n"
            "if __name__ == '__main__':\n"
            "    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n"
            "    sys.exit(main())\n"
        )
        script.chmod(0o755)
    if os.environ.get("STASHPOINT_BENCH_WRAPPER") != "pip":
        try:
            from stashpoint.watchd import launcher
        except ImportError:
            pass
        else:
            import stashpoint

            package_dir = str(Path(stashpoint.__file__).resolve().parent.parent)
            launcher.write(str(script), sys.executable, package_dir)
    return [str(script)]


PYCACHE = Path(tempfile.gettempdir()) / "stashpoint-bench-pycache"


def cli_env(*, bytecode: bool = True) -> dict[str, str]:
    """Environment for ``stashpoint`` subprocesses.

    Users' installs have bytecode caches; an environment with ``PYTHONDONTWRITEBYTECODE=1`` has
    none for an editable install, and every start would recompile stashpoint (~50 ms). So the
    CLI runs with caching on, into ``PYCACHE`` (``PYTHONPYCACHEPREFIX``: nothing is written
    next to the sources).
    """
    env = dict(os.environ)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def warm_bytecode(env: dict[str, str]) -> None:
    """Compile every stashpoint module into the cache ``env`` points at (once per machine)."""
    import stashpoint

    pkg = str(Path(stashpoint.__file__).parent)
    subprocess.run([sys.executable, "-m", "compileall", "-q", pkg], env=env, capture_output=True)


def git_version() -> tuple[int, ...]:
    out = subprocess.run(["git", "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(x) for x in m.groups() if x is not None) if m else (0,)


def git_env(home: Path) -> dict[str, str]:
    """An environment in which no user or system git config leaks into the peer."""
    env = dict(os.environ)
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        HOME=str(home),
        GIT_AUTHOR_NAME="bench",
        GIT_AUTHOR_EMAIL="bench@example.invalid",
        GIT_COMMITTER_NAME="bench",
        GIT_COMMITTER_EMAIL="bench@example.invalid",
    )
    return env


@dataclass
class ShadowGit:
    """A shadow repository: git dir outside the workspace, as Cline/Roo/OpenCode keep theirs.

    Automatic gc / maintenance is switched off so no detached background ``git gc`` steals CPU
    from later measurements (this only spares git work). ``fsync`` runs git with
    ``core.fsync=all`` and ``core.fsyncMethod=batch`` (its fastest durable mode) to compare at
    stashpoint's durability; by default git fsyncs none of the loose objects, index or refs a
    commit writes.
    """

    git_dir: Path
    work_tree: Path
    env: dict[str, str]

    def _base(self, fsync: bool) -> list[str]:
        args = ["git", f"--git-dir={self.git_dir}", f"--work-tree={self.work_tree}"]
        args += ["-c", "gc.auto=0", "-c", "maintenance.auto=false"]
        if fsync:
            args += ["-c", "core.fsync=all", "-c", "core.fsyncMethod=batch"]
        return args

    def run(self, *args: str, fsync: bool = False) -> str:
        proc = subprocess.run(
            [*self._base(fsync), *args], env=self.env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def init(self) -> None:
        self.run("init", "-q")

    def commit(self, *, fsync: bool = False) -> None:
        """``git add -A && git commit`` (allow-empty: a shadow repo snapshots every turn)."""
        self.run("add", "-A", fsync=fsync)
        self.run("commit", "-q", "--allow-empty", "--no-verify", "-m", "m", fsync=fsync)

    def head(self) -> str:
        return self.run("rev-parse", "HEAD").strip()

    def restore(self, commit: str, how: str, *, fsync: bool = False) -> None:
        """Make the work tree match ``commit``; ``git clean -fd`` removes files created since
        (without ``-x``, so gitignored paths such as node_modules/ are left alone)."""
        if how == "checkout":
            self.run("checkout", "-q", "-f", commit, "--", ".", fsync=fsync)
        elif how == "reset":
            self.run("reset", "-q", "--hard", commit, fsync=fsync)
        elif how == "read-tree":
            self.run("read-tree", "-u", "--reset", commit, fsync=fsync)
        else:
            raise ValueError(how)
        self.run("clean", "-fdq", fsync=fsync)


GIT_RESTORES = {
    "checkout": "git checkout -f C -- . && git clean -fd",
    "reset": "git reset --hard C && git clean -fd",
    "read-tree": "git read-tree -u --reset C && git clean -fd",
}


@dataclass
class Config:
    """Sizes and repetitions; ``quick()`` is a smoke-test size that runs in well under a minute."""

    files: int = 10_000
    reps_first: int = 3
    reps: int = 5
    steps: int = 1000
    lg_steps: int = 1000
    cli_runs: int = 10
    tmp: Path | None = None
    keep: bool = False

    @classmethod
    def quick(cls) -> Config:
        return cls(files=1000, reps_first=1, reps=3, steps=200, lg_steps=200, cli_runs=5)


class Gap:
    """Keeps every snapshot at least ``seconds`` after the previous one (no longer).

    The stat cache distrusts files modified within two kernel clock ticks (~10 ms) of the scan
    that cached them; 0.1 s between snapshots is what an agent turn takes at the very least,
    and sleeping longer would only flatter stashpoint.
    """

    def __init__(self, seconds: float = 0.1) -> None:
        self.seconds = seconds
        self.last = 0.0

    def wait(self) -> None:
        left = self.last + self.seconds - time.monotonic()
        if left > 0:
            time.sleep(left)

    def mark(self) -> None:
        self.last = time.monotonic()


class Floor:
    """The floor of every SQLite bar: one bare WAL commit of a 1 KB row (BEGIN IMMEDIATE;
    INSERT; COMMIT) at the same ``synchronous`` setting. Nothing durable can be cheaper.

    Warmed up to steady state: past the first WAL checkpoint, so its commits overwrite a WAL
    file that no longer grows, as a long-running store's do. While a WAL file still grows,
    each fsync also commits the file's new size to the file system's journal: on this
    machine that made the floor's first ~1,000 commits 0.25-0.37 ms and the later ones
    0.15-0.17 ms, a cliff in the middle of a run that said nothing about either side.
    Sample it between the measured operations, so both see the disk at the same moment.
    """

    def __init__(self, path: Path, synchronous: str = "FULL") -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self.conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
        self.payload = os.urandom(1024)
        self.times: list[float] = []
        pages = int(self.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
        for _ in range(pages + 50):  # one commit appends ~1 page: past the first reset
            self._commit()

    def _commit(self) -> float:
        t0 = time.perf_counter()
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute("INSERT INTO t(data) VALUES (?)", (self.payload,))
        self.conn.execute("COMMIT")
        return time.perf_counter() - t0

    def sample(self) -> None:
        """One commit, its seconds kept in ``times``."""
        self.times.append(self._commit())

    def samples(self, k: int) -> list[float]:
        """``k`` commits in a row: their seconds (not kept)."""
        return [self._commit() for _ in range(k)]

    def close(self) -> None:
        self.conn.close()
