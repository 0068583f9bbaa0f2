"""Redis metadata store (redis-py): fast shared state for short-lived or cache-like deployments.

Every commit runs as one Lua script, so the head compare-and-set, the log-tip check and all the
writes are atomic on the server. Durability is Redis's own: with the default RDB snapshots a
crash of the *server* can lose recent checkpoints (whole ones: the script is atomic). Use
``appendonly yes`` with ``appendfsync always`` for fsync-per-checkpoint durability, or
``everysec`` to lose at most a second.

Layout, all under one key prefix (default ``sp:``): ``meta`` hash; ``blob:<hex>`` strings
(codec byte + 8-byte size + data); ``log:<id>`` hashes and ``msgs:<id>`` hashes of index ->
chain + data; ``cp:<id>`` hashes; ``cps:<session>`` and ``cpids`` sorted sets (lexicographic,
ids sort by time); ``heads:<session>``, ``labels:<session>`` hashes; ``sessions``, ``logs`` sets;
``pruned:<session>`` hashes (id -> time) and the ``condemned`` hash (digest hex -> time) for
retention and garbage collection.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import parse_qs

from ..errors import ConflictError, LeaseHeld, PrunedError, StoreError, UsageError
from . import redis_lua as lua
from .base import (
    GC_EPOCH_KEY,
    BlobInfo,
    BlobRow,
    CheckpointRow,
    Commit,
    Fence,
    GcEpochChanged,
    LeaseInfo,
    LogAppend,
    LogInfo,
    MessageRow,
    MetadataStore,
    lease_held,
    lease_lost,
)

__all__ = ["RedisStore"]


def _driver() -> Any:
    try:
        import redis
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UsageError("the Redis store needs redis-py: pip install 'stashpoint[redis]'") from exc
    return redis


def _pack(b: BlobRow) -> bytes:
    return bytes([b.codec]) + b.size.to_bytes(8, "big") + b.data


class RedisStore(MetadataStore):
    atomic_unlink = False

    def __init__(self, url: str) -> None:
        super().__init__()
        redis = _driver()
        base, _, query = url.partition("?")
        self.prefix = (parse_qs(query).get("prefix", ["sp:"])[0]).encode()
        # Only our own parameter comes out: the rest (db, timeouts, ...) are redis-py's.
        rest = [q for q in query.split("&") if q and q.partition("=")[0] != "prefix"]
        clean = base + "?" + "&".join(rest) if rest else base
        self.url = url
        self.durability = "as the Redis server persists (AOF appendfsync, or RDB snapshots)"
        self._errors = redis.exceptions
        try:
            self._r = redis.Redis.from_url(clean)
            self._r.ping()
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"cannot connect to Redis: {exc}") from exc
        except (TypeError, ValueError) as exc:  # a query parameter redis-py does not take
            raise UsageError(f"bad Redis URL parameter: {exc}") from exc
        self._has_blobs = self._r.register_script(lua.HAS_BLOBS)
        self._commit = self._r.register_script(lua.COMMIT)
        self._set_head = self._r.register_script(lua.SET_HEAD)
        self._append = self._r.register_script(lua.APPEND)
        self._sweep = self._r.register_script(lua.SWEEP)
        self._prune = self._r.register_script(lua.PRUNE)
        self._repoint = self._r.register_script(lua.REPOINT)
        self._lease = self._r.register_script(lua.LEASE)
        self._renew = self._r.register_script(lua.RENEW)
        self._lease_info = self._r.register_script(lua.LEASE_INFO)
        self._swap_meta = self._r.register_script(lua.SWAP_META)

    def _k(self, *parts: str | bytes) -> bytes:
        return self.prefix + b"".join(p.encode() if isinstance(p, str) else p for p in parts)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except self._errors.RedisError as exc:
            raise StoreError(f"Redis failed: {exc}") from exc

    def _scan_blobs(self) -> Iterator[bytes]:
        """Every blob key. SCAN MATCH is a glob, so the prefix's own glob characters are
        escaped (prefix ``a?:`` must not list ``ab:``'s blobs); errors mapped as in ``_call``,
        which a lazy scan would escape."""
        match = re.sub(rb"([*?\[\]\\])", rb"\\\1", self.prefix) + b"blob:*"
        try:
            yield from self._r.scan_iter(match=match, count=1000)
        except self._errors.RedisError as exc:
            raise StoreError(f"Redis failed: {exc}") from exc

    # -- meta -----------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        v = self._call(self._r.hget, self._k("meta"), key)
        return None if v is None else v.decode()

    def set_meta(self, key: str, value: str | None) -> None:
        if value is None:
            self._call(self._r.hdel, self._k("meta"), key)
        else:
            self._call(self._r.hset, self._k("meta"), key, value)

    def swap_meta(self, key: str, expected: str | None, value: str | None) -> bool:
        args = [key, "0" if expected is None else "1", expected or ""]
        args += ["0" if value is None else "1", value or ""]
        return bool(self._call(self._swap_meta, keys=[self._k("meta")], args=args) == 1)

    # -- blobs ----------------------------------------------------------------------------
    def has_blobs(self, digests: Iterable[bytes]) -> set[bytes]:
        wanted = list(digests)
        if not wanted:
            return set()
        found: set[bytes] = set()
        for i in range(0, len(wanted), 500):
            batch = wanted[i : i + 500]
            got = self._call(self._has_blobs, args=[self.prefix, *(d.hex() for d in batch)])
            found.update(d for d, ok in zip(batch, got, strict=True) if ok)
        return found

    def put_blobs(self, blobs: Sequence[BlobRow]) -> None:
        pipe = self._r.pipeline(transaction=True)  # MULTI: revival and insert are atomic
        for b in blobs:
            pipe.hdel(self._k("condemned"), b.digest.hex())
            pipe.set(self._k("blob:", b.digest.hex()), _pack(b), nx=True)
        self._call(pipe.execute)

    def get_blob(self, digest: bytes) -> BlobRow | None:
        raw = self._call(self._r.get, self._k("blob:", digest.hex()))
        if raw is None:
            return None
        return BlobRow(digest, raw[0], int.from_bytes(raw[1:9], "big"), raw[9:])

    def iter_blob_digests(self) -> Iterator[bytes]:
        skip = len(self._k("blob:"))
        for key in self._scan_blobs():
            yield bytes.fromhex(key[skip:].decode())

    # -- logs -----------------------------------------------------------------------------
    def log_info(self, log: str) -> LogInfo | None:
        h = self._call(self._r.hgetall, self._k("log:", log))
        if not h:
            return None
        n = self._call(self._r.hlen, self._k("msgs:", log))
        parent = h[b"parent"].decode() or None
        plen = int(h[b"parent_len"])
        return LogInfo(h[b"session"].decode(), parent, plen, plen + n)

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        if stop <= start:
            return []
        fields = [str(i) for i in range(start, stop)]
        values = self._call(self._r.hmget, self._k("msgs:", log), fields)
        return [
            MessageRow(start + i, v[:32], v[32:]) for i, v in enumerate(values) if v is not None
        ]

    def iter_logs(self) -> Iterator[tuple[str, LogInfo]]:
        for raw in self._call(self._r.smembers, self._k("logs")):
            info = self.log_info(raw.decode())
            if info is not None:
                yield raw.decode(), info

    def append_log(self, append: LogAppend) -> None:
        a, new = append, append.new
        result = self._call(
            self._append,
            args=[
                self.prefix,
                a.log,
                a.start,
                "1" if new is not None else "0",
                new.session if new is not None else "",
                (new.parent or "") if new is not None else "",
                new.parent_len if new is not None else 0,
                *self._fence_args(a.fence, a.session),
                *(chain + data for chain, data in a.messages),
            ],
        )
        self._raise_if_fenced(result, a.fence, a.session or "")
        if result != b"ok":
            raise ConflictError(
                f"append to log {a.log} lost a race ({result.decode()}); another writer appended"
            )

    # -- checkpoints ----------------------------------------------------------------------
    def commit(self, commit: Commit) -> None:
        r, a = commit.row, commit.append
        msgs = list(a.messages) if a is not None else []
        args: list[Any] = [
            self.prefix,
            r.id,
            r.session,
            r.branch,
            r.parent or "",
            r.body,
            r.digest,
            "1" if commit.move_head else "0",
            commit.expected_head or "",
            a.log if a is not None else "",
            a.start if a is not None else 0,
            "1" if a is not None and a.new is not None else "0",
            (a.new.parent or "") if a is not None and a.new is not None else "",
            a.new.parent_len if a is not None and a.new is not None else 0,
            len(msgs),
            len(commit.blobs),
            "1" if commit.gc_epoch is not None else "0",
            commit.gc_epoch or "",
            *self._fence_args(commit.fence),
            *(chain + data for chain, data in msgs),
        ]
        for b in commit.blobs:
            args += [b.digest.hex(), _pack(b)]
        args.append(commit.head_auth or "")
        result = self._call(self._commit, args=args)
        self._raise_if_fenced(result, commit.fence, r.session)
        if result == b"conflict:gc_epoch":
            raise GcEpochChanged(
                f"a garbage collection began after checkpoint {r.id} checked which blobs "
                "exist; snapshot again"
            )
        if result != b"ok":
            raise ConflictError(
                f"commit of {r.id} lost a race ({result.decode()}); another writer got there first"
            )
        self.writers.end()

    def get_checkpoint(self, ident: str) -> CheckpointRow | None:
        h = self._call(self._r.hgetall, self._k("cp:", ident))
        return _row(ident, h) if h else None

    def list_checkpoints(
        self, session: str, *, before: str | None = None, limit: int | None = None
    ) -> list[CheckpointRow]:
        top = b"(" + before.encode() if before is not None else b"+"
        ids = self._call(
            self._r.zrevrangebylex,
            self._k("cps:", session),
            top,
            b"-",
            start=0 if limit is not None else None,
            num=limit,
        )
        pipe = self._r.pipeline(transaction=False)
        for i in ids:
            pipe.hgetall(self._k("cp:", i))
        rows = self._call(pipe.execute)
        return [_row(i.decode(), h) for i, h in zip(ids, rows, strict=True) if h]

    def find_ids(self, prefix: str, session: str | None = None) -> list[str]:
        key = self._k("cpids") if session is None else self._k("cps:", session)
        lo = b"[" + prefix.encode()
        hi = b"(" + prefix.encode() + b"\xff"
        ids = self._call(self._r.zrangebylex, key, lo, hi, start=0, num=5)
        return [i.decode() for i in ids]

    def sessions(self) -> list[str]:
        return sorted(s.decode() for s in self._call(self._r.smembers, self._k("sessions")))

    # -- heads and labels -----------------------------------------------------------------
    def branches(self, session: str) -> dict[str, str]:
        h = self._call(self._r.hgetall, self._k("heads:", session))
        return {b.decode(): c.decode() for b, c in h.items()}

    ref_auth = True  # in headauth:<session>, labelauth:<session>, written with the ref

    def head_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        pipe = self._r.pipeline(transaction=True)
        pipe.hgetall(self._k("heads:", session))
        pipe.hgetall(self._k("headauth:", session))
        heads, auths = self._call(pipe.execute)
        return {
            b.decode(): (c.decode(), a.decode() if (a := auths.get(b)) is not None else None)
            for b, c in heads.items()
        }

    def set_head(
        self,
        session: str,
        branch: str,
        new: str,
        expected: str | None,
        *,
        fence: Fence | None = None,
        auth: str | None = None,
    ) -> None:
        ok = self._call(
            self._set_head,
            keys=[
                self._k("heads:", session),
                self._k("sessions"),
                self._k("pruned:", session),
                self._k("headauth:", session),
            ],
            args=[
                branch,
                new,
                expected or "",
                session,
                *self._fence_args(fence),
                self._k("lease:", session),
                auth or "",
            ],
        )
        if ok == -1 and fence is not None:
            raise lease_lost(fence, self._token(fence.session))
        if ok == -2:
            info = self.lease_info(session)
            raise lease_held(session, info.owner if info else "?", info.expires_in if info else 0)
        if ok == -3:
            raise PrunedError(new, self.pruned(session).get(new))
        if not ok:
            raise ConflictError(
                f"branch {branch!r} of session {session!r} moved (expected {expected}); "
                "another writer got there first"
            )

    # -- leases (clock: the Redis server's TIME) --------------------------------------------
    def _fence_args(
        self, fence: Fence | None, unfenced: str | None = None
    ) -> tuple[bytes | str, str]:
        """(lease key, token); without a fence, the key of the session an unfenced write must
        not race a live lease on (``unfenced``), or nothing to check."""
        if fence is None:
            return (self._k("lease:", unfenced), "") if unfenced else ("", "")
        return self._k("lease:", fence.session), str(fence.token)

    def _token(self, session: str) -> int | None:
        got = self._call(self._r.hget, self._k("lease:", session), "token")
        return None if got is None else int(got)

    def _raise_if_fenced(self, result: bytes, fence: Fence | None, session: str = "") -> None:
        if fence is not None and result.startswith(b"lease:"):
            raise lease_lost(fence, self._token(fence.session))
        if result.startswith(b"held:"):
            holder, _, left = result[5:].decode().rpartition(":")
            raise lease_held(session, holder, int(left) / 1000)

    def acquire_lease(self, session: str, owner: str, ttl: float) -> LeaseInfo:
        status, holder, token, left = self._call(
            self._lease, args=[self._k("lease:", session), owner, max(1, int(ttl * 1000))]
        )
        if status == b"held":
            raise LeaseHeld(
                f"session {session!r} is leased by {holder.decode()} for another "
                f"{left / 1000:.1f} s",
                owner=holder.decode(),
                expires_in=left / 1000,
            )
        return LeaseInfo(session, holder.decode(), int(token), left / 1000)

    def renew_lease(self, fence: Fence, ttl: float) -> bool:
        key = self._k("lease:", fence.session)
        return bool(self._call(self._renew, args=[key, fence.token, max(1, int(ttl * 1000))]))

    def release_lease(self, fence: Fence) -> None:
        self._call(self._renew, args=[self._k("lease:", fence.session), fence.token, -1])

    def lease_info(self, session: str) -> LeaseInfo | None:
        got = self._call(self._lease_info, args=[self._k("lease:", session)])
        if not got:
            return None
        return LeaseInfo(session, got[0].decode(), int(got[1]), int(got[2]) / 1000)

    def set_label(
        self, ident: str, session: str, label: str | None, auth: str | None = None
    ) -> None:
        pipe = self._r.pipeline(transaction=True)  # MULTI: the label and its auth together
        if label is not None:
            pipe.hset(self._k("labels:", session), ident, label)
        else:
            pipe.hdel(self._k("labels:", session), ident)
        if label is not None and auth:
            pipe.hset(self._k("labelauth:", session), ident, auth)
        else:
            pipe.hdel(self._k("labelauth:", session), ident)
        self._call(pipe.execute)

    def label_rows(self, session: str) -> dict[str, tuple[str, str | None]]:
        pipe = self._r.pipeline(transaction=True)
        pipe.hgetall(self._k("labels:", session))
        pipe.hgetall(self._k("labelauth:", session))
        labels, auths = self._call(pipe.execute)
        return {
            i.decode(): (lab.decode(), a.decode() if (a := auths.get(i)) is not None else None)
            for i, lab in labels.items()
        }

    def labels(self, session: str) -> dict[str, str]:
        h = self._call(self._r.hgetall, self._k("labels:", session))
        return {i.decode(): lab.decode() for i, lab in h.items()}

    # -- maintenance ----------------------------------------------------------------------
    def iter_checkpoints(self) -> Iterator[CheckpointRow]:
        ids = self._call(self._r.zrangebylex, self._k("cpids"), b"-", b"+")
        for i in range(0, len(ids), 500):
            batch = ids[i : i + 500]
            pipe = self._r.pipeline(transaction=False)
            for ident in batch:
                pipe.hgetall(self._k("cp:", ident))
            rows = self._call(pipe.execute)
            for ident, h in zip(batch, rows, strict=True):
                if h:
                    yield _row(ident.decode(), h)

    def iter_meta(self, prefix: str) -> Iterator[tuple[str, str]]:
        items = self._call(self._r.hgetall, self._k("meta"))
        for k, v in sorted(items.items()):
            key = k.decode()
            if key.startswith(prefix):
                yield key, v.decode()

    def iter_blob_info(self) -> Iterator[BlobInfo]:
        skip = len(self._k("blob:"))
        keys = list(self._scan_blobs())
        for i in range(0, len(keys), 500):
            batch = keys[i : i + 500]
            pipe = self._r.pipeline(transaction=False)
            for key in batch:
                pipe.getrange(key, 0, 8)
                pipe.strlen(key)
            got = self._call(pipe.execute)
            need_ref = []
            for j, key in enumerate(batch):
                head, total = got[2 * j], int(got[2 * j + 1])
                if len(head) < 9:
                    continue  # deleted meanwhile
                digest = bytes.fromhex(key[skip:].decode())
                codec, size = head[0], int.from_bytes(head[1:9], "big")
                if codec in (2, 3):
                    need_ref.append((key, digest, codec, size, total - 9))
                else:
                    yield BlobInfo(digest, codec, size, total - 9, None)
            if need_ref:
                pipe = self._r.pipeline(transaction=False)
                for key, *_ in need_ref:
                    pipe.getrange(key, 9, -1)
                refs = self._call(pipe.execute)
                for (_key, digest, codec, size, stored), ref in zip(need_ref, refs, strict=True):
                    yield BlobInfo(digest, codec, size, stored, bytes(ref))

    def log_sizes(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        logs = [raw.decode() for raw in self._call(self._r.smembers, self._k("logs"))]
        for log in logs:
            values = self._call(self._r.hvals, self._k("msgs:", log))
            if values:
                out[log] = (len(values), sum(len(v) for v in values))
        return out

    def mark_pruned(self, session: str, ids: Sequence[str], at: str) -> list[str]:
        if not ids:
            return []
        got = self._call(self._prune, args=[self.prefix, session, at, *ids])
        if got and got[0].startswith(b"held:"):
            self._raise_if_fenced(got[0], None, session)
        return [i.decode() for i in got]

    def pruned(self, session: str) -> dict[str, str]:
        h = self._call(self._r.hgetall, self._k("pruned:", session))
        return {i.decode(): at.decode() for i, at in h.items()}

    def condemn(self, digests: Sequence[bytes], at: float, epoch: str | None = None) -> None:
        pipe = self._r.pipeline(transaction=True)
        for d in digests:
            pipe.hsetnx(self._k("condemned"), d.hex(), repr(at))
        if epoch is not None:
            pipe.hset(self._k("meta"), GC_EPOCH_KEY, epoch)
        self._call(pipe.execute)

    def condemned(self) -> dict[bytes, float]:
        h = self._call(self._r.hgetall, self._k("condemned"))
        return {bytes.fromhex(d.decode()): float(at) for d, at in h.items()}

    def condemned_among(self, digests: Iterable[bytes]) -> set[bytes]:
        wanted = list(digests)
        if not wanted:
            return set()
        marks = self._call(self._r.hmget, self._k("condemned"), [d.hex() for d in wanted])
        return {d for d, mark in zip(wanted, marks, strict=True) if mark is not None}

    def revive(self, digests: Sequence[bytes]) -> set[bytes]:
        if not digests:
            return set()
        pipe = self._r.pipeline(transaction=True)
        for d in digests:
            pipe.hdel(self._k("condemned"), d.hex())
        done = self._call(pipe.execute)
        return {d for d, n in zip(digests, done, strict=True) if n}

    def sweep_blobs(
        self,
        digests: Sequence[bytes],
        before: float,
        unlink: Callable[[list[bytes]], None] | None = None,
    ) -> list[bytes]:
        """Atomic per batch (one script). A Python ``unlink`` cannot run inside a script, so
        a Redis store refuses one: it keeps every blob in Redis (no local chunk directory)."""
        if unlink is not None:
            raise UsageError("a Redis store keeps every blob in Redis; it cannot unlink files")
        claimed: list[bytes] = []
        for i in range(0, len(digests), 500):
            batch = [d.hex() for d in digests[i : i + 500]]
            got = self._call(self._sweep, args=[self.prefix, repr(before), *batch])
            claimed += [bytes.fromhex(h.decode()) for h in got]
        return claimed

    def delete_logs(self, logs: Sequence[str]) -> None:
        if not logs:
            return
        pipe = self._r.pipeline(transaction=True)
        for log in logs:
            pipe.delete(self._k("log:", log), self._k("msgs:", log))
            pipe.srem(self._k("logs"), log)
        self._call(pipe.execute)

    def repoint_blobs(self, changes: Sequence[tuple[bytes, bytes, bytes]]) -> int:
        if not changes:
            return 0
        args: list[Any] = [self.prefix]
        for digest, old, new in changes:
            args += [digest.hex(), old, new]
        return int(self._call(self._repoint, args=args))

    def close(self) -> None:
        self._r.close()


def _row(ident: str, h: dict[bytes, bytes]) -> CheckpointRow:
    parent = h[b"parent"].decode() or None
    return CheckpointRow(
        ident,
        h[b"session"].decode(),
        h[b"branch"].decode(),
        parent,
        h[b"body"],
        h[b"digest"].decode(),
    )
