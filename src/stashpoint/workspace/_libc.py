"""The C library, through ctypes, for the two calls Python's ``os`` does not make: inotify
(watch mode) and ``renameat2`` (a restore's exchange of a file for its new content)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ctypes

__all__ = ["libc"]

_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL | None:
    """libc (Linux only), loaded on first use: ctypes and its ``find_library`` (which imports
    shutil, subprocess and tempfile, and runs ``ldconfig``) would cost every CLI run ~6 ms."""
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        import ctypes

        try:
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)  # glibc
        except OSError:
            import ctypes.util

            name = ctypes.util.find_library("c")  # musl and others
            try:
                _libc = ctypes.CDLL(name, use_errno=True) if name else None
            except OSError:
                return None
    return _libc
