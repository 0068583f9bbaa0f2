"""Operator corrections to a checkpoint's state: ``--set PATH=VALUE`` and JSON Patch.

Pure functions over plain data: they never touch the store, so a bad edit fails before
anything is written. Paths are JSON Pointers (RFC 6901: ``/plan/steps/0``) or, for typing
convenience, dotted paths (``plan.steps.0``). In both, a list index is ``0`` or ASCII digits
without a leading zero (RFC 6901), and ``-`` is the end of the list where an item is added.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import (
    UsageError,
    ValidationError,
)

__all__ = ["ValidationError", "apply_patch", "parse_assignment", "set_path", "split_path"]


def split_path(path: str) -> list[str]:
    if path.startswith("/"):
        return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]
    if not path or path == ".":
        return []
    return path.split(".")


def parse_assignment(text: str) -> tuple[list[str], Any]:
    """``PATH=VALUE``; VALUE is JSON when it parses as JSON, else a plain string."""
    path, sep, raw = text.partition("=")
    if not sep or not path:
        raise UsageError(f"--set wants PATH=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return split_path(path), value


def _child(container: Any, key: str, path: Sequence[str]) -> Any:
    if isinstance(container, Mapping):
        if key not in container:
            raise UsageError(f"{_show(path)}: no key {key!r}")
        return container[key]
    if isinstance(container, list):
        return container[_index(container, key, path, allow_end=False)]
    raise UsageError(f"{_show(path)}: cannot descend into a {type(container).__name__}")


def _index(items: list[Any], key: str, path: Sequence[str], *, allow_end: bool) -> int:
    if allow_end and key == "-":
        return len(items)
    # RFC 6901: "0" or ASCII digits without a leading zero (str.isdigit also accepts "²")
    if not (key.isascii() and key.isdigit()) or (len(key) > 1 and key[0] == "0"):
        raise UsageError(f"{_show(path)}: {key!r} is not a list index")
    i = int(key)
    if i > len(items) or (i == len(items) and not allow_end):
        raise UsageError(f"{_show(path)}: index {i} is out of range (length {len(items)})")
    return i


def _show(path: Sequence[str]) -> str:
    return "/" + "/".join(path)


def _parent(doc: Any, path: Sequence[str]) -> Any:
    if not path:
        raise UsageError("the whole state cannot be the target of this operation")
    target = doc
    for i, key in enumerate(path[:-1]):
        target = _child(target, key, path[: i + 1])
    return target


def set_path(doc: dict[str, Any], path: Sequence[str], value: Any, *, create: bool = True) -> None:
    """Replace (or add, for a new key / list end ``-``) the value at ``path``, in place."""
    parent = _parent(doc, path)
    key = path[-1]
    if isinstance(parent, dict):
        if not create and key not in parent:
            raise UsageError(f"{_show(path)}: no key {key!r} to replace")
        parent[key] = value
    elif isinstance(parent, list):
        i = _index(parent, key, path, allow_end=create)
        if i == len(parent):
            parent.append(value)
        else:
            parent[i] = value
    else:
        raise UsageError(f"{_show(path)}: cannot set inside a {type(parent).__name__}")


def _remove(doc: dict[str, Any], path: Sequence[str]) -> Any:
    parent = _parent(doc, path)
    key = path[-1]
    if isinstance(parent, dict):
        if key not in parent:
            raise UsageError(f"{_show(path)}: no key {key!r} to remove")
        return parent.pop(key)
    if isinstance(parent, list):
        return parent.pop(_index(parent, key, path, allow_end=False))
    raise UsageError(f"{_show(path)}: cannot remove from a {type(parent).__name__}")


def _add(doc: dict[str, Any], path: Sequence[str], value: Any) -> None:
    parent = _parent(doc, path)
    if isinstance(parent, list):
        parent.insert(_index(parent, path[-1], path, allow_end=True), value)
    else:
        set_path(doc, path, value)


def _get(doc: Any, path: Sequence[str]) -> Any:
    target = doc
    for i, key in enumerate(path):
        target = _child(target, key, path[: i + 1])
    return target


def apply_patch(doc: dict[str, Any], patch: Any) -> dict[str, Any]:
    """A new document with the RFC 6902 operations applied, all or nothing."""
    if not isinstance(patch, list):
        raise UsageError("a JSON Patch is a JSON array of operations")
    out = copy.deepcopy(doc)
    for n, op in enumerate(patch):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise UsageError(f"patch operation #{n} needs 'op' and 'path'")
        kind, path = op["op"], split_path(str(op["path"]))
        if kind in ("add", "replace", "test") and "value" not in op:
            raise UsageError(f"patch operation #{n} ({kind}) needs 'value'")
        if kind == "add":
            _add(out, path, op["value"])
        elif kind == "replace":
            set_path(out, path, op["value"], create=False)
        elif kind == "remove":
            _remove(out, path)
        elif kind in ("move", "copy"):
            source = split_path(str(op.get("from", "")))
            value = _remove(out, source) if kind == "move" else copy.deepcopy(_get(out, source))
            _add(out, path, value)
        elif kind == "test":
            if _get(out, path) != op["value"]:
                raise UsageError(f"patch test failed at {_show(path)}")
        else:
            raise UsageError(f"patch operation #{n}: unknown op {kind!r}")
    return out
