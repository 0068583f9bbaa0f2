"""Saving LangGraph checkpoints: each put one record on the branch of its line of history,
encoding only what changed since its parent, with the writes it takes in."""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...conversation import fields_of, snapshot
from ...langgraph_format import RECORD_META as _META
from ...langgraph_format import _text
from ...model import Checkpoint
from ...redact import Redactor
from ...session import Session, same_prefix
from .files import Files, When
from .framework import ChannelVersions
from .reading import Reader
from .records import (
    CONV_KEY,
    DETAILS,
    INLINE_MAX,
    MISSING,
    VALUE,
    CpKey,
    Entry,
    Write,
    WriteKey,
    entry_of,
    untext,
)
from .threads import StateCache, Thread

if TYPE_CHECKING:
    from .saver import StashpointSaver


_KNOWN = frozenset(
    ("v", "id", "ts", "channel_values", "channel_versions", "versions_seen", "updated_channels")
)
_KEEP_BRANCHES = 8  # engine objects and encoded states kept per thread


def _session(self: StashpointSaver, th: Thread, branch: str, ns: str) -> Session:
    s = th.branches.get(branch)
    if s is not None and (s.head.id if s.head is not None else None) != th.heads.get(branch):
        s = None  # another writer moved the branch: a fresh engine object reads it again
    if s is None:
        files = self.workspace is not None and ns == ""
        while len(th.branches) >= _KEEP_BRANCHES:
            del th.branches[next(iter(th.branches))]
        s = th.branches[branch] = Session(
            self.store,
            th.session,
            workspace=self.workspace if files else None,
            branch=branch,
            force=self.force,
            redact=False,  # the saver scrubs values before serializing them (_dumps)
            bind=self.bind,
        )
        if files:
            s.workspace = self._files()  # shared: scans taken ahead, one stat cache
    return s


def _branch_for(
    self: StashpointSaver, th: Thread, ns: str, cpid: str, parent: Entry | None
) -> tuple[str, bool]:
    """The branch a new checkpoint goes on, and whether it starts there at ``parent``."""
    base = "main" if ns == "" else f"ns:{ns}"
    if parent is not None:
        if th.heads.get(parent.record.branch) == parent.id:
            return parent.record.branch, False
        return f"{base}@{cpid}", True
    head = th.heads.get(base)
    if head is None or head in th.removed:
        return base, False
    return f"{base}@{cpid}", False


def _put(
    self: StashpointSaver,
    th: Thread,
    ns: str,
    checkpoint: dict[str, Any],
    md: dict[str, Any],
    new_versions: ChannelVersions,
    parent: str | None,
    when: When,
) -> None:
    cpid = str(checkpoint["id"])
    pe = th.entries.get((ns, parent)) if parent else None
    if parent and pe is None and (ns, parent) not in th.known:  # another process's?
        self._load(th)
        pe = th.entries.get((ns, parent))
    cache = None
    if pe is not None:
        for c in (th.caches.get(pe.record.branch), th.last_read):
            if c is not None and c.of == pe.id:
                cache = c
                break
    reader = Reader(self)
    versions = dict(checkpoint.get("channel_versions") or {})
    values = checkpoint.get("channel_values") or {}
    pversions = self._details(pe, reader)["cv"] if pe is not None else {}
    conv_ch = self.conversation_channel
    state: dict[str, Any] = {}
    new_values: dict[str, tuple[Any, Any, bytes]] = {}
    conv_views: builtins.list[Any] | None = None
    conv_items: builtins.list[str] | None = None
    inline: dict[str, str] = {}
    appended_from = 0
    for ch, ver in versions.items():
        # A channel whose version did not move keeps the parent's value (LangGraph's
        # savers store a value only for the channels in new_versions).
        inherit = pe is not None and ch not in new_versions and pversions.get(ch) == ver
        if ch == conv_ch:
            if inherit and pe is not None and pe.record.state.conversation is not None:
                if cache is not None and cache.conv_items is not None:
                    conv_views, conv_items = cache.conv_views, cache.conv_items
                else:
                    conv_items = reader.conv_items(pe.record.state.conversation)
                appended_from = len(conv_items)
                state[CONV_KEY] = conv_items
                continue
            if not inherit and type(values.get(ch)) is builtins.list:
                conv_items, appended_from, conv_views = self._encode_conversation(values[ch], cache)
                state[CONV_KEY] = conv_items
                continue
        packed: bytes | None = None
        obj: Any = MISSING
        if inherit and pe is not None:
            old = cache.values.get(ch) if cache is not None else None
            if old is not None and old[0] == ver:
                obj, packed = old[1], old[2]
            elif (hexd := pe.record.state.values.get(VALUE + ch)) is not None:
                packed = reader.packed_value(hexd)
            elif (text := self._details(pe, reader).get("iv", {}).get(ch)) is not None:
                packed = untext(text, "channel value")
        if packed is None:
            if ch not in values:
                continue  # empty at this version
            obj = values[ch]
            # The same object is not the same value once its version moved: a node may
            # have changed it in place (``s["todo"].append(x); return {"todo": s["todo"]}``).
            old = cache.values.get(ch) if cache is not None and inherit else None
            packed = old[2] if old is not None and old[1] is obj else self._dumps(obj)
        if len(packed) <= INLINE_MAX:  # tiny: cheaper inside the details than on its own
            inline[ch] = _text(packed)
        else:
            state[VALUE + ch] = _text(packed)
        new_values[ch] = (ver, obj, packed)
    details: dict[str, Any] = {
        "ts": checkpoint.get("ts"),
        "v": checkpoint.get("v"),
        "cv": versions,
        "vs": checkpoint.get("versions_seen") or {},
        "md": md,
    }
    if inline:
        details["iv"] = inline
    if checkpoint.get("updated_channels") is not None:
        details["uc"] = checkpoint["updated_channels"]
    extra = {k: v for k, v in checkpoint.items() if k not in _KNOWN}
    if extra:
        details["x"] = extra
    if CONV_KEY in state and conv_ch != CONV_KEY:
        details["conv"] = conv_ch
    # Writes move into the new record: its parent's, and those of any saved checkpoint
    # that arrived after that checkpoint's child (LangGraph saves both concurrently).
    moved = {key: th.pending.pop(key) for key in builtins.list(th.pending) if key in th.known}
    targets: builtins.list[CpKey] = []
    if moved:
        home = (ns, parent or "")
        details["w"] = self._embed(th, moved, home, conv_items, appended_from, reader)
        targets = [key for key in moved if key != home]
    try:
        sealed = self._commit(th, ns, cpid, parent, pe, details, state, when=when, targets=targets)
    except BaseException:
        for key, writes in moved.items():
            th.pending.setdefault(key, {}).update(writes)
        raise
    entry = entry_of(sealed, sealed.meta[_META])
    entry.details = details
    self._index(th, entry)
    conv = sealed.state.conversation
    if conv is not None and conv_items is not None:
        self._views.wrote(conv, conv_items)
    th.caches.pop(sealed.branch, None)
    th.caches[sealed.branch] = StateCache(
        sealed.id,
        conv_views,
        conv_items,
        new_values,
    )
    while len(th.caches) > _KEEP_BRANCHES:  # the lines written last (each holds messages)
        del th.caches[next(iter(th.caches))]


def _encode_conversation(
    self: StashpointSaver, msgs: builtins.list[Any], cache: StateCache | None
) -> tuple[builtins.list[str], int, builtins.list[Any]]:
    """Packed messages, the parent's reused for the prefix they share, and copies of the
    messages' contents to compare the next put's with.

    The prefix is found by content, not identity: a node that changes a message in place
    and returns it (``msg.content = "edited"; return {"messages": [msg]}``) hands back the
    very object of the parent's list, and the change must still be stored. What is
    compared is each message's ``__dict__`` (a LangChain message's fields) with a copy
    taken when it was stored: one ``list ==`` in C over dicts whose unchanged strings
    are the same objects. That costs ~2,200 CPU instructions a message at every put
    (~300 to reach its ``__dict__``, ~1,900 to compare its 6-9 fields; the identity test
    it replaced took ~8), ~4.4 M at 2,000 messages where the rest of a put is ~1.5 M,
    against ~15 us to serialize one message again; no cheaper test sees a change in
    place (the objects and their dicts stay the same; only their contents tell).
    """
    old_views = cache.conv_views if cache is not None else None
    old_items = cache.conv_items if cache is not None else None
    views = fields_of(msgs)
    if old_views is None or old_items is None:
        n, items, kept = 0, [], []
    else:  # each list copied once (the parent's stay as they are: other caches hold them)
        n = same_prefix(views, old_views)
        items, kept = old_items[:n], old_views[:n]
    if n < len(msgs):  # copies first: a node that runs on while this put does (durability
        # "async") may change a message in place; then the stored form is the newer one and
        # the next put, comparing with the older copy, stores the change again, never misses it
        kept.extend(map(snapshot, views[n:]))
        items.extend([_text(self._dumps(m)) for m in msgs[n:]])
    return items, n, kept


def _embed(
    self: StashpointSaver,
    th: Thread,
    moved: dict[CpKey, dict[WriteKey, Write]],
    home: CpKey,
    conv: builtins.list[str] | None,
    start: int,
    reader: Reader,
) -> builtins.list[builtins.list[Any]]:
    """Pending writes as the new record keeps them, ``[task, idx, channel, path, value]``
    (plus ``ns, checkpoint id`` for another checkpoint than the record's parent, ``home``).
    A write that is messages of this record's conversation becomes a reference to them:
    a step's new messages are stored once, not twice."""
    out: builtins.list[builtins.list[Any]] = []
    for key, writes in moved.items():
        for w in writes.values():
            packed = self._materialize(th, w, reader)
            many = isinstance(packed, builtins.list)
            items = (
                [_text(v) for v in packed] if isinstance(packed, builtins.list) else [_text(packed)]
            )
            value: Any = items if many else items[0]
            k = len(items)
            if conv is not None and k and w.channel == self.conversation_channel:
                # the parent's writes are what this record appended; later ones are near
                # the end of the conversation
                lo = start if key == home else max(0, len(conv) - k - 512)
                for a in range(len(conv) - k, lo - 1, -1):
                    if conv[a] == items[0] and conv[a : a + k] == items:
                        value = [a, k, not many]
                        break
            row = [w.task, w.idx, w.channel, w.path, value]
            out.append(row if key == home else [*row, *key])
    return out


def _commit(
    self: StashpointSaver,
    th: Thread,
    ns: str,
    cpid: str,
    parent: str | None,
    pe: Entry | None,
    details: dict[str, Any],
    state: dict[str, Any],
    *,
    when: When | None = None,
    targets: Sequence[CpKey] = (),
) -> Checkpoint:
    state[DETAILS] = self._details_text(details)
    meta: dict[str, Any] = {"id": cpid}
    if parent:
        meta["p"] = parent
    if ns:
        meta["ns"] = ns
    if targets:  # whose writes it holds, besides its parent's (read without the details)
        meta["wt"] = [builtins.list(t) for t in targets]
    branch, fork = self._branch_for(th, ns, cpid, pe)
    if fork:
        assert pe is not None
        self.store.start_branch(th.session, branch, pe.id)
        th.heads[branch] = pe.id
    session = self._session(th, branch, ns)
    # A fork checkpoint (a replay's first) is a copy of its parent, files included; a copy
    # (``when`` None) records no files; every other put snapshots the workspace.
    files = when is not None and when.source != "fork"
    ws = session.workspace if files and isinstance(session.workspace, Files) else None
    with self._files_lock if ws is not None else contextlib.nullcontext():
        if ws is not None:
            # the files of this checkpoint's superstep (else the put scans them now); a
            # restore below takes them as its safety checkpoint's and then scans anew
            ws.ahead = self._ahead_for(details["cv"])
        try:
            if fork and when is not None and session.workspace is not None and pe is not None:
                self._restore_for(th, session, pe, when)
            expected = session.head.id if session.head is not None else None
            md = details.get("md") or {}
            what = f"{md.get('source', 'put')} step {md.get('step')}" + (f" [{ns}]" if ns else "")
            record_meta: dict[str, Any] = {_META: meta}
            red = self.redactor
            if isinstance(red, Redactor) and red.counts:
                record_meta["stashpoint_redacted"] = dict(sorted(red.counts.items()))
                red.counts.clear()
            sealed = session.checkpoint(
                state, kind="auto", message=what, meta=record_meta, files=files
            )
        finally:
            if ws is not None:
                ws.ahead = None
    th.heads[branch] = sealed.id
    th.restored = None
    if sealed.parent != expected:  # another writer got in between: re-read next time
        th.loaded = False
    return sealed


def _copy_entry(self: StashpointSaver, dst: Thread, e: Entry, reader: Reader) -> None:
    """Put one checkpoint of another thread into ``dst`` as it is stored."""
    cp = e.record
    state: dict[str, Any] = {
        k: _text(reader.packed_value(h)) for k, h in cp.state.values.items() if k.startswith(VALUE)
    }
    if cp.state.conversation is not None:
        state[CONV_KEY] = reader.conv_items(cp.state.conversation)
    details = dict(self._details(e, reader))
    pe = dst.entries.get((e.ns, e.parent)) if e.parent else None
    home = (e.ns, e.parent or "")
    targets = [t for t in e.targets if t != home]
    sealed = self._commit(dst, e.ns, e.cpid, e.parent, pe, details, state, targets=targets)
    entry = entry_of(sealed, sealed.meta[_META])
    self._index(dst, entry)


class Writing:
    """The methods above, as :class:`StashpointSaver` has them."""

    _session = _session
    _branch_for = _branch_for
    _put = _put
    _encode_conversation = _encode_conversation
    _embed = _embed
    _commit = _commit
    _copy_entry = _copy_entry
