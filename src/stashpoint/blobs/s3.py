"""Blobs in an S3-compatible bucket: the same objects as the local directory, over HTTP.

What goes here is what a local store keeps as files: 1 MiB chunks of large files (one object
each, ``PREFIX/chunks/ab/cd/<sha256>``) and packs of small blobs written in bulk
(``PREFIX/packs/<id>.pack``, read back with ranged GETs). Everything else stays in the
metadata store, so a checkpoint of a few small edits costs no request at all.

Why it is safe with the store's commit order: a PUT is durable once S3 answers it, and the
record that refers to an object is committed only after that. Every PUT carries the body's
SHA-256 (``ChecksumSHA256``), so the server rejects a body damaged on the way; every GET is
checked against the content digest by :class:`~stashpoint.blobs.objects.Blobs`, so a
tampered object is an :class:`IntegrityError`, never silently used.

GC: a bucket is shared by processes on many machines, so GC can never know it holds the store
alone (:meth:`S3BlobStore.exclusive` says no) and condemned objects wait out the grace period
(or ``gc --grace 0``), as with PostgreSQL.

Configuration is boto3's own (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``, profiles), plus ``STASHPOINT_S3_ENDPOINT`` for an
S3-compatible server (MinIO, Ceph, R2 ...), which wins over ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import base64
import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from .. import config as settings
from ..errors import IntegrityError, PackMissing, StoreError, UsageError

__all__ = ["S3BlobStore", "parse_s3_url"]

_MAGIC = b"SPB1"  # same object layout as a local chunk file
_NAME = re.compile(r"[0-9a-f]{64}")
_PACK_MAGIC = b"SPPACK1\n"
_PACK_NAME = re.compile(r"[0-9A-Z]{26}")
_PACK_CACHE_BYTES = 128 << 20
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, key prefix without slashes at either end) of ``s3://bucket/prefix``."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not _BUCKET.fullmatch(parts.netloc or ""):
        raise UsageError(
            f"bad blob URL {url!r}: expected s3://BUCKET/PREFIX (bucket: 3-63 lower-case "
            "letters, digits, dots, dashes)"
        )
    if parts.query or parts.fragment:
        raise UsageError(f"bad blob URL {url!r}: no query or fragment is allowed")
    return parts.netloc, parts.path.strip("/")


def _client() -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise UsageError("S3 blobs need boto3: pip install 'stashpoint[s3]'") from None
    from botocore.exceptions import BotoCoreError, ProfileNotFound

    endpoint = settings.value(settings.S3_ENDPOINT)
    region = settings.value(settings.S3_REGION)
    config = Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=16)
    # A bad endpoint, profile or region is configuration, not a crash: name it, no traceback.
    try:
        return boto3.session.Session().client(
            "s3", endpoint_url=endpoint or None, region_name=region, config=config
        )
    except ValueError as exc:  # botocore: "Invalid endpoint: 127.0.0.1:1" (no scheme ...)
        where = "STASHPOINT_S3_ENDPOINT / AWS_ENDPOINT_URL" if endpoint else "the AWS settings"
        raise UsageError(f"cannot set up the S3 client: {exc}; check {where}") from None
    except ProfileNotFound as exc:
        raise UsageError(f"cannot set up the S3 client: {exc}; check AWS_PROFILE") from None
    except BotoCoreError as exc:
        raise StoreError(f"cannot set up the S3 client: {exc}") from exc


def _total_size(content_range: object) -> int | None:
    """The object size in a ranged GET's ``Content-Range: bytes 0-99/1234`` (None: unknown)."""
    _span, _, total = str(content_range or "").rpartition("/")
    return int(total) if total.isdigit() else None


class _PreconditionFailed(Exception):
    """A conditional write found the object there already."""


class S3BlobStore:
    """The blob-backend interface of :class:`~stashpoint.blobs.local.LocalBlobStore`, on S3."""

    def __init__(self, url: str, *, client: Any = None) -> None:
        self.url = url
        self.bucket, prefix = parse_s3_url(url)
        self.prefix = f"{prefix}/" if prefix else ""
        self.before_put: Callable[[bytes], None] | None = None
        """Called with a digest before it is stored (revives a condemned chunk first)."""
        self._s3 = client if client is not None else _client()
        self._lock = threading.Lock()
        self._packs: OrderedDict[str, bytes] = OrderedDict()  # whole packs, least recent first
        self._cached = 0
        # Packs read once -> their object size, None while unknown: a second read fetches a
        # pack whole only when it fits the cache, else every read of it would download it all.
        self._sizes: dict[str, int | None] = {}
        from botocore.exceptions import BotoCoreError, ClientError

        self._errors: tuple[type[Exception], ...] = (BotoCoreError, ClientError)
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except self._errors as exc:
            raise StoreError(f"cannot reach S3 bucket {self.bucket!r}: {exc}") from exc

    # -- plumbing ---------------------------------------------------------------------------
    def _key(self, digest: bytes) -> str:
        h = digest.hex()
        return f"{self.prefix}chunks/{h[:2]}/{h[2:4]}/{h}"

    def _pack_key(self, name: str) -> str:
        if not _PACK_NAME.fullmatch(name):
            raise IntegrityError(f"invalid pack name {name!r}")
        return f"{self.prefix}packs/{name}.pack"

    @staticmethod
    def _missing(exc: Exception) -> bool:
        code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
        return code in ("404", "NoSuchKey", "NotFound")

    def _fail(self, what: str, exc: Exception) -> StoreError:
        return StoreError(f"S3 {what} in s3://{self.bucket}/{self.prefix} failed: {exc}")

    def _put(self, key: str, body: bytes, *, if_absent: bool = False) -> None:
        """Write an object; ``if_absent``: only if there is none (else _PreconditionFailed;
        a server that does not know the condition gets the plain write)."""
        checksum = base64.b64encode(hashlib.sha256(body).digest()).decode()
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": body}
        args["ChecksumSHA256"] = checksum
        if if_absent:
            args["IfNoneMatch"] = "*"
        try:
            self._s3.put_object(**args)
        except self._errors as exc:
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if if_absent and code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                raise _PreconditionFailed(key) from exc
            if if_absent and code in ("NotImplemented", "501"):
                self._put(key, body)
                return
            raise self._fail(f"PUT {key}", exc) from exc

    def _head_size(self, key: str) -> int | None:
        try:
            return int(self._s3.head_object(Bucket=self.bucket, Key=key)["ContentLength"])
        except self._errors as exc:
            if self._missing(exc):
                return None
            raise self._fail(f"HEAD {key}", exc) from exc

    def _delete(self, key: str) -> int:
        size = self._head_size(key)
        if size is None:
            return 0
        try:
            self._s3.delete_object(Bucket=self.bucket, Key=key)
        except self._errors as exc:
            raise self._fail(f"DELETE {key}", exc) from exc
        return size

    def _list(self, under: str) -> Iterator[dict[str, Any]]:
        try:
            pages = self._s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + under
            )
            for page in pages:
                yield from page.get("Contents", [])
        except self._errors as exc:
            raise self._fail(f"LIST {under}", exc) from exc

    def claim(self, store_id: str) -> None:
        """Mark the prefix as this store's, or refuse one another store uses: a GC lists every
        object under the prefix and deletes those *its* records do not reference, so two
        stores sharing a prefix would delete each other's blobs.

        The mark is written only if absent (``If-None-Match: *``, which AWS S3, MinIO and
        SeaweedFS honour): two stores created on one prefix at once cannot both claim it. A
        server that refuses the condition gets a plain write, as before it existed."""
        key = f"{self.prefix}stashpoint-store"
        owner = self._owner(key)
        if owner is None:
            owner = store_id
            try:
                self._put(key, store_id.encode(), if_absent=True)
            except _PreconditionFailed:
                owner = self._owner(key) or ""  # another store's mark got there first
        if owner.strip() != store_id:
            raise UsageError(
                f"s3://{self.bucket}/{self.prefix} holds the blobs of another store "
                f"({owner.strip()[:40]}); give each store its own prefix"
            )

    def _owner(self, key: str) -> str | None:
        try:
            return str(self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode())
        except self._errors as exc:
            if self._missing(exc):
                return None
            raise self._fail(f"GET {key}", exc) from exc

    # -- the backend interface --------------------------------------------------------------
    @contextmanager
    def exclusive(self, attempts: int = 1, pause: float = 0.1) -> Iterator[bool]:
        """Never: other machines may have the bucket open, and S3 has no lock to ask."""
        yield False

    def close(self) -> None:
        """Nothing to release: S3 holds no lock for us."""

    def has(self, digest: bytes) -> bool:
        return self._head_size(self._key(digest)) is not None

    def put(
        self, digest: bytes, codec: int, size: int, data: bytes, *, revive: bool = True
    ) -> None:
        if revive and self.before_put is not None:
            self.before_put(digest)  # revive first: a GC then cannot delete what we reuse
        header = _MAGIC + bytes([codec]) + size.to_bytes(8, "big")
        self._put(self._key(digest), header + data)  # idempotent: same digest, same content

    def get(self, digest: bytes) -> tuple[int, int, bytes] | None:
        """(codec, size, data), or None when absent; a malformed object is an IntegrityError."""
        key = self._key(digest)
        try:
            raw = self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except self._errors as exc:
            if self._missing(exc):
                return None
            raise self._fail(f"GET {key}", exc) from exc
        if len(raw) < 13 or raw[:4] != _MAGIC:
            raise IntegrityError(f"blob {digest.hex()} is corrupt: bad header")
        return raw[4], int.from_bytes(raw[5:13], "big"), raw[13:]

    def size(self, digest: bytes) -> int | None:
        return self._head_size(self._key(digest))

    def delete(self, digest: bytes) -> int:
        """Remove a chunk object; returns the bytes freed (0 if it was gone)."""
        return self._delete(self._key(digest))

    def iter_sizes(self) -> Iterator[tuple[bytes, int]]:
        """(digest, object size) of every chunk object."""
        for obj in self._list("chunks/"):
            name = str(obj["Key"]).rsplit("/", 1)[-1]
            if _NAME.fullmatch(name):
                yield bytes.fromhex(name), int(obj["Size"])

    def __iter__(self) -> Iterator[bytes]:
        for digest, _size in self.iter_sizes():
            yield digest

    # -- packs ------------------------------------------------------------------------------
    def write_pack(self, name: str, parts: list[bytes]) -> list[tuple[int, int]]:
        """Write ``parts`` into a new pack object; returns (offset, length) of each."""
        spans = []
        offset = len(_PACK_MAGIC)
        for part in parts:
            spans.append((offset, len(part)))
            offset += len(part)
        self._put(self._pack_key(name), b"".join([_PACK_MAGIC, *parts]))
        return spans

    def read_packed(self, name: str, offset: int, length: int) -> bytes:
        """One entry of a pack. The first read of a pack is a ranged GET; a second one fetches
        the whole pack and keeps it (packs are immutable, entries are verified by digest), so
        a restore or export of N packed files costs about two requests per pack, not N. A pack
        too big for the cache is never fetched whole again: its entries stay ranged GETs."""
        key = self._pack_key(name)
        if length == 0:
            return b""
        with self._lock:
            whole = self._packs.get(name)
            if whole is not None:
                self._packs.move_to_end(name)
            seen = name in self._sizes
            size = self._sizes.get(name)
            fetch = whole is None and seen and (size is None or self._cacheable(size))
        if whole is None and fetch:
            whole = self._fetch_pack(name, key)
        if whole is not None:
            data = whole[offset : offset + length]
            if len(data) != length:
                raise IntegrityError(f"pack {name} is truncated")
            return data
        try:
            obj = self._s3.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}"
            )
            data = bytes(obj["Body"].read())
        except self._errors as exc:
            if self._missing(exc):
                raise PackMissing(f"pack {name} is missing") from None
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code == "InvalidRange":
                raise IntegrityError(f"pack {name} is truncated") from None
            raise self._fail(f"GET {key}", exc) from exc
        with self._lock:
            if self._sizes.get(name) is None:
                self._sizes[name] = _total_size(obj.get("ContentRange"))
        if len(data) != length:
            raise IntegrityError(f"pack {name} is truncated")
        return data

    @staticmethod
    def _cacheable(size: int) -> bool:
        return size <= _PACK_CACHE_BYTES // 4

    def _fetch_pack(self, name: str, key: str) -> bytes | None:
        try:
            whole = bytes(self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except self._errors as exc:
            if self._missing(exc):
                raise PackMissing(f"pack {name} is missing") from None
            raise self._fail(f"GET {key}", exc) from exc
        with self._lock:
            self._sizes[name] = len(whole)  # too big: the next reads of it are ranged
            if not self._cacheable(len(whole)):
                return whole  # used for this read only
            self._packs[name] = whole
            self._cached += len(whole)
            while self._cached > _PACK_CACHE_BYTES:
                _old, dropped = self._packs.popitem(last=False)
                self._cached -= len(dropped)
        return whole

    def packs(self) -> dict[str, tuple[int, float]]:
        """Pack name -> (object size, last-modified time) of every pack object."""
        out: dict[str, tuple[int, float]] = {}
        for obj in self._list("packs/"):
            stem, _, ext = str(obj["Key"]).rsplit("/", 1)[-1].partition(".")
            if ext == "pack" and _PACK_NAME.fullmatch(stem):
                out[stem] = (int(obj["Size"]), obj["LastModified"].timestamp())
        return out

    def delete_pack(self, name: str) -> int:
        """Remove a pack object; returns the bytes freed (0 if it was gone)."""
        with self._lock:
            dropped = self._packs.pop(name, None)
            self._cached -= len(dropped) if dropped is not None else 0
            self._sizes.pop(name, None)
        return self._delete(self._pack_key(name))
