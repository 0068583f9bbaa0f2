"""The workspace files of LangGraph checkpoints: a scan taken at each superstep's end, the
files put back on time travel, and :meth:`StashpointSaver.restore_files`."""

from __future__ import annotations

import builtins
import contextvars
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ...errors import UsageError
from ...session import RewindResult, Session, StashpointWarning
from ...stores.base import BlobRow
from ...workspace import ScanResult, Workspace, check_root
from ...workspace.statcache import StatCache
from .framework import RunnableConfig
from .records import Entry
from .threads import Thread, describe

if TYPE_CHECKING:
    from .saver import StashpointSaver


FILES_BRANCH = "langgraph-files"
"""Branch where :meth:`StashpointSaver.restore_files` records its safety and rewind
checkpoints (outside LangGraph's lines of history)."""
DURABILITY = "__pregel_durability"  # where LangGraph's configurable says how it saves


class When(NamedTuple):
    """How LangGraph saves a checkpoint: its metadata ``source`` and the run's durability."""

    source: str
    durability: str | None

    @property
    def racing(self) -> bool:
        """Saved while the next step may already run (LangGraph's default durability)."""
        return self.source in ("input", "loop") and self.durability not in ("sync", "exit")


class Ahead(NamedTuple):
    """A workspace scan taken at a superstep's end, for the checkpoint of that superstep."""

    result: ScanResult
    rows: builtins.list[BlobRow]
    """Blob rows the scan found missing from the store: committed with the checkpoint."""
    scanned: StatCache | None
    pending: StatCache | None
    """The stat cache the scan built: the baseline of later scans once committed."""


class Files(Workspace):
    """The saver's workspace, one object shared by its root-namespace sessions, whose scan
    can be taken ahead (:meth:`StashpointSaver.get_next_version`) and handed to the put.

    ``Session.checkpoint`` scans its workspace itself; set :attr:`ahead` and that scan is the
    one taken ahead. Only while holding the saver's files lock: a scan keeps its stat cache in
    the workspace until the checkpoint commits (:meth:`Workspace.save_cache`)."""

    ahead: Ahead | None = None

    def scan(self, *, progress: Any = None) -> tuple[ScanResult, builtins.list[BlobRow]]:
        got, self.ahead = self.ahead, None
        if got is None:
            return super().scan(progress=progress)
        self._scanned, self._pending_cache = got.scanned, got.pending
        return got.result, got.rows

    def scan_ahead(self) -> Ahead:
        result, rows = super().scan()
        got = Ahead(result, rows, self._scanned, self._pending_cache)
        self._scanned = self._pending_cache = None
        return got


@dataclass
class _Loop:
    """A graph run, as its first call (``get_tuple``, in the run's own context) shows it."""

    saver: int
    root: bool
    """The root namespace: a subgraph's supersteps need no scan (its checkpoints have no files)."""
    sync: bool
    """``durability="sync"``: each put is done before the next step starts, and scans then."""
    exit: bool
    """``durability="exit"``: only the last superstep's scan is ever put."""
    last: int | None = None
    """The version of its last scan taken ahead."""


_LOOP: contextvars.ContextVar[_Loop] = contextvars.ContextVar("stashpoint_lg_loop")
_KEEP_AHEAD = 32  # scans taken ahead and not yet put (subgraph steps, interrupts, forks)


def restore_files(self: StashpointSaver, config: RunnableConfig) -> RewindResult:
    """Put the workspace files back as they were at a checkpoint (the thread's latest if
    the config names none), into the saver's workspace only when the thread's
    checkpoints were taken there (or the saver was made with ``bind=True``). A safety
    checkpoint of the files there now comes first, on branch ``langgraph-files``: the
    result's ``undo`` is the shell command that undoes it, from any directory."""
    if self.workspace is None:
        raise UsageError("this saver has no workspace directory to restore files into")
    th, entry = self._find(config)
    if entry is None:
        raise UsageError(f"no LangGraph checkpoint for {describe(config)}")
    if entry.record.workspace is None:
        raise UsageError(f"checkpoint {entry.cpid} has no workspace snapshot")
    with th.lock, self._files_lock:
        files = Session(
            self.store,
            th.session,
            workspace=self.workspace,
            branch=FILES_BRANCH,
            force=self.force,
            redact=False,
            bind=self.bind,
        )
        result = files.rewind(entry.id, state=False)
        th.heads = self.store.branches(th.session)
        th.restored = entry.id  # a replay from there need not (and must not) restore again
        return result


def get_next_version(self: StashpointSaver, current: int | None, channel: None = None) -> int:
    """The next channel version; and, with a workspace, the moment a superstep's files
    are taken.

    **Why here.** A checkpoint's files must be the workspace as its superstep left it.
    LangGraph creates the checkpoint at the superstep boundary but hands it to ``put`` in
    a background thread; in its default durability, ``"async"``, the next superstep's
    nodes already run meanwhile, so a scan in ``put`` may see (and in practice does) the
    files the next tool writes. LangGraph calls this method once per superstep boundary
    (``apply_writes``, after every task of the step finished, before the next step's tasks
    are prepared), synchronously, on the thread that runs the graph, in every durability
    mode, and the version it returns goes into that superstep's checkpoint: its highest
    channel version. So the workspace is scanned here and the scan kept under that
    version; the put of the checkpoint whose highest version it is commits it (blobs
    included: a scan taken ahead writes nothing). The other hooks do not fit: ``put`` and
    ``put_writes`` run in background threads, and wrapping the loop's executor would mean
    patching LangGraph's internals.

    **Versions.** One more than both ``current`` and every version this saver handed out
    before: still increasing for every channel, as LangGraph requires, and never the same
    for two boundaries, so the scans of graphs running at once on one saver (two threads,
    a subgraph inside its parent's step) cannot be taken for each other's.

    **Cost.** One workspace scan per superstep, as ``put`` scanned before (``put`` now
    scans only when no scan was taken for its checkpoint: a fork's, a copy's), but on the
    graph's thread: with ``ainvoke``, on the event loop (an incremental scan: a ``stat``
    of each file, a read of the changed ones). A run with ``durability="sync"`` is not
    scanned ahead (LangGraph waits for each put before the next step's nodes run, so the
    put scans, in a worker thread with ``aput``), nor are a subgraph's steps (its
    checkpoints record no files). With ``durability="exit"`` every superstep is still
    scanned, so that the checkpoint saved at exit holds the files of its superstep, not
    those a node interrupted in the next one had already written. While a put commits, a
    scan waits for it (one lock for the workspace's stat cache). Which run calls is told
    by :meth:`get_tuple`, which LangGraph calls first in the run's own context.
    """
    with self._files_lock:
        v = max(current if isinstance(current, int) else 0, self._version) + 1
        self._version = v
    if self.workspace is not None:
        loop = _LOOP.get(None)
        if loop is None or loop.saver != id(self):
            self._scan_ahead(v, None)
        elif loop.root and not loop.sync:
            self._scan_ahead(v, loop)
    return v


def _note_loop(self: StashpointSaver, config: RunnableConfig) -> None:
    """A graph run starts with ``get_tuple`` in its own context: note its namespace."""
    conf = config.get("configurable") or {}
    ns = conf.get("checkpoint_ns") or ""
    how = conf.get(DURABILITY)
    _LOOP.set(_Loop(id(self), ns == "", how == "sync", how == "exit"))


def _files(self: StashpointSaver) -> Files:
    if self._files_ws is None:
        assert self.workspace is not None
        store = self.store
        self._files_ws = Files(
            check_root(Path(self.workspace), force=self.force),
            store.blobs,
            store_id=store.id,
            epoch=store.gc_epoch,
            cache_dir=store.cache_dir,
            exclude=store.own_paths,
        )
    return self._files_ws


def _scan_ahead(self: StashpointSaver, version: int, loop: _Loop | None) -> None:
    with self._files_lock:
        try:
            got = self._files().scan_ahead()
        except Exception:  # the put scans itself, and reports what is wrong
            return
        self._ahead[version] = got
        if loop is not None:
            if loop.exit and loop.last is not None:  # superseded: never put
                self._ahead.pop(loop.last, None)
            loop.last = version
        while len(self._ahead) > _KEEP_AHEAD:
            self._ahead.popitem(last=False)


def _ahead_for(self: StashpointSaver, versions: Mapping[str, Any]) -> Ahead | None:
    """The scan taken at the end of the superstep whose checkpoint has ``versions``."""
    top = max((v for v in versions.values() if type(v) is int), default=None)
    return self._ahead.pop(top, None) if top is not None else None


def _restore_for(
    self: StashpointSaver, th: Thread, session: Session, pe: Entry, when: When
) -> None:
    """A new line of history starts at ``pe``: with ``restore_on_time_travel``, put the
    files back as they were there, when no node can be running (else say why not)."""
    restored, th.restored = th.restored, None
    if not self.restore_on_time_travel or pe.record.workspace is None or restored == pe.id:
        return
    if when.source == "update" or (when.source == "input" and when.durability == "sync"):
        session.rewind(pe.id, state=False)  # after a safety checkpoint: undoable
        return
    how = (
        "a replay runs its first node while LangGraph saves this checkpoint: call "
        "saver.restore_files(config) before graph.invoke(None, config)"
        if when.source == "fork"
        else "run the graph with durability='sync'"
    )
    warnings.warn(
        f"the workspace files were not restored to checkpoint {pe.cpid}: {how}",
        StashpointWarning,
        stacklevel=5,
    )


class WorkspaceFiles:
    """The methods above, as :class:`StashpointSaver` has them."""

    restore_files = restore_files
    get_next_version = get_next_version
    _note_loop = _note_loop
    _files = _files
    _scan_ahead = _scan_ahead
    _ahead_for = _ahead_for
    _restore_for = _restore_for
