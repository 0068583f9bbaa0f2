"""Unified diffs of files between two snapshots; binary files are summarised."""

from __future__ import annotations

import difflib

from .blobs.objects import Blobs
from .workspace.tree import Change

__all__ = ["file_diff"]

_MAX_TEXT = 2 << 20


def _text(blobs: Blobs, kind: str, ref: bytes, size: int) -> list[str] | None:
    if kind == "l":
        return [f"-> {ref.decode('utf-8', 'replace')}\n"]
    if kind != "f":
        return []
    if size > _MAX_TEXT:
        return None
    data = blobs.read(ref)
    if b"\0" in data[:8192]:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # Lines end at "\n" only, as diff -u and patch see them (str.splitlines also breaks at
    # form feeds, lone "\r" and U+2028, and then marks lines as missing their newline).
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def file_diff(blobs: Blobs, change: Change, path: str) -> str:
    old, new = change.old, change.new
    header = f"--- a/{path}\n+++ b/{path}\n"
    if change.status == "mode" and old is not None and new is not None:
        return f"mode {path}: {oct(old.mode)} -> {oct(new.mode)}\n"
    if (old is not None and old.kind == "d") or (new is not None and new.kind == "d"):
        return f"{change.status} directory {path}\n"
    a = _text(blobs, old.kind, old.ref, old.size) if old is not None else []
    b = _text(blobs, new.kind, new.ref, new.size) if new is not None else []
    if a is None or b is None:
        old_size = old.size if old is not None else 0
        new_size = new.size if new is not None else 0
        return f"Binary file {path} {change.status} ({old_size} -> {new_size} bytes)\n"
    lines = list(difflib.unified_diff(a, b, f"a/{path}", f"b/{path}"))
    if not lines:
        return header
    out = "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )
    return out
