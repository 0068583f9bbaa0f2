"""Encryption at rest: AES-256-GCM over stored payloads, bound to where they belong.

One 32-byte master key (``$STASHPOINT_KEY``, ``$STASHPOINT_KEY_FILE`` or ``encryption_key=``)
is never used directly: HKDF-SHA256 derives the AES key, the MAC key of the hash chain (so an
encrypted store is always keyed, :class:`stashpoint.integrity.ChainHasher`) and a public key id.

Every ciphertext is ``MAGIC | key id (8) | nonce (12) | AES-GCM(data) + tag`` and is
authenticated together with *associated data* naming its place: a record's id, session, branch
and parent; a log entry's log id and index; a blob's content digest. A ciphertext copied to
another row therefore fails to decrypt (IntegrityError), as does a plaintext row slipped into an
encrypted store (no MAGIC) and a row sealed under another key.

Why random 96-bit nonces and not a counter: writers are many processes on many hosts with no
shared counter; random nonces are safe for far more than the 2**32 payloads per key NIST allows,
which is more than a store will see. Rotate by exporting a bundle and importing it into a store
opened with the new key.

What is *not* hidden (see docs/security.md): blobs stay addressed by the SHA-256 of their
plaintext so dedup keeps working, which lets someone holding the store confirm that it contains a
content they can guess (a known file, a short value); sizes, counts, timestamps in ids, session,
branch and label names, and the store's index columns are in the clear.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
from pathlib import Path

from . import config
from .errors import EncryptionKeyError, IntegrityError, StashpointWarning, UsageError

__all__ = [
    "KEY_ENV",
    "KEY_FILE_ENV",
    "Cipher",
    "EncryptionKeyError",
    "generate_key",
    "key_from_env",
    "parse_key",
]

KEY_ENV = "STASHPOINT_KEY"
KEY_FILE_ENV = "STASHPOINT_KEY_FILE"
MAGIC = b"SPE\x01"
_KEY_ID_LEN = 8
_NONCE_LEN = 12
_HEADER_LEN = len(MAGIC) + _KEY_ID_LEN + _NONCE_LEN
_TAG_LEN = 16
_TEXT = re.compile(rb"[\x20-\x7e\t\n\r\f\v]*")
"""Printable ASCII and whitespace: 32 bytes of it are typed text, not a raw random key."""


def _import_aead() -> tuple[type, type, type]:
    try:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise UsageError(
            "encryption needs the 'cryptography' package: pip install 'stashpoint[encryption]'"
        ) from exc
    return AESGCM, HKDF, hashes.SHA256


def _derive(key: bytes, purpose: bytes) -> bytes:
    _aes, hkdf, sha256 = _import_aead()
    out: bytes = hkdf(
        algorithm=sha256(), length=32, salt=None, info=b"stashpoint " + purpose
    ).derive(key)
    return out


class Cipher:
    """AES-256-GCM with associated data; one per open store."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise UsageError(f"an encryption key is 32 bytes, not {len(key)}")
        aes, _hkdf, _sha = _import_aead()
        self._aead = aes(_derive(key, b"aes-256-gcm v1"))
        self.mac_key = _derive(key, b"chain mac v1")
        """Key of the HMAC hash chain: encryption always brings keyed integrity."""
        self._id = _derive(key, b"key id v1")[:_KEY_ID_LEN]
        self.key_id = self._id.hex()
        """Public name of the key (recorded in store meta and every ciphertext header)."""

    def seal(self, data: bytes, aad: bytes) -> bytes:
        head = MAGIC + self._id + os.urandom(_NONCE_LEN)
        return head + bytes(self._aead.encrypt(head[-_NONCE_LEN:], data, head[:-_NONCE_LEN] + aad))

    def open(self, data: bytes, aad: bytes, what: str) -> bytes:
        """Decrypt ``data`` stored as ``what``; any mismatch is an IntegrityError naming it."""
        if len(data) < _HEADER_LEN + _TAG_LEN or not data.startswith(MAGIC):
            raise IntegrityError(
                f"{what} is stored unencrypted in an encrypted store (refused: it may have been "
                "planted by someone without the key)"
            )
        kid = data[len(MAGIC) : len(MAGIC) + _KEY_ID_LEN]
        if kid != self._id:
            raise IntegrityError(
                f"{what} was encrypted under key id {kid.hex()}, not this store's {self.key_id}"
            )
        from cryptography.exceptions import InvalidTag

        try:
            out: bytes = self._aead.decrypt(
                data[_HEADER_LEN - _NONCE_LEN : _HEADER_LEN],
                data[_HEADER_LEN:],
                data[: _HEADER_LEN - _NONCE_LEN] + aad,
            )
        except InvalidTag:
            raise IntegrityError(
                f"{what} fails authentication: it was altered or moved from another row"
            ) from None
        return out


def parse_key(text: str | bytes, source: str = KEY_ENV) -> bytes:
    """A 32-byte key from 64 hex digits or base64 of 32 bytes (standard or URL-safe, padding
    optional), surrounding whitespace allowed; as ``bytes``, also exactly 32 raw bytes.

    One rule for ``$STASHPOINT_KEY`` and ``$STASHPOINT_KEY_FILE``. Raw bytes are taken only as
    written (nothing stripped) and never when they are printable text: a 32-character
    passphrase, or 16 bytes in hex with its newline stripped, is not 32 random bytes.
    """
    if isinstance(text, bytes):
        if len(text) == 32 and _TEXT.fullmatch(text) is None:
            return text
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            raise UsageError(
                f"{source}: not a key: {len(text)} bytes, neither 32 raw bytes nor text "
                "(a key is 32 random bytes, raw or written as 64 hex digits or base64)"
            ) from None
    text = text.strip()
    if len(text) == 64:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass
    b64 = text.replace("-", "+").replace("_", "/")
    try:
        raw = base64.b64decode(b64 + "=" * (-len(b64) % 4), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise UsageError(
            f"{source}: not a key ({len(text)} characters): a key is 32 random bytes written as "
            "64 hex digits or base64 (make one with `stashpoint init --new-key FILE`)"
        )
    return raw


def key_from_env() -> bytes | None:
    """The key named by ``$STASHPOINT_KEY`` or ``$STASHPOINT_KEY_FILE``, if either is set.

    A key file readable or writable by group or others draws a warning (chmod 600 it).
    """
    return _key_from(config.KEY, config.KEY_FILE, KEY_ENV, KEY_FILE_ENV)


def integrity_key_from_env() -> bytes | None:
    """The hash chain's key named by ``$STASHPOINT_INTEGRITY_KEY`` or
    ``$STASHPOINT_INTEGRITY_KEY_FILE``, if either is set (same rules as the encryption key)."""
    return _key_from(
        config.INTEGRITY_KEY,
        config.INTEGRITY_KEY_FILE,
        "STASHPOINT_INTEGRITY_KEY",
        "STASHPOINT_INTEGRITY_KEY_FILE",
    )


def _key_from(
    setting: config.Setting, file_setting: config.Setting, env: str, file_env: str
) -> bytes | None:
    value = config.value(setting)
    if value:
        return parse_key(value, env)
    path = config.value(file_setting)
    if path:
        try:
            with Path(path).expanduser().open("rb") as f:
                mode = os.fstat(f.fileno()).st_mode
                data = f.read()
        except OSError as exc:
            raise UsageError(f"{file_env}: cannot read {path}: {exc.strerror}") from exc
        key = parse_key(data, f"{file_env} {path}")
        if os.name == "posix" and mode & 0o077:
            import warnings

            warnings.warn(
                f"{file_env} {path} is accessible to other users (mode "
                f"{mode & 0o777:o}); restrict it with `chmod 600 {path}`",
                StashpointWarning,
                stacklevel=3,
            )
        return key
    return None


def integrity_key_id(key: bytes) -> str:
    """A name for a hash-chain key that reveals nothing of it: recorded in the store so a
    missing or wrong key is told apart from damaged records."""
    import hashlib
    import hmac

    return hmac.new(key, b"stashpoint integrity key id", hashlib.sha256).hexdigest()[:16]


def generate_key() -> str:
    """A new random key, hex-encoded (what ``$STASHPOINT_KEY`` takes)."""
    return secrets.token_hex(32)
