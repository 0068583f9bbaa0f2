"""Encrypted message logs: a wrapper that seals every log entry on its way into any backend.

Conversations and durable-execution journals are read and appended in many places (session,
durable runs, verify, bundles, the LangGraph saver); sealing them here, at the one interface they
all go through, means none of those places can forget to. Each entry is bound to its log id and
index (AES-GCM associated data), so an entry copied to another position fails to decrypt. The
running hash chain is computed over the plaintext above this layer, as without encryption.

Every store meta value is sealed too (bound to its key, stored as ``sealed:<base64>``), so a
feature that adds a meta key is encrypted without knowing about encryption. The exceptions are
the few keys :data:`stashpoint.metakeys.PLAINTEXT` names - ``gc_epoch``, the encryption marker,
the durability level, the store id, the blob location: read before the key is known or
compared by a backend inside a transaction, and holding no application state. A value an
older version wrote in plaintext (it sealed only :data:`~stashpoint.metakeys.SEALED_ALWAYS`)
is still read, told apart by the envelope, and sealed when next written; under the prefixes
every version sealed, plaintext is refused.

Records and blobs are sealed elsewhere (:class:`stashpoint.integrity.ChainHasher`,
:class:`stashpoint.blobs.Blobs`), where their identity is known; everything else passes through.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Iterator

from ..crypto import Cipher
from ..errors import IntegrityError
from ..metakeys import PLAINTEXT, SEALED_ALWAYS
from .base import Commit, LogAppend, MessageRow, MetadataStore
from .forwarding import ForwardingStore

__all__ = ["EncryptedLogs"]


_SEALED_PREFIX = "sealed:"


def _aad(log: str, idx: int) -> bytes:
    return f"log\0{log}\0{idx}".encode()


class EncryptedLogs(ForwardingStore):
    """A :class:`MetadataStore` whose log entries and meta values (all but
    :data:`~stashpoint.metakeys.PLAINTEXT`) are stored as AES-GCM ciphertext; every other call
    passes through to the backend."""

    def __init__(self, inner: MetadataStore, cipher: Cipher) -> None:
        super().__init__(inner)
        self.cipher = cipher

    # -- the sealed part ------------------------------------------------------------------
    def _seal(self, append: LogAppend) -> LogAppend:
        msgs = [
            (chain, self.cipher.seal(data, _aad(append.log, append.start + i)))
            for i, (chain, data) in enumerate(append.messages)
        ]
        return dataclasses.replace(append, messages=msgs)

    def append_log(self, append: LogAppend) -> None:
        self.inner.append_log(self._seal(append))

    def commit(self, commit: Commit) -> None:
        if commit.append is not None:
            commit = dataclasses.replace(commit, append=self._seal(commit.append))
        self.inner.commit(commit)

    def read_messages(self, log: str, start: int, stop: int) -> list[MessageRow]:
        return [
            MessageRow(
                r.idx,
                r.chain,
                self.cipher.open(r.data, _aad(log, r.idx), f"message {r.idx} of log {log}"),
            )
            for r in self.inner.read_messages(log, start, stop)
        ]

    def set_meta(self, key: str, value: str | None) -> None:
        self.inner.set_meta(key, self._seal_meta(key, value))

    def swap_meta(self, key: str, expected: str | None, value: str | None) -> bool:
        """The backend compares what it stores, and sealing the expected value again would
        not give those bytes (a fresh nonce each time): the stored form is read, opened and
        compared here, then swapped for the new one - one more read than a plain store."""
        if key in PLAINTEXT:
            return self.inner.swap_meta(key, expected, value)
        stored = None
        if expected is not None:
            stored = self.inner.get_meta(key)
            if self._open_meta(key, stored) != expected:
                return False
        return self.inner.swap_meta(key, stored, self._seal_meta(key, value))

    def _seal_meta(self, key: str, value: str | None) -> str | None:
        if value is None or key in PLAINTEXT:
            return value
        sealed = self.cipher.seal(value.encode(), b"meta\0" + key.encode())
        return _SEALED_PREFIX + base64.b64encode(sealed).decode("ascii")

    def get_meta(self, key: str) -> str | None:
        return self._open_meta(key, self.inner.get_meta(key))

    def iter_meta(self, prefix: str) -> Iterator[tuple[str, str]]:
        for key, value in self.inner.iter_meta(prefix):
            opened = self._open_meta(key, value)
            assert opened is not None
            yield key, opened

    def _open_meta(self, key: str, value: str | None) -> str | None:
        if value is None or key in PLAINTEXT:
            return value
        what = f"store setting {key!r}"
        if not value.startswith(_SEALED_PREFIX):
            if key.startswith(SEALED_ALWAYS):
                raise IntegrityError(
                    f"{what} is stored unencrypted in an encrypted store (refused)"
                )
            return value  # written by a version that left it plaintext; sealed when next set
        try:
            raw = base64.b64decode(value[len(_SEALED_PREFIX) :], validate=True)
        except (binascii.Error, ValueError):
            raise IntegrityError(f"{what} is corrupt: bad encoding") from None
        return self.cipher.open(raw, b"meta\0" + key.encode(), what).decode()
