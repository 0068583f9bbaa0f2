"""Time-sortable identifiers (ULID layout: 48-bit milliseconds + 80 random bits, Crockford base32).

Ids sort by creation time as plain strings, so listing newest-first needs no extra column, and
ids made within the same millisecond by one process stay ordered: the next random part is the
previous one plus a random step of one to two units of the 12th character (not plus one, as
the ULID spec suggests), so the 12-character prefixes the CLI shows still tell apart ids made
in the same millisecond - up to ~500 of them, then the next id waits for the next millisecond.
(Drawing each uniformly above the last ran out of room after ~10: an import of 44 records
showed 38 of them under one short id.)
"""

from __future__ import annotations

import os
import random
import re
import threading
import time

from .errors import UsageError

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [_ALPHABET[i >> 5] + _ALPHABET[i & 31] for i in range(1024)]
_ID_RE = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")
_lock = threading.Lock()
_last_ms = -1
_last_rand = 0
_MAX_RAND = (1 << 80) - 1
_STEP = 1 << 70  # one unit of the 12th character: the last one the CLI's short ids show
# Ids need uniqueness, not secrecy: a seeded PRNG costs 0.3 µs where os.urandom costs ~10 µs
# (a syscall per checkpoint). Reseeded after fork so parent and child never share a sequence.
_rng = random.Random(os.urandom(32))
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _rng.seed(os.urandom(32)))


def new_id() -> str:
    """A new 26-character id, strictly increasing within this process."""
    global _last_ms, _last_rand
    with _lock:
        while True:
            ms = time.time_ns() // 1_000_000
            fresh = _rng.getrandbits(80)
            if ms > _last_ms:
                rand = fresh
                break
            if _MAX_RAND - _last_rand > 2 * _STEP:  # else this millisecond is used up
                ms, rand = _last_ms, _last_rand + _STEP + fresh % _STEP
                break
            time.sleep(0.0002)
        _last_ms, _last_rand = ms, rand
    return _time_part(ms) + _rand_part(rand)


_prefix: tuple[int, str] = (-1, "")
"""The last millisecond encoded and its 10 characters (a checkpoint loop reuses them)."""


def _time_part(ms: int) -> str:
    """The 48-bit milliseconds as the id's first 10 characters (5 pairs of base-32 digits)."""
    global _prefix
    last, text = _prefix
    if ms != last:
        p = _PAIRS
        text = p[ms >> 40] + p[(ms >> 30) & 1023] + p[(ms >> 20) & 1023]
        text += p[(ms >> 10) & 1023] + p[ms & 1023]
        _prefix = (ms, text)
    return text


def _rand_part(rand: int) -> str:
    """The 80 random bits as the id's last 16 characters: two 40-bit halves of 4 pairs each.
    Why halves: shifting and masking a 130-bit value took ~20k CPU instructions per id (each
    operation makes a new multi-digit int); these ints fit in two digits."""
    hi, lo = rand >> 40 & 0xFFFFFFFFFF, rand & 0xFFFFFFFFFF
    p = _PAIRS
    return "".join(
        (
            p[hi >> 30],
            p[hi >> 20 & 1023],
            p[hi >> 10 & 1023],
            p[hi & 1023],
            p[lo >> 30],
            p[lo >> 20 & 1023],
            p[lo >> 10 & 1023],
            p[lo & 1023],
        )
    )


def is_id(text: str) -> bool:
    return _ID_RE.fullmatch(text) is not None


def id_time_ms(ident: str) -> int:
    """Milliseconds since the epoch encoded in an id."""
    value = 0
    for ch in ident[:10]:
        value = value * 32 + _ALPHABET.index(ch)
    return value


def check_name(kind: str, name: str) -> None:
    """Names are stored as text by every backend: one that is empty, holds NUL or is not
    valid Unicode (a stray byte from a command line) is refused here, with a clear error."""
    if not name:
        raise UsageError(f"a {kind} needs a non-empty name")
    if "\0" in name:
        raise UsageError(f"a {kind} name cannot contain NUL: {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"a {kind} name must be valid Unicode: {name!r}") from None
