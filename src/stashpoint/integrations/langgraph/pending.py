"""Pending writes: durable at once in one session value per thread (with a MAC from the
store's hasher), merged with another process's, and moved into the next checkpoint.

The value is changed by a swap (compare-and-set) against what this saver last read or wrote:
another saver's writes stored meanwhile fail it, are read in, and the change is made again
on top of them. LangGraph's own savers insert one row per write and lose none; a plain set
of the whole value would drop the writes another process stored between our read and our
set. In the common case - this saver alone on the thread - the swap is the one round trip,
with no read before it.
"""

from __future__ import annotations

import base64
import builtins
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import ConflictError, IntegrityError
from ...metakeys import LANGGRAPH_PENDING
from .reading import Reader
from .records import CpKey, Ref, Value, Write, WriteKey, untext
from .threads import Thread

if TYPE_CHECKING:
    from .saver import StashpointSaver


def _writes_of(
    self: StashpointSaver, th: Thread, key: CpKey, reader: Reader
) -> dict[WriteKey, Write]:
    """A checkpoint's writes: those moved into later records (its children's, mostly),
    then the pending ones (where a special channel's latest write wins)."""
    out: dict[WriteKey, Write] = {}
    for holder in th.holders.get(key, ()):
        for target, w in self._held(holder, reader):
            if target == key:
                out.setdefault((w.task, w.idx), w)
    for wk, w in th.pending.get(key, {}).items():
        if wk not in out or wk[1] < 0:
            out[wk] = w
    return out


def _merge_stored_pending(self: StashpointSaver, th: Thread) -> None:
    """Take in writes another process stored since we last looked (ours stay)."""
    raw = self.store.session_value(th.session, LANGGRAPH_PENDING)
    if raw == th.pending_raw:
        return
    th.pending_raw = raw
    if raw is None:
        return
    reader = Reader(self)
    for key, w in self._parse_pending(th, raw):
        if key in th.holders and (w.task, w.idx) in self._writes_of(th, key, reader):
            continue  # already moved into a record
        th.pending.setdefault(key, {}).setdefault((w.task, w.idx), w)


def _parse_pending(
    self: StashpointSaver, th: Thread, raw: str
) -> builtins.list[tuple[CpKey, Write]]:
    try:
        doc = json.loads(raw)
        body, mac = str(doc["w"]), str(doc["mac"])
    except (ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(f"pending LangGraph writes of {th.session} are corrupt") from exc
    if mac != self.store.hasher.digest(body.encode()):
        raise IntegrityError(f"pending LangGraph writes of {th.session} do not match their digest")
    out = []
    try:
        for ns, cpid, task, idx, channel, path, value in json.loads(body):
            w = Write(str(task), int(idx), str(channel), str(path), _from_json(value))
            out.append(((str(ns), str(cpid)), w))
    except (ValueError, TypeError) as exc:
        raise IntegrityError(f"pending LangGraph writes of {th.session} are corrupt") from exc
    return out


PendingMap = dict[CpKey, dict[WriteKey, Write]]

_SWAP_TRIES = 64
"""Swaps tried before giving up: each failed one means another writer's succeeded."""


def _update_pending(
    self: StashpointSaver, th: Thread, change: Callable[[PendingMap], bool]
) -> None:
    """Apply ``change`` to a copy of the thread's pending writes (it returns whether it
    changed anything) and swap the stored value for it. A failed swap means another
    saver stored writes since we last looked: they are read in (ours stay) and ``change``
    is applied again to the merged set, so that regular channels still keep the write
    stored first; ``th.pending`` changes only once the store holds the new value."""
    for _ in range(_SWAP_TRIES):
        pending = {key: dict(writes) for key, writes in th.pending.items()}
        if not change(pending):
            return
        raw = _encode_pending(self, pending)
        if raw == th.pending_raw or self.store.swap_session_value(
            th.session, LANGGRAPH_PENDING, th.pending_raw, raw
        ):
            th.pending, th.pending_raw = pending, raw
            return
        self._merge_stored_pending(th)
    raise ConflictError(
        f"the pending LangGraph writes of {th.session} changed under each of {_SWAP_TRIES} "
        "tries to store these: other writers keep changing them; these were not stored"
    )


def _encode_pending(self: StashpointSaver, pending: PendingMap) -> str | None:
    """The stored form of a thread's pending writes (None: there are none)."""
    rows = [
        [ns, cpid, w.task, w.idx, w.channel, w.path, _to_json(w.value)]
        for (ns, cpid), writes in pending.items()
        for w in writes.values()
    ]
    if not rows:
        return None
    body = json.dumps(rows, separators=(",", ":"))
    return json.dumps({"w": body, "mac": self.store.hasher.digest(body.encode())})


def _materialize(
    self: StashpointSaver, th: Thread, w: Write, reader: Reader
) -> bytes | builtins.list[bytes]:
    """A write's value as packed bytes, a reference resolved."""
    if not isinstance(w.value, Ref):
        return w.value
    holder = th.records.get(w.holder or "")
    conv = holder.record.state.conversation if holder is not None else None
    if conv is None:
        raise IntegrityError(f"checkpoint {w.holder} lost the messages of a write")
    got = reader.conv_items(conv)[w.value.start : w.value.start + w.value.length]
    if len(got) != w.value.length:
        raise IntegrityError(f"checkpoint {w.holder} lost the messages of a write")
    items = [untext(t, "message") for t in got]
    return items[0] if w.value.single else items


class PendingWrites:
    """The methods above, as :class:`StashpointSaver` has them."""

    _writes_of = _writes_of
    _merge_stored_pending = _merge_stored_pending
    _parse_pending = _parse_pending
    _update_pending = _update_pending
    _materialize = _materialize


def _to_json(value: Value) -> Any:
    if isinstance(value, Ref):
        raise AssertionError("pending writes hold values, not references")
    if isinstance(value, builtins.list):
        return [base64.b64encode(v).decode("ascii") for v in value]
    return base64.b64encode(value).decode("ascii")


def _from_json(value: Any) -> bytes | builtins.list[bytes]:
    if isinstance(value, builtins.list):
        return [base64.b64decode(str(v), validate=True) for v in value]
    return base64.b64decode(str(value), validate=True)
