"""The PostgreSQL store behind a real PgBouncer in transaction pooling mode.

Transaction pooling hands each transaction to whichever server connection is free, so a store
must not rely on session state between transactions: no server-side prepared statements, no
session-level SET, no advisory locks held across statements. The whole conformance suite, the
engine round trip, concurrent writers and leases run through it.

PgBouncer comes from Debian's ``pgbouncer`` package (``.ci/run`` installs it when missing). It
is started by the fixture, as the ``postgres`` user (it refuses to run as root), on a free port,
in front of a fresh database. Off CI a missing binary or server skips; under CI=true it fails.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stashpoint.stores.base import MetadataStore
from stashpoint.testing.conformance import MetadataStoreConformance
from stashpoint.testing.engine import EngineConformance

from .test_postgres import BASE_URL, _server_or_skip

UNDER_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def bouncer() -> Iterator[str]:
    """URL of a fresh database reached through PgBouncer (transaction pooling)."""
    _server_or_skip()
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )
    if binary is None:
        if UNDER_CI:
            pytest.fail("pgbouncer is required under CI (Debian package pgbouncer)")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    import psycopg

    db = "sp_bouncer_" + uuid.uuid4().hex[:10]
    with psycopg.connect(BASE_URL, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    info = psycopg.conninfo.conninfo_to_dict(BASE_URL)
    host, port = info.get("host", "127.0.0.1"), info.get("port", "5432")
    user = info.get("user", "postgres")
    # Not under pytest's 0700 temp root: the bouncer runs as another user and must read it.
    work = Path(tempfile.mkdtemp(prefix="sp-pgbouncer-"))
    work.chmod(0o777)
    listen = _free_port()
    (work / "users.txt").write_text(f'"{user}" ""\n')
    (work / "pgbouncer.ini").write_text(
        f"[databases]\n{db} = host={host} port={port} dbname={db} user={user}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {work / 'users.txt'}\n"
        "pool_mode = transaction\ndefault_pool_size = 3\nmax_client_conn = 200\n"
        f"logfile = {work / 'pgbouncer.log'}\npidfile = {work / 'pgbouncer.pid'}\n"
    )
    for f in work.iterdir():
        f.chmod(0o666)
    cmd = [binary, str(work / "pgbouncer.ini")]
    if os.geteuid() == 0:
        cmd[1:1] = ["-u", "postgres"]  # PgBouncer will not run as root
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"postgresql://{user}@127.0.0.1:{listen}/{db}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.Error:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (
                        (work / "pgbouncer.log").read_text()
                        if (work / "pgbouncer.log").exists()
                        else ""
                    )
                    err = (
                        proc.stderr.read().decode()
                        if proc.stderr and proc.poll() is not None
                        else ""
                    )
                    pytest.fail(f"pgbouncer did not start: {err}{log[-2000:]}")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()
        with psycopg.connect(BASE_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def fresh(bouncer: str) -> Iterator[str]:
    """An empty store behind the bouncer: the tables are dropped after each test."""
    yield bouncer
    import psycopg

    with psycopg.connect(bouncer, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")


class TestStoreBehindPgBouncer(MetadataStoreConformance):
    @pytest.fixture
    def make_store(self, fresh: str) -> Callable[[], MetadataStore]:
        from stashpoint.stores.postgres import PostgresStore

        return lambda: PostgresStore(fresh)


class TestEngineBehindPgBouncer(EngineConformance):
    @pytest.fixture
    def store_url(self, fresh: str) -> str:
        return fresh
