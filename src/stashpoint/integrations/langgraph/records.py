"""How a LangGraph checkpoint sits in a stashpoint record, and the saver's serializing.

A put is one record: its ``meta["langgraph"]`` names the checkpoint (id, parent, namespace,
and the other checkpoints whose writes it holds); its state value ``langgraph`` is the
checkpoint's LangGraph fields as one JSON text (versions, ``versions_seen``, metadata, tiny
channel values, the writes moved into it); other channels are state values ``ch:<name>``;
the messages channel is the stashpoint conversation. Every value is packed by LangGraph's
serializer (:func:`stashpoint.langgraph_format._pack`), scrubbed of secrets first.
"""

from __future__ import annotations

import base64
import builtins
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from ... import serde
from ...errors import IntegrityError, SerializationError
from ...langgraph_format import _decompressor, _pack, _text, _unpack
from ...model import Checkpoint
from .framework import JsonPlusSerializer

if TYPE_CHECKING:
    from .reading import Reader
    from .saver import StashpointSaver


DETAILS = "langgraph"  # state key of a put's LangGraph fields
CONV_KEY = "messages"  # the stashpoint session's conversation key
VALUE = "ch:"  # state key prefix of a channel value
INLINE_MAX = 64  # channel values up to this many packed bytes live in the details value
_KEEP_TINY = 4096  # tiny immutable values kept decoded
_IMMUTABLE = frozenset((type(None), bool, int, float, str, bytes))

json_in = msgspec.json.Decoder()
json_out = msgspec.json.Encoder()
MISSING: Any = object()


def _msgpack_array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def untext(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise IntegrityError(f"malformed {what} in the store")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise IntegrityError(f"malformed {what} in the store") from exc


class Ref(NamedTuple):
    """A write whose value is messages the holder record appended to its conversation."""

    start: int
    length: int
    single: bool
    """The write's value was one message, not a list."""


Value = bytes | builtins.list[bytes] | Ref
"""A packed value, a list of packed items (the value was a ``list``), or a reference."""


class Write(NamedTuple):
    task: str
    idx: int
    channel: str
    path: str
    value: Value
    holder: str | None = None
    """The record holding the write (None: the pending-writes key)."""


WriteKey = tuple[str, int]  # (task id, idx)
CpKey = tuple[str, str]  # (namespace, LangGraph checkpoint id)


@dataclass
class Entry:
    """One LangGraph checkpoint: its stashpoint record and, once read, its LangGraph fields."""

    record: Checkpoint
    ns: str
    cpid: str
    parent: str | None
    targets: builtins.list[CpKey] = field(default_factory=builtins.list)
    """Checkpoints whose writes this record holds: its parent, and any whose writes came
    after their child was saved (LangGraph saves writes and checkpoints concurrently)."""
    details: dict[str, Any] | None = None
    writes: builtins.list[tuple[CpKey, Write]] | None = None
    """The writes this record holds, with the checkpoint each is for, once read."""

    @property
    def id(self) -> str:
        return self.record.id


def entry_of(cp: Checkpoint, meta: Any) -> Entry:
    if not isinstance(meta, dict) or not isinstance(meta.get("id"), str):
        raise IntegrityError(f"checkpoint {cp.id} has malformed LangGraph metadata")
    ns, parent = str(meta.get("ns", "")), meta.get("p")
    entry = Entry(cp, ns, meta["id"], str(parent) if parent else None)
    if entry.parent is not None:
        entry.targets.append((ns, entry.parent))
    try:
        entry.targets += [(str(t_ns), str(t_id)) for t_ns, t_id in meta.get("wt") or ()]
    except (TypeError, ValueError) as exc:
        raise IntegrityError(f"checkpoint {cp.id} has malformed LangGraph metadata") from exc
    return entry


def embedded(holder: str, home: CpKey, rows: Any) -> Iterator[tuple[CpKey, Write]]:
    """Writes a record holds: ``[task, idx, channel, path, value]`` for its parent (``home``),
    plus ``ns, checkpoint id`` for another; value is packed bytes, a list of them, or
    ``[start, length, single]`` into the record's conversation."""
    try:
        for row in rows:
            task, idx, channel, path, value = row[:5]
            target = (str(row[5]), str(row[6])) if len(row) == 7 else home
            v: Value
            if isinstance(value, builtins.list) and value and isinstance(value[0], int):
                v = Ref(int(value[0]), int(value[1]), bool(value[2]))
            elif isinstance(value, builtins.list):
                v = [untext(x, "write") for x in value]
            else:
                v = untext(value, "write")
            yield target, Write(str(task), int(idx), str(channel), str(path), v, holder)
    except (ValueError, TypeError, IndexError) as exc:
        raise IntegrityError(f"checkpoint {holder} has malformed LangGraph writes") from exc


def write_order(w: Write) -> tuple[str, str, int]:
    return (w.path, w.task, w.idx)


def fresh(x: Any) -> Any:
    """A copy of the dicts and lists in ``x`` (callers may change what they are given)."""
    if type(x) is dict:
        return {k: v if type(v) not in _NESTED else fresh(v) for k, v in x.items()}
    if type(x) is builtins.list:
        return [v if type(v) not in _NESTED else fresh(v) for v in x]
    return x


_NESTED = (dict, builtins.list)


# -- the saver's methods -------------------------------------------------------------------


def _dumps(self: StashpointSaver, value: Any) -> bytes:
    """A value packed by LangGraph's serializer, scrubbed of secrets first: the session
    that stores it sees only those bytes, where no secret pattern can match."""
    if self.redactor is not None:
        value = self.redactor(value)
    return _pack(self.serde.dumps_typed(value))


def _encode_write(self: StashpointSaver, value: Any) -> bytes | builtins.list[bytes]:
    if type(value) is builtins.list:
        return [self._dumps(v) for v in value]
    return self._dumps(value)


def _loads(self: StashpointSaver, packed: bytes) -> Any:
    if len(packed) > INLINE_MAX:
        return self.serde.loads_typed(_unpack(packed))
    # Tiny values (LangGraph's ``branch:to:X`` channels and writes are None) recur in
    # every checkpoint: an immutable result is decoded once per saver, not per tuple.
    got = self._tiny.get(packed, MISSING)
    if got is MISSING:
        got = self.serde.loads_typed(_unpack(packed))
        if type(got) in _IMMUTABLE and len(self._tiny) < _KEEP_TINY:
            self._tiny[packed] = got
    return got


def _loads_many(self: StashpointSaver, packed: builtins.list[bytes]) -> builtins.list[Any]:
    """Values decoded in order. With LangGraph's own serializer, a run of msgpack values
    is decoded as one msgpack array: one call into its C decoder instead of one per
    message (what its SQLite saver does for a whole message list)."""
    d = _decompressor()
    typed = [_unpack(p, d) for p in packed]
    if (
        len(typed) > 1
        and type(self.serde) is JsonPlusSerializer
        and all(t == "msgpack" for t, _ in typed)
    ):
        array = _msgpack_array_header(len(typed)) + b"".join(data for _, data in typed)
        try:
            got = self.serde.loads_typed(("msgpack", array))
        except Exception:  # decoded one by one below, which names the error
            got = None
        if type(got) is builtins.list and len(got) == len(typed):
            return got
    loads = self.serde.loads_typed
    return [loads(t) for t in typed]


def _details(
    self: StashpointSaver, e: Entry, reader: Reader | None, raw: bytes | None = None
) -> dict[str, Any]:
    """A checkpoint's LangGraph fields (versions, metadata, the parent's writes)."""
    if e.details is None:
        hexd = e.record.state.values.get(DETAILS)
        if hexd is None:
            raise IntegrityError(f"checkpoint {e.id} lost its LangGraph fields")
        if raw is None:
            raw = self.store.blobs.read(bytes.fromhex(hexd))
        try:  # a JSON text (see _details_text) stored as a string value
            text = json_in.decode(raw)
            tree = json_in.decode(text) if isinstance(text, str) else None
        except msgspec.DecodeError as exc:
            raise IntegrityError(f"checkpoint {e.id} has malformed LangGraph fields") from exc
        if not isinstance(tree, dict):
            raise IntegrityError(f"checkpoint {e.id} has malformed LangGraph fields")
        details: dict[str, Any] = {}
        for key, value in tree.items():
            if key.endswith("!"):  # stashpoint's encoding could not carry it: LangGraph's did
                details[key[:-1]] = self._loads(untext(value, "LangGraph field"))
            elif key in ("md", "x"):
                details[key] = serde.from_tree(value)
            else:
                details[key] = value
        e.details = details
    return e.details


def _details_text(self: StashpointSaver, details: dict[str, Any]) -> str:
    """A checkpoint's LangGraph fields as one JSON text: encoded in C, not walked in
    Python (the state value ``langgraph``). Metadata and extra fields go through
    stashpoint's encoding (tuples, sets, dates...) or, failing that, LangGraph's."""
    tree: dict[str, Any] = {}
    for key, value in details.items():
        if key in ("md", "x"):
            if self.redactor is not None:
                value = self.redactor(value)
            try:
                tree[key] = serde.to_tree(value)
            except SerializationError:
                tree[key + "!"] = _text(self._dumps(value))
        else:
            tree[key] = value
    try:
        return json_out.encode(tree).decode()
    except (TypeError, ValueError, msgspec.EncodeError):  # versions of an unusual type
        for key in ("cv", "vs", "uc", "ts", "v"):
            if key in tree:
                tree[key + "!"] = _text(_pack(self.serde.dumps_typed(tree.pop(key))))
        return json_out.encode(tree).decode()


def _prefetch_details(self: StashpointSaver, entries: Iterable[Entry]) -> None:
    """Read the LangGraph fields of many checkpoints in one store query, not one each."""
    todo = {e.id: e for e in entries if e.details is None}
    wanted = {}
    for e in todo.values():
        hexd = e.record.state.values.get(DETAILS)
        if hexd is None:
            raise IntegrityError(f"checkpoint {e.id} lost its LangGraph fields")
        wanted[e.id] = bytes.fromhex(hexd)
    if len(wanted) > 1:
        got = self.store.blobs.read_many(builtins.list(dict.fromkeys(wanted.values())))
        for ident, digest in wanted.items():
            self._details(todo[ident], None, got[digest])


def _held(self: StashpointSaver, e: Entry, reader: Reader) -> builtins.list[tuple[CpKey, Write]]:
    """The writes a checkpoint's record holds, each with the checkpoint it is for."""
    if e.writes is None:
        rows = self._details(e, reader).get("w") or ()
        parent = (e.ns, e.parent or "")
        e.writes = builtins.list(embedded(e.id, parent, rows))
    return e.writes


class Serializing:
    """The methods above, as :class:`StashpointSaver` has them."""

    _dumps = _dumps
    _encode_write = _encode_write
    _loads = _loads
    _loads_many = _loads_many
    _details = _details
    _details_text = _details_text
    _prefetch_details = _prefetch_details
    _held = _held
