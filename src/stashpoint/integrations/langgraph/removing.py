"""Removing LangGraph checkpoints: hidden from LangGraph and marked pruned for GC, as
stashpoint records are never deleted (their digests chain)."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

from ...langgraph_format import RECORD_META as _META
from ...session import Session
from .pending import PendingMap
from .reading import Reader
from .records import Write
from .threads import Thread

if TYPE_CHECKING:
    from .saver import StashpointSaver


# Metadata keys of a DeltaChannel thread (those LangGraph's PostgresSaver checks in prune)
_DELTA_MD = frozenset(("counters_since_delta_snapshot", "delta_writes_versioned"))


def _all_records(self: StashpointSaver, th: Thread) -> set[str]:
    """Every record of the thread's session: LangGraph's and the bookkeeping around them
    (rewinds of time travel and ``restore_files``, earlier ``removed`` heads)."""
    return set(self.store.record_ids(th.session))


def _uses_delta(self: StashpointSaver, thread_id: str) -> bool:
    """Whether a checkpoint of the thread has DeltaChannel counters in its metadata
    (what LangGraph writes while a delta channel's value is not snapshotted)."""
    th = self._thread(thread_id, check=True)
    with th.lock:
        self._prefetch_details(th.entries.values())
        reader = Reader(self)
        return any(
            not _DELTA_MD.isdisjoint(self._details(e, reader)["md"]) for e in th.entries.values()
        )


def _remove(
    self: StashpointSaver, th: Thread, doomed: set[str], *, reason: str, everything: bool = False
) -> None:
    """Hide checkpoints from LangGraph and mark their records pruned for GC.

    Writes that a removed record holds for a checkpoint that stays go back to the pending
    key first; a branch whose head goes gets a ``removed`` checkpoint as its new head.
    """
    reader = Reader(self)
    gone = {key for key, e in th.entries.items() if e.id in doomed}
    back: PendingMap = {}
    if not everything:
        for key, holders in th.holders.items():
            if key in gone or key not in th.entries:
                continue
            for holder in holders:
                if holder.id not in doomed:
                    continue
                for target, w in self._held(holder, reader):
                    if target != key:
                        continue
                    value = self._materialize(th, w, reader)
                    back.setdefault(key, {}).setdefault(
                        (w.task, w.idx), Write(w.task, w.idx, w.channel, w.path, value)
                    )

    def change(pending: PendingMap) -> bool:
        for key, writes in back.items():
            mine = pending.setdefault(key, {})
            for wk, w in writes.items():
                mine.setdefault(wk, w)
        for key in builtins.list(pending):
            if everything or key in gone:
                del pending[key]
        return True

    self._update_pending(th, change)
    for branch, head in self.store.branches(th.session).items():
        if head not in th.removed and (everything or head in doomed):
            Session(self.store, th.session, branch=branch, redact=False).checkpoint(
                {},
                kind="edit",
                message=f"langgraph {reason}: removed from LangGraph's view",
                meta={_META: {"removed": reason}},
            )
    if doomed:
        self.store.prune(th.session, doomed)
    self._load(th)


class Removing:
    """The methods above, as :class:`StashpointSaver` has them."""

    _all_records = _all_records
    _uses_delta = _uses_delta
    _remove = _remove
