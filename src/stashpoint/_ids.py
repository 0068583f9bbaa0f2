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
_PAIR_SHIFTS = tuple(range(120, -10, -10))
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
    value = (ms << 80) | (rand & ((1 << 80) - 1))
    # 130 bits as 13 pairs of base-32 digits (10 bits each, from a table): ~15k CPU
    # instructions, where a loop over the 26 digits took ~34k (base64.b32encode, pure Python
    # in 3.11, ~28k), once per checkpoint.
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _PAIR_SHIFTS])


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
