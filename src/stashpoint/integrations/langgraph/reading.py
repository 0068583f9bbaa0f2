"""Reading LangGraph checkpoints back: every record, chain link and message verified once
per saver, each stored thing decoded once per reader, and the tuples LangGraph asks for."""

from __future__ import annotations

import builtins
import hashlib
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import msgspec

from ... import serde
from ...conversation import fields_of, snapshot
from ...errors import IntegrityError
from ...integrity import EMPTY_CHAIN
from ...model import LogRef
from .framework import CheckpointTuple, PendingWrite
from .records import CONV_KEY, VALUE, Entry, Ref, Write, fresh, json_in, untext, write_order
from .threads import StateCache, Thread

if TYPE_CHECKING:
    from .saver import StashpointSaver


class _View:
    """Messages [0, n) of a log as one list, its fork parent's prefix included: verified rows,
    stored items and decoded objects, each grown on demand. Logs are append-only and messages
    immutable, so the saver keeps views across reads (:class:`Views`)."""

    __slots__ = ("base", "items", "lock", "objs", "own", "rows", "shown", "views")

    def __init__(self, base: str | None, own: int) -> None:
        self.base, self.own = base, own
        self.lock = threading.RLock()
        self.rows: builtins.list[tuple[bytes, bytes]] = []
        self.items: builtins.list[str] = []
        self.objs: builtins.list[Any] = []
        self.views: builtins.list[Any] = []
        """Copies of the messages' contents as stored (see
        :func:`~stashpoint.conversation.snapshot`), taken only when a put may compare with
        them (``get_tuple``): ``list`` copies nothing."""
        self.shown = 0
        """``objs[:shown]`` were handed out before their copies were taken: someone may have
        changed them, so their copies come from the stored bytes."""


class Views:
    """The saver's views of the logs it read last (LRU by log): a cold ``get_tuple`` decodes
    a conversation once, and every later read of that line, ``list`` included, reuses it."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.lock = threading.Lock()
        self.logs: OrderedDict[str, _View] = OrderedDict()

    def get(self, log: str) -> _View | None:
        with self.lock:
            v = self.logs.get(log)
            if v is not None:
                self.logs.move_to_end(log)
            return v

    def add(self, log: str, v: _View) -> _View:
        with self.lock:
            got = self.logs.setdefault(log, v)  # another reader's, if it got there first
            self.logs.move_to_end(log)
            while len(self.logs) > self.keep:
                self.logs.popitem(last=False)
            return got

    def wrote(self, conv: LogRef, items: builtins.list[str]) -> None:
        """A put of this saver committed ``conv`` (its conversation, ``items`` as stored):
        a view of that log gets the rows just written, so the next read of this line (the
        ``get_tuple`` that starts every run) does not fetch back its own messages.

        The rows are made the way the session made them (each item's bytes, chained) and
        taken only if their last link is the hash of the record just committed; anything
        else (a new log, a view that lags, another writer) leaves the view to the store."""
        v = self.get(conv.log)
        if v is None:
            return
        with v.lock:
            n = len(v.rows)
            if not n < conv.length <= len(items):
                return
            link = v.rows[-1][0] if n else bytes.fromhex(EMPTY_CHAIN)
            new = []
            sha256 = hashlib.sha256
            for item in items[n : conv.length]:
                data = serde.encode(item)
                link = sha256(link + data).digest()
                new.append((link, data))
            if link.hex() != conv.hash:
                return
            v.rows.extend(new)
            if len(v.items) == n:
                v.items.extend(items[n : conv.length])


class Reader:
    def __init__(self, saver: StashpointSaver) -> None:
        self.saver = saver
        self.store = saver.store
        self.views: dict[str, _View] = {}
        self.values: dict[str, Any] = {}
        self.packed: dict[str, bytes] = {}

    def _view(self, log: str, length: int) -> _View:
        v = self.views.get(log) or self.saver._views.get(log)
        if v is not None:
            self.views[log] = v
            if len(v.rows) >= length:
                return v
        if v is None:
            info = self.store.log_info(log)
            if info is None:
                raise IntegrityError(f"conversation log {log} is missing")
            own = info.parent_len if info.parent is not None else 0
            v = _View(info.parent if own else None, own)
            if v.base is not None:
                v.rows = self._view(v.base, own).rows[:own]
            v = self.views[log] = self.saver._views.add(log, v)
        with v.lock:
            return self._extend(log, v, length)

    def _extend(self, log: str, v: _View, length: int) -> _View:
        start = len(v.rows)
        if length > start:
            rows = self.store.read_messages(log, start, length)
            if len(rows) != length - start or any(r.idx != start + i for i, r in enumerate(rows)):
                raise IntegrityError(f"conversation log {log} has missing messages")
            # integrity.message_chain on bytes, not hex: H(prev || message)
            chain = v.rows[-1][0] if v.rows else bytes.fromhex(EMPTY_CHAIN)
            sha256 = hashlib.sha256
            for r in rows:
                chain = sha256(chain + r.data).digest()
                if chain != r.chain:
                    raise IntegrityError(f"conversation log {log} is corrupt")
                v.rows.append((r.chain, r.data))
        return v

    def _checked(self, conv: LogRef) -> _View:
        v = self._view(conv.log, conv.length)
        tip = v.rows[conv.length - 1][0].hex() if conv.length else EMPTY_CHAIN
        if len(v.rows) < conv.length or tip != conv.hash:
            raise IntegrityError(
                f"conversation of length {conv.length} in log {conv.log} does not match its hash"
            )
        return v

    def _items(self, log: str, v: _View, n: int) -> builtins.list[str]:
        if len(v.items) < n:
            with v.lock:
                self._more_items(log, v, n)
        return v.items

    def _more_items(self, log: str, v: _View, n: int) -> None:
        if len(v.items) < n:
            if v.base is not None and len(v.items) < v.own:
                upto = min(v.own, n)
                base = self._view(v.base, upto)
                v.items.extend(self._items(v.base, base, upto)[len(v.items) : upto])
            datas = [data for _chain, data in v.rows[len(v.items) : n]]
            try:  # the stored JSON strings as one JSON array: one call into the C decoder
                got = json_in.decode(b"[" + b",".join(datas) + b"]") if datas else []
            except msgspec.DecodeError:
                got = [serde.decode(data) for data in datas]  # names what is wrong
            if len(got) != len(datas) or not all(type(item) is str for item in got):
                raise IntegrityError(f"conversation log {log} holds a malformed message")
            v.items.extend(got)

    def _objs(self, log: str, v: _View, n: int) -> builtins.list[Any]:
        if len(v.objs) < n:
            with v.lock:
                self._more_objs(log, v, n)
        return v.objs

    def _more_objs(self, log: str, v: _View, n: int) -> None:
        if len(v.objs) < n:
            if v.base is not None and len(v.objs) < v.own:
                upto = min(v.own, n)
                base = self._view(v.base, upto)
                v.objs.extend(self._objs(v.base, base, upto)[len(v.objs) : upto])
            items = self._items(log, v, n)
            v.objs.extend(
                self.saver._loads_many([untext(i, "message") for i in items[len(v.objs) : n]])
            )

    def _copies(self, log: str, v: _View, n: int) -> builtins.list[Any]:
        if len(v.views) < n:
            with v.lock:
                self._more_copies(log, v, n)
        return v.views

    def _more_copies(self, log: str, v: _View, n: int) -> None:
        objs = self._objs(log, v, n)
        if len(v.views) < n:
            if v.base is not None and len(v.views) < v.own:
                upto = min(v.own, n)
                base = self._view(v.base, upto)
                v.views.extend(self._copies(v.base, base, upto)[len(v.views) : upto])
            if len(v.views) < min(v.shown, n):  # decoded again: objects nobody else holds
                items = self._items(log, v, n)[len(v.views) : min(v.shown, n)]
                v.views.extend(
                    fields_of(self.saver._loads_many([untext(i, "message") for i in items]))
                )
            v.views.extend(map(snapshot, fields_of(objs[len(v.views) : n])))

    def _show(self, log: str, v: _View, n: int) -> None:
        """Note that messages ``[0, n)`` are handed out (a fork's prefix: its parent log's)."""
        if v.shown < n:
            with v.lock:
                v.shown = max(v.shown, n)
            if v.base is not None:
                upto = min(v.own, n)
                self._show(v.base, self._view(v.base, upto), upto)

    def conv_items(self, conv: LogRef) -> builtins.list[str]:
        return self._items(conv.log, self._checked(conv), conv.length)[: conv.length]

    def conv_views(self, conv: LogRef) -> builtins.list[Any]:
        """Copies of the contents of a conversation's messages, as stored."""
        return self._copies(conv.log, self._checked(conv), conv.length)[: conv.length]

    def conv_objects(
        self, conv: LogRef, start: int = 0, stop: int | None = None
    ) -> builtins.list[Any]:
        """Messages ``[start, stop)`` of a conversation (default: all), a new list."""
        end = conv.length if stop is None else min(stop, conv.length)
        v = self._checked(conv)
        objs = self._objs(conv.log, v, conv.length)
        self._show(conv.log, v, end)
        return objs[start:end]

    def packed_value(self, hexd: str) -> bytes:
        got = self.packed.get(hexd)
        if got is None:
            raw = serde.decode(self.saver.store.blobs.read(bytes.fromhex(hexd)))
            got = self.packed[hexd] = untext(raw, "channel value")
        return got

    def value(self, hexd: str) -> Any:
        if hexd not in self.values:
            self.values[hexd] = self.saver._loads(self.packed_value(hexd))
        return self.values[hexd]


def _tuple(
    self: StashpointSaver, th: Thread, e: Entry, reader: Reader, *, seed: bool
) -> tuple[CheckpointTuple, StateCache | None]:
    details, cp = self._details(e, reader), e.record
    cache = StateCache(cp.id) if seed else None
    cv: dict[str, Any] = details["cv"]
    values: dict[str, Any] = {}
    state_values = cp.state.values
    if len(state_values) > 1:  # channel values besides the details
        for key, hexd in state_values.items():
            if key.startswith(VALUE):
                ch = key[len(VALUE) :]
                got = values[ch] = reader.value(hexd)
                if cache is not None:
                    cache.values[ch] = (cv.get(ch), got, reader.packed_value(hexd))
    iv = details.get("iv")
    if iv:
        for ch, text in iv.items():
            packed = untext(text, "channel value")
            got = values[ch] = self._loads(packed)
            if cache is not None:
                cache.values[ch] = (cv.get(ch), got, packed)
    conv = cp.state.conversation
    if conv is not None:
        if cache is not None:  # copied first: from the objects, unless handed out before
            cache.conv_views = reader.conv_views(conv)
            cache.conv_items = reader.conv_items(conv)
        values[details.get("conv", CONV_KEY)] = reader.conv_objects(conv)
    uc = details.get("uc")
    checkpoint: Any = {  # a LangGraph Checkpoint (a TypedDict)
        "v": details.get("v"),
        "id": e.cpid,
        "ts": details.get("ts"),
        "channel_values": values,
        "channel_versions": cv.copy(),
        "versions_seen": {k: v.copy() for k, v in details["vs"].items()},
        "updated_channels": uc if uc is None else fresh(uc),
    }
    if "x" in details:
        checkpoint.update(fresh(details["x"]))
    here = (e.ns, e.cpid)
    pending: builtins.list[PendingWrite] = []
    writes: builtins.list[Write] | None = None
    if here in th.pending:
        writes = builtins.list(self._writes_of(th, here, reader).values())
        writes.sort(key=write_order)
    elif here in th.holders:
        writes = th.held.get(here)
        if writes is None:
            writes = builtins.list(self._writes_of(th, here, reader).values())
            writes.sort(key=write_order)
            th.held[here] = writes
    if writes:
        pending = [(w.task, w.channel, self._write_value(th, w, reader)) for w in writes]
    conf = {"thread_id": th.thread_id, "checkpoint_ns": e.ns, "checkpoint_id": e.cpid}
    parent: Any = None
    if e.parent:
        parent = {"configurable": {**conf, "checkpoint_id": e.parent}}
    md: Any = fresh(details["md"])
    config: Any = {"configurable": conf}
    tup = CheckpointTuple(config, checkpoint, md, parent, pending)
    return tup, cache


def _write_value(self: StashpointSaver, th: Thread, w: Write, reader: Reader) -> Any:
    if isinstance(w.value, Ref):
        holder = th.records.get(w.holder or "")
        conv = holder.record.state.conversation if holder is not None else None
        if conv is None:
            raise IntegrityError(f"checkpoint {w.holder} lost the messages of a write")
        got = reader.conv_objects(conv, w.value.start, w.value.start + w.value.length)
        if len(got) != w.value.length:
            raise IntegrityError(f"checkpoint {w.holder} lost the messages of a write")
        return got[0] if w.value.single else got
    if isinstance(w.value, builtins.list):
        return [self._loads(v) for v in w.value]
    return self._loads(w.value)


class Reading:
    """The methods above, as :class:`StashpointSaver` has them."""

    _tuple = _tuple
    _write_value = _write_value
