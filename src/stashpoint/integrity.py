"""Canonical encoding of checkpoint records and the hash chain over them.

The canonical form is JSON with sorted keys and the ``digest`` field emptied; the digest is
SHA-256 over a domain prefix plus that form. Because the form contains ``parent_digest``, a
record's digest commits to its whole ancestry. With a key (kept outside the store) the digest
becomes HMAC-SHA256, so someone who can write the store cannot re-hash a forged chain.

With a cipher (an encrypted store, :mod:`stashpoint.crypto`) the stored body is the canonical
form sealed with AES-GCM, bound to the checkpoint id; the digest is still computed over the
plaintext form, so a bundle (which carries plaintext bodies) verifies under the same key.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING

import msgspec

from .errors import IntegrityError, SchemaVersionError
from .model import FORMAT_VERSION, Checkpoint

if TYPE_CHECKING:
    from .crypto import Cipher

__all__ = ["ChainHasher", "blob_digest", "canonical_body", "message_chain"]

_DOMAIN = b"stashpoint-checkpoint-v1\n"
_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(Checkpoint)
EMPTY_CHAIN = "0" * 64


def blob_digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def message_chain(prev_hex: str, encoded_message: bytes) -> str:
    """Next link of a conversation's running hash: H(prev || message)."""
    return hashlib.sha256(bytes.fromhex(prev_hex) + encoded_message).hexdigest()


def message_links(prev_hex: str, encoded: list[bytes]) -> tuple[list[tuple[bytes, bytes]], str]:
    """:func:`message_chain` over several messages: ``(link, message)`` rows and the last
    link in hex (``prev_hex`` for none). The links stay in bytes between messages: a
    checkpoint appending two messages pays no hex round trip per link."""
    rows = []
    link = bytes.fromhex(prev_hex)
    sha256 = hashlib.sha256
    for data in encoded:
        link = sha256(link + data).digest()
        rows.append((link, data))
    return rows, link.hex() if rows else prev_hex


def canonical_body(cp: Checkpoint) -> bytes:
    return _encoder.encode(cp if cp.digest == "" else msgspec.structs.replace(cp, digest=""))


class ChainHasher:
    """Seals and opens checkpoint records; keyed (HMAC) when given a key."""

    def __init__(self, key: bytes | None = None, cipher: Cipher | None = None) -> None:
        self._key = key
        self.cipher = cipher
        # The MAC's state after the key and the domain prefix, copied for each record: a
        # fresh HMAC sets up the key (two compressions and a digest lookup) every time, ~30 %
        # of its CPU on a record's few hundred bytes.
        self._mac = hmac.new(key, _DOMAIN, hashlib.sha256) if key is not None else None

    def plain(self) -> ChainHasher:
        """The same MAC without the cipher: for bundles, which carry plaintext bodies."""
        return ChainHasher(self._key) if self.cipher is not None else self

    def store_body(self, ident: str, body: bytes) -> bytes:
        """What to store for a plaintext canonical body (sealed when the store is encrypted)."""
        if self.cipher is None:
            return body
        return self.cipher.seal(body, b"record\0" + ident.encode())

    def plain_body(self, ident: str, stored: bytes) -> bytes:
        """The canonical body of a stored record (IntegrityError if it will not decrypt)."""
        if self.cipher is None:
            return stored
        try:
            return self.cipher.open(stored, b"record\0" + ident.encode(), f"checkpoint {ident}")
        except IntegrityError as exc:
            raise IntegrityError(str(exc), checkpoint=ident) from None

    @property
    def keyed(self) -> bool:
        return self._key is not None

    def same_key(self, other: ChainHasher) -> bool:
        """Whether ``other`` seals records as this one does (both unkeyed, or the same key):
        only then does a record sealed by one verify under the other."""
        if self._key is None or other._key is None:
            return self._key is other._key
        return hmac.compare_digest(self._key, other._key)

    def digest(self, body: bytes) -> str:
        if self._mac is not None:
            mac = self._mac.copy()
            mac.update(body)
            return mac.hexdigest()
        return hashlib.sha256(_DOMAIN + body).hexdigest()

    def seal(self, cp: Checkpoint) -> tuple[Checkpoint, bytes]:
        """Return the record with its digest set, and the body bytes to store."""
        body = canonical_body(cp)
        return msgspec.structs.replace(cp, digest=self.digest(body)), self.store_body(cp.id, body)

    def open(self, ident: str, body: bytes, digest: str) -> Checkpoint:
        """Verify and decode a stored record; any mismatch names the checkpoint."""
        body = self.plain_body(ident, body)
        if not hmac.compare_digest(self.digest(body), digest):
            raise IntegrityError(
                f"checkpoint {ident} is corrupt: its record does not match its digest",
                checkpoint=ident,
            )
        try:
            cp = _decoder.decode(body)
        except msgspec.DecodeError as exc:
            raise IntegrityError(f"checkpoint {ident} is corrupt: {exc}", checkpoint=ident) from exc
        if cp.format > FORMAT_VERSION:
            raise SchemaVersionError(
                f"checkpoint {ident} has record format {cp.format}; this stashpoint reads "
                f"up to {FORMAT_VERSION}: upgrade stashpoint"
            )
        if cp.id != ident or cp.digest != "":
            raise IntegrityError(
                f"checkpoint {ident} is corrupt: the record names another checkpoint",
                checkpoint=ident,
            )
        return msgspec.structs.replace(cp, digest=digest)
