"""State encoding: JSON with tagged extensions, an explicit type allowlist, and no pickle.

Why JSON and not pickle: checkpoints outlive the process that wrote them and may come from a
bundle someone else made; decoding must never import a module or instantiate a class the
application did not register. Values that JSON cannot carry (bytes, datetime, tuple, ...) are
written as ``{"__sp__": TAG, "v": ...}``; a user dict that happens to contain the reserved key is
itself wrapped, so user data can never be mistaken for a tag.

Unsupported types fail here, at checkpoint time, with the name of the type and how to register
it - never later, when restoring.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import math
import uuid
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

import msgspec

from .errors import SerializationError

__all__ = ["MAX_DEPTH", "decode", "encode", "from_tree", "register_type", "to_tree"]

TAG = "__sp__"
MAX_DEPTH = 200
MAX_ENCODED_BYTES = 512 * 1024 * 1024
_INT64 = 2**63
_STR = frozenset((str,))
_AS_THEY_ARE = frozenset((str, bool, type(None)))
"""Types :func:`to_tree` returns unchanged without looking inside (ints and floats it checks)."""

_registry_by_type: dict[type, str] = {}
_registry_by_name: dict[str, type] = {}

_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder()


def register_type(cls: type, name: str | None = None) -> type:
    """Allow instances of a dataclass, pydantic model or Enum in checkpointed state.

    Usable as a decorator. The name is what is stored; keep it stable across refactors.
    """
    is_model = hasattr(cls, "model_validate") and hasattr(cls, "model_dump")
    if not (dataclasses.is_dataclass(cls) or issubclass(cls, enum.Enum) or is_model):
        raise SerializationError(
            f"register_type accepts dataclasses, pydantic models and Enums, not {cls!r}"
        )
    key = name or f"{cls.__module__}.{cls.__qualname__}"
    _registry_by_type[cls] = key
    _registry_by_name[key] = cls
    return cls


def encode(value: Any) -> bytes:
    """Encode a state value to bytes (UTF-8 JSON)."""
    if (  # a chat message (string keys, string/flag/None values): to_tree keeps it as it is
        type(value) is dict
        and TAG not in value
        and _STR.issuperset(map(type, value))
        and _AS_THEY_ARE.issuperset(map(type, value.values()))
    ):
        tree = value
    else:
        tree = to_tree(value)
    try:
        data = _json_encoder.encode(tree)
    except UnicodeEncodeError:
        # A lone surrogate (what json.loads makes of a "\\ud83d" escape in a tool's output)
        # has no UTF-8 form: such strings are stored tagged, so they come back as they were.
        data = _json_encoder.encode(_surrogates_to_tree(tree))
    except (TypeError, OverflowError) as exc:  # pragma: no cover - to_tree catches these first
        raise SerializationError(str(exc)) from exc
    if len(data) > MAX_ENCODED_BYTES:
        raise SerializationError(f"encoded state value is {len(data)} bytes, over the limit")
    return data


def decode(data: bytes) -> Any:
    """Decode bytes made by :func:`encode`; hostile input raises SerializationError."""
    if len(data) > MAX_ENCODED_BYTES:
        raise SerializationError("encoded state value is over the size limit")
    try:
        tree = _json_decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:  # invalid UTF-8
        raise SerializationError(f"cannot decode stored value: {exc}") from exc
    return from_tree(tree)


def to_tree(value: Any, _depth: int = 0) -> Any:
    """Turn a value into JSON-native data, tagging what JSON cannot carry.

    Returns the same object when nothing needed converting, so plain messages cost no copies.
    """
    if _depth > MAX_DEPTH:
        raise SerializationError(f"state is nested deeper than {MAX_DEPTH} levels")
    t = type(value)
    if t is str or t is bool or value is None:
        return value
    if t is int:
        return value if -_INT64 <= value < _INT64 else {TAG: "int", "v": str(value)}
    if t is float:
        return value if math.isfinite(value) else {TAG: "float", "v": repr(value)}
    if t is dict:
        return _dict_to_tree(value, _depth)
    if t is list:
        out = None
        for i, item in enumerate(value):
            conv = to_tree(item, _depth + 1)
            if conv is not item and out is None:
                out = list(value[:i])
            if out is not None:
                out.append(conv)
        return value if out is None else out
    handler = _ENCODERS.get(t)
    if handler is not None:
        return handler(value, _depth)
    name = _registry_by_type.get(t)
    if name is not None:
        return _registered_to_tree(value, name, _depth)
    if isinstance(value, PurePath):
        return {TAG: "path", "v": str(value)}
    raise SerializationError(
        f"cannot checkpoint a value of type {t.__module__}.{t.__qualname__}: supported are "
        "JSON types, bytes, datetime/date/time/timedelta, UUID, Decimal, set, frozenset, tuple, "
        "PurePath, and dataclasses / pydantic models / Enums registered with "
        "stashpoint.register_type()"
    )


def _surrogates_to_tree(tree: Any) -> Any:
    """``tree`` with every string that holds a lone surrogate tagged ``str`` (its UTF-8 bytes
    with surrogates passed through, base64): only walked when plain encoding failed."""
    t = type(tree)
    if t is str:
        try:
            tree.encode("utf-8")
        except UnicodeEncodeError:
            raw = tree.encode("utf-8", "surrogatepass")
            return {TAG: "str", "v": base64.b64encode(raw).decode("ascii")}
        return tree
    if t is list:
        return [_surrogates_to_tree(x) for x in tree]
    if t is dict:
        items = [(_surrogates_to_tree(k), _surrogates_to_tree(v)) for k, v in tree.items()]
        if all(type(k) is str for k, _ in items):
            return dict(items)
        return {TAG: "dict", "v": [[k, v] for k, v in items]}
    return tree


def _dict_to_tree(value: dict[Any, Any], depth: int) -> Any:
    if TAG in value or not _STR.issuperset(map(type, value)):
        items = [[to_tree(k, depth + 1), to_tree(v, depth + 1)] for k, v in value.items()]
        return {TAG: "dict", "v": items}
    if _AS_THEY_ARE.issuperset(map(type, value.values())):  # a chat message: found in C
        return value
    out = None
    for k, v in value.items():
        conv = to_tree(v, depth + 1)
        if conv is not v and out is None:
            out = dict(value)
        if out is not None:
            out[k] = conv
    return value if out is None else out


def _registered_to_tree(value: Any, name: str, depth: int) -> Any:
    if isinstance(value, enum.Enum):
        return {TAG: "enum", "type": name, "v": to_tree(value.value, depth + 1)}
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    else:
        fields = value.model_dump(mode="python")
    return {TAG: "obj", "type": name, "v": _dict_to_tree(fields, depth + 1)}


def _seq(tag: str) -> Callable[[Any, int], Any]:
    def conv(value: Any, depth: int) -> Any:
        items = [to_tree(x, depth + 1) for x in value]
        if tag != "tuple":
            items.sort(key=_json_encoder.encode)  # stable bytes for equal sets
        return {TAG: tag, "v": items}

    return conv


_ENCODERS: dict[type, Callable[[Any, int], Any]] = {
    bytes: lambda v, d: {TAG: "bytes", "v": base64.b64encode(v).decode("ascii")},
    bytearray: lambda v, d: {TAG: "bytes", "v": base64.b64encode(bytes(v)).decode("ascii")},
    tuple: _seq("tuple"),
    set: _seq("set"),
    frozenset: _seq("frozenset"),
    dt.datetime: lambda v, d: {TAG: "datetime", "v": v.isoformat()},
    dt.date: lambda v, d: {TAG: "date", "v": v.isoformat()},
    dt.time: lambda v, d: {TAG: "time", "v": v.isoformat()},
    dt.timedelta: lambda v, d: {TAG: "timedelta", "v": [v.days, v.seconds, v.microseconds]},
    uuid.UUID: lambda v, d: {TAG: "uuid", "v": str(v)},
    decimal.Decimal: lambda v, d: {TAG: "decimal", "v": str(v)},
}


def from_tree(tree: Any, _depth: int = 0) -> Any:
    """Inverse of :func:`to_tree`; only allowlisted tags and registered types are built."""
    if _depth > MAX_DEPTH:
        raise SerializationError(f"stored value is nested deeper than {MAX_DEPTH} levels")
    t = type(tree)
    if t is list:
        return [from_tree(x, _depth + 1) for x in tree]
    if t is not dict:
        return tree
    if TAG not in tree:
        return {k: from_tree(v, _depth + 1) for k, v in tree.items()}
    try:
        return _decode_tag(tree, _depth)
    except SerializationError:
        raise
    except (LookupError, TypeError, ValueError, ArithmeticError) as exc:
        # LookupError: KeyError, IndexError; ArithmeticError: OverflowError (a timedelta or
        # date out of range), decimal.InvalidOperation. ValueError covers UnicodeError too.
        raise SerializationError(f"malformed tagged value {tree.get(TAG)!r}: {exc}") from exc


def _decode_tag(tree: dict[str, Any], depth: int) -> Any:
    tag, v = tree[TAG], tree["v"]
    simple = _DECODERS.get(tag)
    if simple is not None:
        return simple(v)
    if tag == "dict":
        return {_hashable(from_tree(k, depth + 1)): from_tree(val, depth + 1) for k, val in v}
    if tag in ("tuple", "set", "frozenset"):
        items = [from_tree(x, depth + 1) for x in v]
        if tag == "tuple":
            return tuple(items)
        hashables = [_hashable(x) for x in items]
        return set(hashables) if tag == "set" else frozenset(hashables)
    if tag in ("enum", "obj"):
        cls = _registry_by_name.get(tree["type"])
        if cls is None:
            raise SerializationError(
                f"stored value has type {tree['type']!r}, which is not registered here; "
                "call stashpoint.register_type() for it before loading"
            )
        payload = from_tree(v, depth + 1)
        if tag == "enum":
            return cls(payload)
        if hasattr(cls, "model_validate"):
            return cls.model_validate(payload)
        return cls(**payload)
    raise SerializationError(f"unknown tag {tag!r} in stored value")


def _hashable(x: Any) -> Any:
    try:
        hash(x)
    except TypeError as exc:
        raise SerializationError("unhashable key or set member in stored value") from exc
    return x


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "int": lambda v: int(str(v)),
    "float": lambda v: float(str(v)),
    "bytes": lambda v: base64.b64decode(str(v), validate=True),
    "datetime": lambda v: dt.datetime.fromisoformat(str(v)),
    "date": lambda v: dt.date.fromisoformat(str(v)),
    "time": lambda v: dt.time.fromisoformat(str(v)),
    "timedelta": lambda v: dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "uuid": lambda v: uuid.UUID(str(v)),
    "decimal": lambda v: decimal.Decimal(str(v)),
    "path": lambda v: PurePath(str(v)),
    "str": lambda v: base64.b64decode(str(v), validate=True).decode("utf-8", "surrogatepass"),
}
