"""Copy sessions between stores of any kind (``stashpoint copy``).

A copy is an export to a private temporary bundle followed by an import, session by session,
so it obeys every rule a bundle does, with no second implementation to keep in step: records
are read back verified from the source, the bundle is checked whole before the destination is
touched, writes go blobs -> logs -> records -> heads, records already there (same id, same
digest) are skipped (a re-run is idempotent and finishes an interrupted one), and a record,
log or branch that the destination holds with other contents refuses the copy with a
:class:`~stashpoint.errors.ConflictError` (exit 3). Then the copied sessions are verified in
the destination as ``stashpoint verify`` would (an :class:`IntegrityError`, exit 2, if not).

The temporary bundle (one session at a time) is a file with no name in ``TMPDIR``: the kernel
frees it when the copy ends, however it ends, so a killed copy leaves nothing to sweep. When
either store is encrypted, the bundle is also sealed on its way to the file (AES-CTR under a
random key that only this process ever holds): an encrypted store's contents never reach a
disk, or memory outside the process, unencrypted. Its integrity needs no MAC of its own: every
byte read back is checked against the bundle's SHA-256 digests, as an imported bundle is.

Carried: checkpoints with their hash chain, branch heads, labels, pruned marks, conversation
and journal logs, and every blob they reference. Not carried: stat caches, GC marks, and the
journal entries of a live durable run after its last checkpoint (export warns about those).
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._fsutil import TMP_MARK
from ._store import Problem, Store
from .bundle import TRUSTED, _Exporter, import_bundle, kill_point, read_bundle_from
from .errors import ClashError as Clash
from .errors import ConflictError, IntegrityError, NotFoundError, StoreError, UsageError
from .urls import printable_url

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = ["CopyReport", "copy_sessions"]

Progress = Callable[[int, int], None]


@dataclass
class CopyReport:
    source: str
    dest: str
    sessions: list[str] = field(default_factory=list)
    checkpoints: int = 0
    """Records written to the destination."""
    present: int = 0
    """Records the destination already had (same id and digest): skipped."""
    blobs: int = 0
    """Objects written (trees, blobs, chunks, chunk lists)."""
    blobs_present: int = 0
    bytes: int = 0
    """Bytes of content written."""
    heads: dict[str, dict[str, dict[str, str | None]]] = field(default_factory=dict)
    """Session -> branch -> {"head", "action"} (created, fast-forward, unchanged, kept)."""
    verified: bool = False
    problems: list[Problem] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "problems"}
        out["problems"] = [p.to_dict() for p in self.problems]
        return out


def copy_sessions(
    source: Store,
    dest: Store,
    *,
    sessions: list[str] | None = None,
    as_session: str | None = None,
    progress: Progress | None = None,
) -> CopyReport:
    """Copy ``sessions`` (default: every session with checkpoints) from ``source`` to
    ``dest``, then verify them there; see the module docstring for the rules.

    ``as_session``: copy the one session given as a new session of that name, its records
    sealed again under the destination's key, with new ids (each keeps its original id and
    digest in its meta). This is how a session moves between stores whose hash chains are
    sealed under different keys: a plain and an encrypted store, or two keys."""
    if source.id == dest.id:
        raise ConflictError("source and destination are the same store")
    if as_session is not None and (sessions is None or len(set(sessions)) != 1):
        raise UsageError("copying as a new session (--as NAME) needs exactly one --session")
    if as_session is None and not source.hasher.same_key(dest.hasher):
        # A keyed chain verifies only under its own key: the copy would be refused as forged
        # after the export, in words about a bundle the user never asked for.
        have, want = ("an HMAC key" if h.keyed else "no key" for h in (source.hasher, dest.hasher))
        raise UsageError(
            f"{printable_url(source.url)} seals its hash chain with {have} and "
            f"{printable_url(dest.url)} with {want if want != have else 'another key'}: "
            "its checkpoints would not verify there. Copy a session as a new one instead "
            "(--session S --as NEW): its records are sealed again under the destination's "
            "key, with new ids"
        )
    names = sessions if sessions is not None else source.sessions()
    names = [n for n in dict.fromkeys(names) if sessions is not None or _has_records(source, n)]
    shown = printable_url(source.url)  # error messages end up in logs: never a password
    for name in names:
        if not _has_records(source, name):
            raise NotFoundError(f"session {name!r} has no checkpoints in {shown}")
    if not names:
        raise NotFoundError(f"{shown} has no sessions with checkpoints to copy")
    report = CopyReport(shown, printable_url(dest.url))
    done = 0
    sealed = source.cipher is not None or dest.cipher is not None
    for name in names:
        base = done

        def step(n: int, nbytes: int, base: int = base) -> None:
            if progress is not None:
                progress(base + n, nbytes)

        ex = _Exporter(source, name, step)
        rows = ex.select(None)
        tmp = _TempBundle(sealed)
        try:
            ex.write(tmp.writer, rows, None)
            tmp.writer.flush()
        except OSError as exc:
            tmp.close()
            raise StoreError(
                f"cannot write the temporary bundle for session {name!r} in "
                f"{tempfile.gettempdir()}: {exc.strerror or exc}; set TMPDIR to a place with room"
            ) from exc
        except BaseException:
            tmp.close()
            raise
        kill_point("copy-exported")
        # Checked under the key it was sealed with; sealed again on import when renamed.
        hasher = dest.hasher if as_session is None else source.hasher.plain()
        with read_bundle_from(
            tmp, tmp.size, f"the temporary bundle of {name!r}", hasher=hasher, limits=TRUSTED
        ) as b:
            try:
                rep = import_bundle(dest, b, as_session=as_session, progress=step)
            except Clash as exc:
                raise ConflictError(
                    f"copying session {name!r}: {exc}".replace("refusing bundle: ", "")
                ) from None
        report.sessions.append(as_session or name)
        report.checkpoints += rep.checkpoints
        report.present += rep.present
        report.blobs += rep.objects
        report.blobs_present += rep.objects_present
        report.bytes += rep.bytes
        report.heads[as_session or name] = rep.heads
        done += rep.objects
    report.problems = _verify(dest, report.sessions, progress)
    report.verified = not report.problems
    return report


class _Keystream:
    """AES-256-CTR under a key made for one temporary bundle and never stored: what a killed
    copy leaves on a disk (a file's freed blocks) cannot be read. CTR because the bundle is
    read back at any offset; integrity comes from the bundle's own digests."""

    def __init__(self) -> None:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        self._cipher, self._algorithms, self._modes = Cipher, algorithms, modes
        self._key = os.urandom(32)
        self._iv = int.from_bytes(os.urandom(16), "big")
        self._writing = self._at(0)
        self._reading = self._at(0)

    def _at(self, offset: int) -> Any:
        block, _skip = divmod(offset, 16)
        counter = ((self._iv + block) % (1 << 128)).to_bytes(16, "big")
        return self._cipher(self._algorithms.AES(self._key), self._modes.CTR(counter)).encryptor()

    def seal_next(self, data: bytes) -> bytes:
        """The next bytes written, in file order."""
        out: bytes = self._writing.update(data)
        return out

    def open_next(self, data: bytes) -> bytes:
        """The next bytes read in file order (a separate stream from the writes)."""
        out: bytes = self._reading.update(data)
        return out

    def open_at(self, data: bytes, offset: int) -> bytes:
        skip = offset % 16
        out: bytes = self._at(offset).update(bytes(skip) + data)
        return out[skip:]


class _TempBundle(io.RawIOBase):
    """The bundle a copy goes through: a file with no name (``O_TMPFILE``; elsewhere created
    and unlinked at once), sealed when ``sealed``. Written through :attr:`writer`, then read
    as a :class:`~stashpoint.bundle.BundleSource`; closing it frees the file."""

    def __init__(self, sealed: bool) -> None:
        super().__init__()
        # Closed by close(), which the bundle reading it calls (or the copy, on an error).
        self._file = tempfile.TemporaryFile(prefix=TMP_MARK, buffering=0)  # noqa: SIM115
        self._fd = self._file.fileno()
        self._keys = _Keystream() if sealed else None
        self.size = 0
        """Bytes written."""
        self._pos = 0
        """Bytes of the file read (and opened) so far, in order."""
        self._buf = b""
        self._off = 0
        """Where the next read starts in ``_buf``."""
        self.writer = io.BufferedWriter(self, buffer_size=1 << 20)

    # -- writing (through self.writer) --------------------------------------------------
    def writable(self) -> bool:
        return True

    def write(self, b: ReadableBuffer, /) -> int:
        data = bytes(b)
        out = self._keys.seal_next(data) if self._keys is not None else data
        view = memoryview(out)
        while view:
            view = view[os.pwrite(self._fd, view, self.size + len(out) - len(view)) :]
        self.size += len(data)
        return len(data)

    # -- reading (BundleSource) ---------------------------------------------------------
    def read(self, n: int = -1, /) -> bytes:
        if n < 0:
            n = self.size
        while len(self._buf) - self._off < n and self._pos < self.size:
            raw = os.pread(self._fd, max(n, 1 << 20), self._pos)
            if not raw:
                break
            self._pos += len(raw)
            plain = self._keys.open_next(raw) if self._keys is not None else raw
            self._buf, self._off = self._buf[self._off :] + plain, 0
        out = self._buf[self._off : self._off + n]
        self._off += len(out)
        return out

    def pread(self, n: int, offset: int) -> bytes:
        raw = os.pread(self._fd, n, offset)
        return self._keys.open_at(raw, offset) if self._keys is not None else raw

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()


def _has_records(store: Store, name: str) -> bool:
    return bool(store.meta.list_checkpoints(name, limit=1))


def _verify(store: Store, sessions: list[str], progress: Progress | None) -> list[Problem]:
    """``stashpoint verify`` limited to the copied sessions (others are not ours to judge)."""
    from .verify import _Verifier

    v = _Verifier(store, progress)
    for name in sessions:
        v.session(name)
    return v.report.problems


def raise_if_unverified(report: CopyReport) -> None:
    """Exit 2 for a copy that does not verify in its destination (the CLI's rule)."""
    if not report.verified:
        first = report.problems[0].message if report.problems else "unknown problem"
        raise IntegrityError(
            f"the copy does not verify in {report.dest}: {first} "
            f"({len(report.problems)} problem(s); run stashpoint verify there)"
        )
