"""Reading what the LangGraph saver stored, for diffs people read.

The saver (:mod:`stashpoint.integrations.langgraph`) keeps each channel value and message as
LangGraph's serializer wrote it, packed and base64-encoded inside stashpoint's state: exact and
compact, but unreadable as it is. This module turns a record's stored state back into channel
values and messages with LangGraph's default serializer (``JsonPlusSerializer``), without a
saver or a graph. LangGraph is imported only when a value is decoded, so ``stashpoint diff``
on a plain session never loads it. A value that cannot be decoded here (an encrypting
serializer, LangGraph not installed) is shown as a short note, never as base64.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import TYPE_CHECKING, Any

from .. import serde
from ..errors import StashpointError

if TYPE_CHECKING:
    from ..blobs.objects import Blobs
    from ..model import Checkpoint

__all__ = [
    "channel_refs",
    "decode_text",
    "details",
    "is_langgraph",
    "load_ref",
]

# The saver's layout (see stashpoint.integrations.langgraph): record meta key, the state value
# holding LangGraph's fields, and the prefix of a channel's state key.
_META = "langgraph"
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


def decode_text(text: Any) -> Any:
    """A value or message as the saver stores it (base64 of its packed bytes), decoded with
    LangGraph's default serializer; a short note saying why when that cannot be done."""
    if not isinstance(text, str):
        return text
    try:
        packed = base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        return text  # not one of the saver's values: shown as it is
    try:
        from .langgraph import _unpack  # imports LangGraph
    except ImportError:
        return f"<LangGraph value, {len(packed):,} bytes: pip install 'stashpoint[langgraph]'>"
    try:
        type_, data = _unpack(packed)
    except StashpointError:
        return text
    try:
        return _serializer().loads_typed((type_, data))
    except Exception as exc:  # an encrypting or custom serializer: say so, not base64
        return f"<LangGraph value of type {type_!r}, {len(data):,} bytes, not decoded: {exc}>"


_SERDE: list[Any] = []


def _serializer() -> Any:
    if not _SERDE:
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

        _SERDE.append(JsonPlusSerializer())
    return _SERDE[0]
