"""The engine's core: a session (one agent run) and how a checkpoint is written.

A session is one agent run. It has branches; each branch has a head checkpoint and, through a
*checkout*, the workspace directory that follows it. Checkpoints are built here, sealed into the
hash chain, and committed in one backend transaction that compare-and-sets the branch head, so
two writers never lose a checkpoint: the loser re-reads the head and retries (the snapshot it
took stays valid; only the parent link and the conversation log position are recomputed).

The rest of a session's methods live with their concern, each module joining its part into
:class:`Session`: reading (:mod:`stashpoint.history`), the workspace and where restores may
write (:mod:`stashpoint.binding`), rewind and fork (:mod:`stashpoint.rewind`), operator edits
(:mod:`stashpoint.edit`), durable execution (:mod:`stashpoint.durable_surface`), the
conversation log (:mod:`stashpoint.conversation`) and the lease (:mod:`stashpoint.lease`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from . import serde
from ._ids import check_name as _check_name
from ._ids import new_id
from ._runs import UNREAD as _INHERIT
from ._store import Store, config_hash
from .binding import Binding, open_workspace
from .conversation import Known, KnownConversation, copied, plain_copy, same_prefix
from .durability import Durability
from .durable_surface import DurableMethods, policy
from .edit import Editing
from .errors import (
    ConflictError,
    IntegrityError,
    LeaseHeld,
    LeaseLost,
    StashpointWarning,
    UsageError,
)
from .history import Reading, checkpoint_json
from .lease import Lease, LeaseHolder
from .lease import for_session as lease_for_session
from .model import KINDS, Checkpoint, ConversationRef, LogRef, StateRef, WorkspaceRef, utc_now_iso
from .redact import Redactor, make_redactor
from .rewind import Restoring, RewindResult
from .stores.base import BlobRow, CheckpointRow, Commit, Fence
from .workspace import Workspace

if TYPE_CHECKING:
    from .durable import Durable
    from .notify import Notifier
    from .statediff import CheckpointDiff

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")
Migration = Callable[[dict[str, Any]], dict[str, Any]]


def __getattr__(name: str) -> Any:
    # CheckpointDiff lives with the code that renders diffs, imported on first use: a
    # process that only checkpoints (an agent hook) does not pay for it.
    if name == "CheckpointDiff":
        from .statediff import CheckpointDiff

        return CheckpointDiff
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CheckpointDiff",
    "RewindResult",
    "Session",
    "StashpointWarning",
    "checkpoint_json",
    "copied",
    "plain_copy",
    "same_prefix",
]


_MAX_RETRIES = 50


def _backoff(attempt: int) -> None:
    """Jittered exponential pause after losing a head race: writers that collided once would
    otherwise collide again at once (up to 50 ms; the first retry is immediate)."""
    if attempt:
        time.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))


def _holding_write_lock(
    method: Callable[Concatenate[Session, P], R],
) -> Callable[Concatenate[Session, P], R]:
    """Serialise a write with the session's other writers in this process (a timer thread
    checkpoints during long durable steps)."""

    @functools.wraps(method)
    def locked(self: Session, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._write_lock:
            return method(self, *args, **kwargs)

    return locked


def _deps(packages: Iterable[str]) -> dict[str, str]:
    from . import __version__

    # what platform.python_version() returns, without importing platform (~3 ms, 9 regexes)
    out = {"python": sys.version.split()[0], "stashpoint": __version__}
    packages = list(packages)
    if not packages:
        return out
    from importlib import metadata  # ~25 ms to import: only when there is something to ask

    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _warn_left_out(paths: list[str], what: str) -> None:
    """Say which paths a snapshot left out (the first five), once per snapshot."""
    if paths:
        shown = ", ".join(paths[:5]) + (" …" if len(paths) > 5 else "")
        warnings.warn(
            f"left out {len(paths)} " + what.format(shown), StashpointWarning, stacklevel=4
        )


class Session(Reading, Binding, KnownConversation, Restoring, Editing, DurableMethods, LeaseHolder):
    """Checkpoints of one agent run.

    Args:
        store: where checkpoints live.
        name: session name (one agent run / thread).
        workspace: directory snapshotted with every checkpoint (None: state only).
        branch: branch to work on; default: the branch this workspace follows, else ``main``.
        config: the agent's configuration; its hash is recorded, and resuming under a
            different one warns.
        schema_version: version of your state layout, recorded for migrations.
        packages: distributions whose versions are recorded with each checkpoint.
        conversation_key: state key holding the message list, stored as an append-only log.
        force: allow a workspace at ``/`` or ``$HOME``.
        checkpoint_every: automatic checkpoints in a durable run: after every ``"step"``
            (durable steps and tools), ``"tool"`` call or ``"task"``, a combination, or None
            (only manual ones). Any policy also checkpoints before every irreversible tool.
        migrations: ``{version: fn}`` upgrading a state dict from ``version`` to
            ``version + 1``; applied on load to checkpoints older than ``schema_version``.
        notify: who to tell when a durable run pauses for a human: a shell command (gets
            the JSON on stdin), an http(s) webhook URL, or a callable; default
            ``$STASHPOINT_NOTIFY``. See :mod:`stashpoint.notify`.
        checkpoint_interval: in a durable run, also checkpoint every this many seconds
            while a single step runs (long steps), from a background thread.
        validators: functions that check a state an operator edited (:meth:`edit`): raise,
            or return False or an error message, to refuse it.
        lease: own the session while this object writes to it (many workers sharing one
            store): ``True`` (default ttl), a ttl in seconds, or a :class:`~stashpoint.Lease`
            from :meth:`Store.lease`. Every write then carries the lease's fencing token;
            :meth:`close` releases it. Held by another live worker: :class:`LeaseHeld`.
        watch: keep an inotify watch on the workspace (Linux) so that each snapshot re-reads
            only the directories that changed instead of stat-ing every file; for long-running
            agents that checkpoint often. Falls back to scanning wherever it cannot vouch.
        redact: scrub secrets (API keys, tokens, private keys, values of keys named like
            ``password``) from state, conversation, message and meta before anything is
            persisted: True, False, a ``{name: regex}`` of extra patterns, or a callable.
            Default: on, unless ``[tool.stashpoint] redact = false``. See
            :mod:`stashpoint.redact`.
        durability: when a checkpoint is on disk: ``"fsync"`` (before :meth:`checkpoint`
            returns), ``"group"`` / ``"group:N,Tms"`` (flushed every N checkpoints or T ms)
            or ``"exit"`` (when the store closes); default: the store's. Safety checkpoints
            taken before a rewind are always fsynced. See :mod:`stashpoint.durability`.
        bind: ``workspace`` is the directory the user named for restores: a rewind or fork
            writes there even when the branch was snapshotted in another directory (or
            imported), and binds the branch to it. Without it such a restore is refused
            (see :mod:`stashpoint.restore_target`).
    """

    def __init__(
        self,
        store: Store,
        name: str = "main",
        *,
        workspace: str | os.PathLike[str] | None = None,
        branch: str | None = None,
        config: Any = None,
        schema_version: int = 1,
        packages: Iterable[str] = (),
        conversation_key: str = "messages",
        force: bool = False,
        watch: bool = False,
        checkpoint_every: str | Iterable[str] | None = None,
        migrations: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]] | None = None,
        notify: Notifier | None = None,
        checkpoint_interval: float | None = None,
        validators: Iterable[Callable[[dict[str, Any]], Any]] = (),
        lease: Lease | bool | float | None = None,
        redact: bool | Mapping[str, str] | Callable[[Any], Any] | None = None,
        durability: Durability | str | None = None,
        bind: bool = False,
    ) -> None:
        _check_name("session", name)
        if checkpoint_interval is not None and checkpoint_interval <= 0:
            raise UsageError("checkpoint_interval must be a positive number of seconds")
        self.redactor = make_redactor(redact, Path(workspace) if workspace is not None else None)
        # The redactor's last inputs (copies) and outputs (the copies checkpointed), and the
        # list it is working on until its checkpoint commits: (given, how many reused, output)
        self._redacted: tuple[list[Any], list[Any]] = ([], [])
        self._redacting: tuple[list[Any], int, list[Any]] | None = None
        self.store, self.name = store, name
        self.durability = store.durability if durability is None else Durability.parse(durability)
        self.conversation_key, self.schema_version = conversation_key, schema_version
        self.config_hash, self._deps = config_hash(config), _deps(packages)
        self.root: Path | None = None
        self.workspace: Workspace | None = None
        if workspace is not None:
            self.root, self.workspace = open_workspace(
                store, Path(workspace), force=force, watch=watch
            )
        self.explicit_root = bind
        self._bound: tuple[str, str | None] | None = None  # (branch, its binding) once read
        self._bound_here: str | None = None  # the branch known to be bound to this workspace
        self.branch = branch if branch is not None else self._checkout_branch() or "main"
        _check_name("branch", self.branch)
        self._head: Checkpoint | None = None
        self._head_loaded = False
        self._conv_objs: Known | None = None  # messages as of self._head, for prefix checks
        self._log_tips: dict[str, int] = {}
        self.migrations: dict[int, Migration] = dict(migrations or {})
        self.validators: list[Callable[[dict[str, Any]], Any]] = list(validators)
        self._policy, self.checkpoint_interval = policy(checkpoint_every), checkpoint_interval
        self.notify: Notifier | None = notify or os.environ.get("STASHPOINT_NOTIFY") or None
        self._durable: Durable | None = None
        self._run_record: Any = _INHERIT  # the branch's durable-run record, read on first use
        self._write_lock = threading.RLock()
        self.lease, self._owns_lease = lease_for_session(store.meta, name, lease)
        self.complete_interrupted_restore()

    @property
    def fence(self) -> Fence | None:
        """The fencing token every write carries while this session holds a lease."""
        if self.lease is None:
            return None
        self.lease.check()
        return self.lease.fence

    @property
    def head(self) -> Checkpoint | None:
        """The branch head (verified), or None for a branch with no checkpoint yet."""
        if not self._head_loaded:
            self._reload_head()
        return self._head

    @property
    def durable(self) -> Durable:
        """The durable-execution engine of this session (see :mod:`stashpoint.durable`)."""
        if self._durable is None:
            from .durable import Durable  # on first use: most processes never run one

            self._durable = Durable(self, self._policy)
        return self._durable

    # -- writing ------------------------------------------------------------------------
    def _message_rows(self, log: str, stop: int) -> list[tuple[bytes, bytes]]:
        """(chain, data) of messages [0, stop) of a log, following fork parents."""
        segments: list[tuple[str, int, int]] = []
        while stop > 0:
            info = self.store.meta.log_info(log)
            if info is None:
                raise IntegrityError(f"conversation log {log} is missing")
            start = info.parent_len if info.parent is not None else 0
            if stop > start:  # else all of [0, stop) lies in the parent (shrunk twice)
                segments.append((log, start, stop))
            if info.parent is None or start == 0:
                break
            log, stop = info.parent, min(start, stop)
        out: list[tuple[bytes, bytes]] = []
        for seg_log, start, seg_stop in reversed(segments):
            rows = self.store.meta.read_messages(seg_log, start, seg_stop)
            if len(rows) != seg_stop - start or any(r.idx != start + i for i, r in enumerate(rows)):
                raise IntegrityError(f"conversation log {seg_log} has missing messages")
            out.extend((r.chain, r.data) for r in rows)
        return out

    def _load_messages(self, conv: ConversationRef) -> list[Any]:
        return self._load_conversation(conv).objs

    # -- writing --------------------------------------------------------------------------
    @_holding_write_lock
    def checkpoint(
        self,
        state: Mapping[str, Any] | None = None,
        *,
        message: str | None = None,
        label: str | None = None,
        kind: str = "manual",
        step: int | None = None,
        meta: Mapping[str, Any] | None = None,
        files: bool = True,
        progress: Callable[[int, int], None] | None = None,
        skip_unchanged: bool = False,
        status: str | None = None,
        journal: LogRef | None = _INHERIT,
        artifacts: Mapping[str, str | os.PathLike[str] | None] | None = None,
        append_messages: Sequence[Any] | None = None,
        expect_head: str | None = None,
    ) -> Checkpoint:
        """Record a checkpoint of ``state`` (default: the head's state, unchanged) and the
        workspace (when the session has one and ``files`` is true), atomically.

        ``append_messages`` adds messages to the end of the conversation the branch head has
        when the checkpoint is committed: when another writer moved the head meanwhile, they
        are appended after that writer's messages (a whole ``state`` is written as given,
        replacing them). ``state`` may then set values but not the conversation.

        ``artifacts`` attaches large files outside the workspace by name (``{"weights":
        path}``; None detaches a name), stored as content-defined chunks. A
        checkpoint keeps its parent's other artifacts: attach a name again when its file
        changed.

        ``expect_head`` (a checkpoint id, or ``""`` for a branch without one) commits only on
        that head and raises :class:`ConflictError` if another writer moved it: a caller that
        derived ``state`` from the head it read does not overwrite what it did not see.

        With ``skip_unchanged`` and no ``state``, a workspace identical to the head's returns
        the head instead of recording a duplicate (what agent hooks that fire after every tool
        call want).
        """
        if kind not in KINDS:
            raise UsageError(f"unknown checkpoint kind {kind!r}; one of {', '.join(KINDS)}")
        added: list[bytes] | None = None
        if append_messages is not None:
            if state is not None and self.conversation_key in state:
                raise UsageError(
                    f"append_messages adds to the conversation: state cannot also set "
                    f"{self.conversation_key!r}"
                )
            append_messages = list(append_messages)
        if self.redactor is not None:
            if append_messages is not None:
                append_messages = [self.redactor(m) for m in append_messages]
            state, message, meta = self._redact(state, message, meta)
            label = self._redact_label(label)
        if message is not None:
            message = _unicode_text(message)
        if append_messages is not None:
            added = [serde.encode(m) for m in append_messages]  # once, for every attempt
        ws_ref: WorkspaceRef | None = None
        ws_rows: list[BlobRow] = []
        if files and self.workspace is not None:
            if kind != "pre-rewind":  # (a restore's safety copy: the restore was checked)
                self._check_snapshot_here()
            result, ws_rows = self.workspace.scan(progress=progress)
            ws_ref = WorkspaceRef(str(self.root), result.tree.hex(), result.files, result.bytes)
            _warn_left_out(
                result.skipped,
                "path(s) that are neither file, directory nor symlink (sockets, FIFOs, "
                "devices): {}",
            )
            _warn_left_out(
                result.mounts,
                "mount point(s), another filesystem mounted in the workspace: {}; a rewind "
                "leaves them as they are",
            )
            head = self.head
            if (
                skip_unchanged
                and state is None
                and not artifacts
                and head is not None
                and head.workspace is not None
                and head.workspace.tree == ws_ref.tree
            ):
                # Nothing changed (a hook firing after a read-only tool): no new checkpoint.
                self.workspace.save_cache()
                return head
        values_enc = None
        if state is not None:
            values_enc = {
                k: serde.encode(v) for k, v in state.items() if k != self.conversation_key
            }
            msgs = state.get(self.conversation_key)
            if msgs is not None and not isinstance(msgs, list):
                raise UsageError(f"state[{self.conversation_key!r}] must be a list of messages")
        meta_tree = serde.to_tree(dict(meta)) if meta else {}
        art_refs: Mapping[str, Any] = {}
        art_rows: list[BlobRow] = []
        if artifacts:
            from .artifacts import store_artifacts

            art_refs, art_rows = store_artifacts(self.store.blobs, artifacts, progress)
        for _attempt in range(_MAX_RETRIES):
            head = self.head
            if expect_head is not None and (head.id if head else "") != expect_head:
                self._reload_head()  # this object's view may be what is out of date
                head = self.head
                if (head.id if head else "") != expect_head:
                    raise ConflictError(f"session {self.name!r} branch {self.branch!r} moved on")
            if ws_ref is None and head is not None and not files:
                ws_ref = head.workspace
            if added is not None:
                conv, append = self._conversation_appended(head, added)
            else:
                conv, append = self._conversation_for(head, state)
            values, value_rows = self._values_for(head, values_enc)
            jref = self._journal_ref(head) if journal is _INHERIT else journal
            cp = Checkpoint(
                id=new_id(),
                session=self.name,
                branch=self.branch,
                parent=head.id if head else None,
                parent_digest=head.digest if head else None,
                step=step if step is not None else (head.step + 1 if head else 1),
                kind=kind,
                label=label,
                message=message,
                created_at=utc_now_iso(),
                # A checkpoint that keeps the head's state (a CLI snap, an approval) keeps
                # its schema version; one made without an agent config keeps the head's.
                schema_version=(
                    self.schema_version
                    if state is not None or added is not None or head is None
                    else head.schema_version
                ),
                config_hash=self.config_hash or (head.config_hash if head else None),
                deps=self._deps,
                state=StateRef(conv, values),
                workspace=ws_ref,
                journal=jref,
                status=status,
                meta=meta_tree,
                artifacts=_merge_artifacts(head, art_refs),
            )
            sealed, body = self.store.hasher.seal(cp)
            row = CheckpointRow(cp.id, cp.session, cp.branch, cp.parent, body, sealed.digest)
            try:
                self.store.meta.commit(
                    Commit(
                        row,
                        head.id if head else None,
                        append,
                        [*ws_rows, *value_rows, *art_rows],
                        fence=self.fence,
                        durable=not self.durability.deferred,
                    )
                )
            except LeaseHeld:
                raise  # not a race to retry: this writer may not write at all
            except LeaseLost as exc:
                if self.lease is not None:  # labels and step bodies are refused from now on
                    self.lease.mark_lost(str(exc))
                raise
            except ConflictError:
                self._head_loaded = False
                self._log_tips.clear()
                _backoff(_attempt)
                continue
            self.store.committed(self.durability)
            if append is not None:
                self._log_tips[append.log] = append.start + len(append.messages)
            if append_messages is not None:
                self._known_appended(head, append_messages, added or [])
            elif state is not None:
                self._known_written(state.get(self.conversation_key), append)
            self._head = sealed
            self._head_loaded = True
            if label is not None:
                self._set_label(sealed.id, label)
            if self.workspace is not None and files:
                self.workspace.save_cache()
                if kind != "pre-rewind":  # a restore's safety copy binds nothing
                    self._bind_on_checkpoint()
            return sealed
        raise ConflictError(
            f"gave up after {_MAX_RETRIES} attempts: session {self.name!r} branch "
            f"{self.branch!r} is being written by others too fast"
        )

    def _redact(
        self, state: Mapping[str, Any] | None, message: str | None, meta: Mapping[str, Any] | None
    ) -> tuple[Mapping[str, Any] | None, str | None, Mapping[str, Any] | None]:
        """Scrubbed copies (the caller's objects are never mutated). Messages already
        checkpointed are not scanned again: a message equal to one redacted for an earlier
        checkpoint reuses that result (compared with a copy of the message as it was then, so
        one changed in place since is scanned again), so the cost per checkpoint stays that of
        the new messages."""
        fn = self.redactor
        assert fn is not None
        self._redacting = None
        if state is not None:
            key = self.conversation_key
            out = dict(fn({k: v for k, v in state.items() if k != key}))
            msgs = state.get(key)
            if isinstance(msgs, list):
                given, done = self._redacted
                k = same_prefix(msgs, given)
                red = done[:k]
                red += [fn(m) for m in msgs[k:]]
                self._redacting = (msgs[k:], k, red)
                out[key] = red
            elif msgs is not None:
                out[key] = msgs  # checkpoint() refuses it with a clear error
            state = out
        if message is not None:
            message = fn(message)
            if not isinstance(message, str):
                raise UsageError("the redactor returned a non-string for the checkpoint message")
        if meta:
            meta = fn(dict(meta))
        if isinstance(fn, Redactor) and fn.counts:
            meta = {**(meta or {}), "stashpoint_redacted": dict(sorted(fn.counts.items()))}
            fn.counts.clear()
        return state, message, meta

    def _values_for(
        self, head: Checkpoint | None, encoded: dict[str, bytes] | None
    ) -> tuple[dict[str, str], list[BlobRow]]:
        if encoded is None:
            return (dict(head.state.values) if head else {}), []
        old = head.state.values if head else {}
        values: dict[str, str] = {}
        rows: list[BlobRow] = []
        for key, data in encoded.items():
            digest = hashlib.sha256(data).digest()
            hexd = digest.hex()
            values[key] = hexd
            if old.get(key) != hexd:
                rows.append(self.store.blobs.encode(digest, data))
        return values, rows

    def _redact_label(self, label: str | None) -> str | None:
        """A label is stored as given, in the record and the label index: scrubbed like a
        message (a label holding a secret is renamed ``[REDACTED:<kind>]``)."""
        fn = self.redactor
        if label is None or fn is None:
            return label
        if isinstance(fn, Redactor):  # a label is not a checkpoint's content: not counted
            pending = fn.counts.copy()
            out = fn.scrub(label)
            fn.counts = pending
            return out
        out = fn(label)
        if not isinstance(out, str):
            raise UsageError("the redactor returned a non-string for the checkpoint label")
        return out


def _merge_artifacts(head: Checkpoint | None, changes: Mapping[str, Any]) -> dict[str, Any]:
    base = head.artifacts if head is not None else {}
    if not changes:
        return dict(base)
    from .artifacts import merge

    return merge(base, changes)


def _unicode_text(text: str) -> str:
    """``text`` storable as UTF-8: a lone surrogate (from ``json.loads`` of a tool's broken
    output, which an integration may quote in a checkpoint message) becomes U+FFFD, as a
    decoder would show it. Messages describe checkpoints; state values keep theirs exactly."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
