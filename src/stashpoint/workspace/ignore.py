"""Ignore rules: ``.gitignore`` and ``.stashpointignore`` at any depth, with git's semantics.

Rules are evaluated per directory, deepest file first; the first file with a matching pattern
decides (so a nested ``!keep.log`` re-includes what a parent ignored). A directory that is
ignored is pruned whole, as in git. ``.git`` at any depth and the store itself are always out.

Each directory also gets a *signature*: a hash of every ignore file that applies to it. When the
signature matches the stat cache's, names already known to be included skip pattern matching,
so a steady-state scan of 10k files does almost no regex work.
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["ALWAYS_EXCLUDED", "IGNORE_FILES", "IgnoreContext"]

IGNORE_FILES = (b".gitignore", b".stashpointignore")
ALWAYS_EXCLUDED = frozenset({b".git", b".stashpoint"})

_spec_cache: dict[bytes, Any] = {}


def _compile(text: bytes) -> Any:
    spec = _spec_cache.get(text)
    if spec is None:
        import pathspec  # imported lazily: it costs ~40 ms, and most snapshots need no matching

        lines = text.decode("utf-8", "surrogateescape").splitlines()
        spec = pathspec.GitIgnoreSpec.from_lines(lines)
        _spec_cache[text] = spec
    return spec


class IgnoreContext:
    """The ignore rules in force in one directory."""

    __slots__ = ("_layers", "signature")

    def __init__(self, layers: tuple[tuple[bytes, Any], ...], signature: bytes) -> None:
        self._layers = layers  # (directory relpath with trailing slash, compiled spec)
        self.signature = signature

    @classmethod
    def root(cls) -> IgnoreContext:
        return cls((), b"")

    def child(self, rel_dir: bytes, ignore_texts: list[bytes]) -> IgnoreContext:
        """The context for directory ``rel_dir`` given its own ignore files' contents."""
        if not ignore_texts:
            return self
        prefix = rel_dir + b"/" if rel_dir else b""
        text = b"\n".join(ignore_texts)
        sig = hashlib.sha256(self.signature + b"\0" + prefix + b"\0" + text).digest()
        return IgnoreContext((*self._layers, (prefix, _compile(text))), sig)

    @property
    def empty(self) -> bool:
        return not self._layers

    def ignored(self, rel: bytes, is_dir: bool) -> bool:
        for prefix, spec in reversed(self._layers):
            if not rel.startswith(prefix):  # b"" prefixes every path (the root's rules)
                continue
            path = rel[len(prefix) :].decode("utf-8", "surrogateescape") + ("/" if is_dir else "")
            result = spec.check_file(path)
            if result.include is not None:
                return bool(result.include)
        return False
