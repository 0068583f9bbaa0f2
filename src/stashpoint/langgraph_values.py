"""Reading what the LangGraph saver stored, for diffs people read.

The saver (:mod:`stashpoint.integrations.langgraph`) keeps each channel value and message as
LangGraph's serializer wrote it, packed and base64-encoded inside stashpoint's state: exact and
compact, but unreadable as it is. This module turns a record's stored state back into channel
values and messages with LangGraph's serializer (``JsonPlusSerializer``), without a saver or a
graph. LangGraph is imported only when a value is decoded, so ``stashpoint diff`` on a plain
session never loads it. A value that cannot be decoded here (an encrypting serializer,
LangGraph not installed) is shown as a short note, never as base64.

Only LangGraph's safe types are rebuilt (messages, datetimes, sets, ...: its own allowlist).
A stored value names the function that rebuilds it, and LangGraph's default serializer
imports and calls whatever it names: looking at a store, an imported bundle say, must not run
its code. A value that would need anything else is shown as :class:`Undecoded`, a note naming
the type and the module it would import.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import serde
from .errors import StashpointError
from .langgraph_format import RECORD_META as _META
from .langgraph_format import _unpack

if TYPE_CHECKING:
    from .blobs.objects import Blobs
    from .model import Checkpoint

__all__ = [
    "Undecoded",
    "channel_refs",
    "decode_text",
    "details",
    "is_langgraph",
    "load_ref",
]

# The saver's layout (see stashpoint.integrations.langgraph): the state value
# holding LangGraph's fields, and the prefix of a channel's state key.
_DETAILS = "langgraph"
_VALUE = "ch:"
_BLOB = "blob:"
_INLINE = "inline:"


def is_langgraph(cp: Checkpoint) -> bool:
    """A record the LangGraph saver wrote (a checkpoint, or its marker of a removed one)."""
    return _META in cp.meta


def details(cp: Checkpoint, blobs: Blobs) -> dict[str, Any]:
    """The record's LangGraph fields (versions, metadata, small channel values); empty for a
    record without them."""
    hexd = cp.state.values.get(_DETAILS)
    if hexd is None:
        return {}
    text = serde.decode(blobs.read(bytes.fromhex(hexd)))
    try:
        tree = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        tree = None
    return tree if isinstance(tree, dict) else {}


def _internal(channel: str) -> bool:
    """LangGraph's bookkeeping channels (``branch:to:node``, ``__start__``...), not state."""
    return channel.startswith("__") or ":" in channel


def channel_refs(cp: Checkpoint, blobs: Blobs) -> dict[str, str]:
    """``{channel: ref}`` of the record's state channels, the conversation aside; equal refs
    are equal values, so only channels whose refs differ need decoding (:func:`load_ref`)."""
    out: dict[str, str] = {}
    for key, hexd in cp.state.values.items():
        if key.startswith(_VALUE) and not _internal(key[len(_VALUE) :]):
            out[key[len(_VALUE) :]] = _BLOB + hexd
    inline = details(cp, blobs).get("iv")
    if isinstance(inline, dict):
        for channel, text in inline.items():
            if isinstance(text, str) and not _internal(channel):
                out[channel] = _INLINE + text
    return out


def load_ref(ref: str, blobs: Blobs) -> Any:
    """The decoded value of a ref from :func:`channel_refs`."""
    if ref.startswith(_BLOB):
        text = serde.decode(blobs.read(bytes.fromhex(ref[len(_BLOB) :])))
    else:
        text = ref[len(_INLINE) :]
    return decode_text(text)


class Undecoded:
    """A stored value left undecoded because rebuilding it would import ``module`` and call
    ``name`` from it (a type outside LangGraph's safe list, or a function a hostile value
    names); its repr says so. Not a dataclass: displays must show the note, not its fields."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Undecoded) and (other.module, other.name) == (
            self.module,
            self.name,
        )

    def __hash__(self) -> int:
        return hash((self.module, self.name))

    def __repr__(self) -> str:
        return (
            f"<a value of type {self.module}.{self.name}, not decoded: "
            f"it would need to import module {self.module}>"
        )

    __str__ = __repr__


def decode_text(text: Any) -> Any:
    """A value or message as the saver stores it (base64 of its packed bytes), decoded with
    LangGraph's safe types only; a short note saying why when that cannot be done."""
    if not isinstance(text, str):
        return text
    try:
        packed = base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        return text  # not one of the saver's values: shown as it is
    try:
        type_, data = _unpack(packed)
    except StashpointError:
        return text
    try:
        if type_ == "json":
            return json.loads(data, object_hook=_json_hook)
        return _serializer().loads_typed((type_, data))
    except ImportError:
        return f"<LangGraph value, {len(packed):,} bytes: pip install 'stashpoint[langgraph]'>"
    except Exception as exc:  # an encrypting or custom serializer: say so, not base64
        return f"<LangGraph value of type {type_!r}, {len(data):,} bytes, not decoded: {exc}>"


_SERDE: list[Any] = []


def _serializer() -> Any:
    """LangGraph's serializer restricted to its safe types, with an ext hook that turns any
    other constructor into an :class:`Undecoded` note before anything is imported."""
    if not _SERDE:
        import ormsgpack
        from langgraph.checkpoint.serde import _msgpack as lg_msgpack
        from langgraph.checkpoint.serde import jsonplus

        strict = jsonplus._create_msgpack_ext_hook(allowed_modules=None)
        constructors = {
            jsonplus.EXT_CONSTRUCTOR_SINGLE_ARG,
            jsonplus.EXT_CONSTRUCTOR_POS_ARGS,
            jsonplus.EXT_CONSTRUCTOR_KW_ARGS,
            jsonplus.EXT_PYDANTIC_V1,
            jsonplus.EXT_PYDANTIC_V2,
        }

        def hook(code: int, data: bytes) -> Any:
            if code in constructors or code == jsonplus.EXT_METHOD_SINGLE_ARG:
                try:
                    tup = ormsgpack.unpackb(data, option=ormsgpack.OPT_NON_STR_KEYS, ext_hook=hook)
                    module, name = str(tup[0]), str(tup[1])
                    if code == jsonplus.EXT_METHOD_SINGLE_ARG:
                        safe = (module, name, str(tup[3])) in lg_msgpack.SAFE_MSGPACK_METHODS
                    else:
                        safe = (module, name) in lg_msgpack.SAFE_MSGPACK_TYPES
                except Exception:  # not the layout LangGraph writes: nothing is rebuilt
                    return None
                if not safe:
                    return Undecoded(module, name)
            return strict(code, data)

        _SERDE.append(
            jsonplus.JsonPlusSerializer(
                allowed_json_modules=None,
                allowed_msgpack_modules=None,
                __unpack_ext_hook__=hook,
            )
        )
    return _SERDE[0]


def _json_hook(value: dict[str, Any]) -> Any:
    """LangGraph's older JSON form: LangChain's ``{"lc": ...}`` objects are rebuilt only when
    they are safe types (messages); anything else, secrets included, becomes a note."""
    if "lc" not in value or "id" not in value or not isinstance(value["id"], list):
        return value
    ids = [str(p) for p in value["id"]]
    if value.get("type") == "constructor" and value.get("lc") in (1, 2) and len(ids) >= 2:
        module, name = ".".join(ids[:-1]), ids[-1]
        try:
            if value["lc"] == 1:
                got = _json_reviver()(value)
            elif (module, name) in _safe_types():
                got = _serializer()._revive_lc2(value)
            else:
                got = None
        except Exception:  # refused (not a message) or malformed
            got = None
        return Undecoded(module, name) if got is None or got is value else got
    return Undecoded("langchain", f"{value.get('type', '?')} {'.'.join(ids)}")


def _safe_types() -> frozenset[tuple[str, ...]]:
    from langgraph.checkpoint.serde._msgpack import SAFE_MSGPACK_TYPES

    return SAFE_MSGPACK_TYPES


_REVIVER: list[Callable[[dict[str, Any]], Any]] = []


def _json_reviver() -> Callable[[dict[str, Any]], Any]:
    if not _REVIVER:
        from langchain_core.load.load import Reviver

        _REVIVER.append(Reviver(allowed_objects="messages"))
    return _REVIVER[0]
