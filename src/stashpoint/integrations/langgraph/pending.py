"""Pending writes: durable at once in one session value per thread (with a MAC from the
store's hasher), merged with another process's, and moved into the next checkpoint."""

from __future__ import annotations

import base64
import builtins
import json
from typing import TYPE_CHECKING, Any

from ...errors import IntegrityError
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


def _save_pending(self: StashpointSaver, th: Thread) -> None:
    rows = [
        [ns, cpid, w.task, w.idx, w.channel, w.path, _to_json(w.value)]
        for (ns, cpid), writes in th.pending.items()
        for w in writes.values()
    ]
    if not rows:
        if th.pending_raw is not None:
            self.store.set_session_value(th.session, LANGGRAPH_PENDING, None)
            th.pending_raw = None
        return
    body = json.dumps(rows, separators=(",", ":"))
    raw = json.dumps({"w": body, "mac": self.store.hasher.digest(body.encode())})
    self.store.set_session_value(th.session, LANGGRAPH_PENDING, raw)
    th.pending_raw = raw


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
    _save_pending = _save_pending
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
