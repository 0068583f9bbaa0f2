"""The engine: checkpoint, load, rewind, fork, history and diff for one session.

A session is one agent run. It has branches; each branch has a head checkpoint and, through a
*checkout*, the workspace directory that follows it. Checkpoints are built here, sealed into the
hash chain, and committed in one backend transaction that compare-and-sets the branch head, so
two writers never lose a checkpoint: the loser re-reads the head and retries (the snapshot it
took stays valid; only the parent link and the conversation log position are recomputed).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import os
import random
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast, overload

import msgspec

from . import restore_target, serde
from ._ids import new_id
from ._store import Store, check_not_pruned, config_hash
from .durability import Durability
from .errors import (
    ConflictError,
    IntegrityError,
    LeaseHeld,
    LeaseLost,
    NotFoundError,
    RestoreBlocked,
    SchemaVersionError,
    StashpointError,
    StashpointWarning,
    UsageError,
    ValidationError,
)
from .integrity import EMPTY_CHAIN, message_chain
from .lease import DEFAULT_TTL, Lease
from .lease import acquire as acquire_lease
from .model import KINDS, Checkpoint, ConversationRef, LogRef, StateRef, WorkspaceRef, utc_now_iso
from .redact import Redactor, make_redactor
from .stores.base import BlobRow, CheckpointRow, Commit, Fence, LogAppend, LogInfo, lease_held
from .workspace import RestoreStats, Workspace, check_root, restoring

if TYPE_CHECKING:
    from .durable import Durable, Effect, Pending, RunResult, Task
    from .model import ArtifactRef
    from .notify import Notifier
    from .statediff import CheckpointDiff

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")


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
]

_MAX_RETRIES = 50


def _backoff(attempt: int) -> None:
    """Jittered exponential pause after losing a head race: writers that collided once would
    otherwise collide again at once (up to 50 ms; the first retry is immediate)."""
    if attempt:
        time.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))


_LINK_FILE = ".stashpoint"
_INHERIT: Any = object()
_IMMUTABLE = frozenset((str, bytes, int, float, bool, type(None)))


@dataclass
class _Known:
    """The conversation as last checkpointed, independent of the caller's objects: what a
    new checkpoint's messages are compared against to find the prefix already stored.

    ``objs`` holds copies decoded from the bytes written (a message of an immutable type is
    kept as it is, so that the comparison stays one identity test); ``data`` holds those
    bytes, the arbiter when a message and its copy compare unequal although it encodes the
    same (a ``nan`` inside)."""

    objs: list[Any]
    data: list[bytes]


def _written(msgs: Sequence[Any], data: Sequence[bytes]) -> list[Any]:
    """Copies of ``msgs`` as written (``data``: their encodings), independent of the objects:
    new dicts, lists and tuples around the same immutable leaves (so that comparing a message
    with its copy mostly compares pointers), or the message decoded from its bytes when it
    holds anything else (a registered dataclass, a pydantic model)."""
    out = []
    for m, d in zip(msgs, data, strict=True):
        try:
            out.append(plain_copy(m))
        except TypeError:
            out.append(serde.decode(d))
    return out


def plain_copy(value: Any) -> Any:
    """A copy of the dicts, lists and tuples of ``value`` sharing its immutable leaves
    (strings, numbers, bytes, None); TypeError for anything else inside."""
    t = type(value)
    if t is dict:
        return {k: v if type(v) in _IMMUTABLE else plain_copy(v) for k, v in value.items()}
    if t is list:
        return [v if type(v) in _IMMUTABLE else plain_copy(v) for v in value]
    if t is tuple:
        return tuple([v if type(v) in _IMMUTABLE else plain_copy(v) for v in value])
    if t in _IMMUTABLE:
        return value
    raise TypeError(t.__name__)


def copied(value: Any) -> Any:
    """A deep copy, or (not copyable) a stand-in equal to nothing."""
    try:
        return copy.deepcopy(value)
    except Exception:  # then the value is scanned again next time
        return object()


def same_prefix(msgs: list[Any], known: list[Any]) -> int:
    """How many leading items of ``msgs`` equal those of ``known``: one comparison in C for
    the usual case (all of them), then item by item from the first difference."""
    n = min(len(known), len(msgs))
    if (msgs[:n] == known) if n == len(known) else (msgs == known[:n]):  # one slice
        return n
    for i in range(n):
        a, b = known[i], msgs[i]
        if a is not b and a != b:
            return i
    return n  # pragma: no cover - the slice comparison above said they differ


_POLICIES = ("step", "tool", "task")


@dataclass
class RewindResult:
    target: Checkpoint
    safety: Checkpoint
    """The checkpoint taken just before rewinding: rewind to it to undo."""
    head: Checkpoint
    files: RestoreStats | None = None
    effects: list[Effect] = field(default_factory=list)
    """Irreversible external effects recorded after the target: a rewind cannot undo them."""
    compensations: list[dict[str, Any]] = field(default_factory=list)
    """Compensations run (when asked for and registered in this process), newest first."""
    artifacts: dict[str, str] = field(default_factory=dict)
    """Artifacts restored: name -> the path written."""
    undo: str = ""
    """The shell command that undoes this rewind, from any directory."""


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


def _policy(spec: str | Iterable[str] | None) -> frozenset[str]:
    if spec is None or spec == "manual":
        return frozenset()
    wanted = frozenset([spec] if isinstance(spec, str) else spec) - {"manual"}
    unknown = wanted - set(_POLICIES)
    if unknown:
        raise UsageError(
            f"unknown checkpoint policy {sorted(unknown)}: use step, tool, task or manual"
        )
    return wanted


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


class Session:
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
        self.redactor = make_redactor(redact, Path(workspace) if workspace is not None else None)
        # The redactor's last inputs (copies) and outputs (the copies checkpointed), and the
        # list it is working on until its checkpoint commits: (given, how many reused, output)
        self._redacted: tuple[list[Any], list[Any]] = ([], [])
        self._redacting: tuple[list[Any], int, list[Any]] | None = None
        self.store = store
        self.name = name
        self.durability = store.durability if durability is None else Durability.parse(durability)
        self.conversation_key = conversation_key
        self.schema_version = schema_version
        self.config_hash = config_hash(config)
        self._deps = _deps(packages)
        self.root: Path | None = None
        self.workspace: Workspace | None = None
        self.explicit_root = bind
        self._bound: tuple[str, str | None] | None = None  # (branch, its binding) once read
        self._bound_here: str | None = None  # the branch known to be bound to this workspace
        if workspace is not None:
            self.root = check_root(Path(workspace), force=force)
            home = store.home
            if home is not None and (self.root == home or home in self.root.parents):
                raise UsageError(
                    f"the workspace {self.root} is the store's own directory {home}: snapshot "
                    "the project that holds the store, not the store"
                )
            exclude = store.own_paths
            self.workspace = Workspace(
                self.root,
                store.blobs,
                store_id=store.id,
                epoch=store.gc_epoch,
                cache_dir=store.cache_dir,
                exclude=exclude,
                watch=watch,
            )
        if branch is None:
            branch = self._checkout_branch() or "main"
        _check_name("branch", branch)
        self.branch = branch
        self._head: Checkpoint | None = None
        self._head_loaded = False
        self._conv_objs: _Known | None = None  # messages as of self._head, for prefix checks
        self._log_tips: dict[str, int] = {}
        self.migrations: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = dict(
            migrations or {}
        )
        self._policy = _policy(checkpoint_every)
        self.notify: Notifier | None = notify or os.environ.get("STASHPOINT_NOTIFY") or None
        if checkpoint_interval is not None and checkpoint_interval <= 0:
            raise UsageError("checkpoint_interval must be a positive number of seconds")
        self.checkpoint_interval = checkpoint_interval
        self.validators: list[Callable[[dict[str, Any]], Any]] = list(validators)
        self._durable: Durable | None = None
        self._run_record: Any = _INHERIT  # the branch's durable-run record, read on first use
        self._write_lock = threading.RLock()
        self.lease: Lease | None = None
        self._owns_lease = False
        if isinstance(lease, Lease):
            if lease.session != name:
                raise UsageError(f"that lease covers session {lease.session!r}, not {name!r}")
            self.lease = lease
        elif lease is not None and lease is not False:
            ttl = DEFAULT_TTL if lease is True else float(lease)
            self.lease = acquire_lease(store.meta, name, ttl=ttl)
            self._owns_lease = True
        self.complete_interrupted_restore()

    @property
    def fence(self) -> Fence | None:
        """The fencing token every write carries while this session holds a lease."""
        if self.lease is None:
            return None
        self.lease.check()
        return self.lease.fence

    def check_may_write(self) -> None:
        """Refuse to start work the store would refuse to record: with a lease, one that was
        lost (:class:`LeaseLost`); without one, while another worker holds a live lease on the
        session (:class:`LeaseHeld`). Called before a durable run starts (so no step body or
        side effect runs outside the lease) and before writes the store does not fence
        itself (labels, run records)."""
        if self.lease is not None:
            self.lease.check()
            return
        info = self.store.meta.lease_info(self.name)
        if info is not None and info.expires_in > 0:
            raise lease_held(self.name, info.owner, info.expires_in)

    def close(self) -> None:
        """Release the lease this session took (if any); the session is unusable for writes
        after that. Sessions without a lease hold nothing that needs closing."""
        if self.lease is not None and self._owns_lease:
            self.lease.release()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- checkouts: which branch a workspace follows --------------------------------------
    def _checkout_key(self) -> str | None:
        return f"checkout:{self.name}:{self.root}" if self.root is not None else None

    def _checkout_branch(self) -> str | None:
        key = self._checkout_key()
        return self.store.meta.get_meta(key) if key else None

    def _set_checkout(self, branch: str) -> None:
        key = self._checkout_key()
        if key:
            self.store.meta.set_meta(key, branch)

    # -- where restores may write (see stashpoint.restore_target) ------------------------
    def bound_root(self, branch: str | None = None, target: Checkpoint | None = None) -> str | None:
        """The directory ``branch`` (default: this one) is bound to, or None for no directory.

        A branch never bound (new, or in a store older than bindings) falls back to the
        binding of the branch holding ``target``, then to the root its head, else that
        branch's head, was snapshotted in. Never to a root read from ``target`` itself: a
        checkpoint off every imported branch head carries a root a bundle chose."""
        branch = branch or self.branch
        bound = restore_target.bound_to(self.store, self.name, branch)
        other = target.branch if target is not None and target.branch != branch else None
        if bound is None and other is not None:
            bound = restore_target.bound_to(self.store, self.name, other)
        for name in (branch, other):
            if bound is not None or name is None:
                continue
            bound = self._head_root(name)
        return bound or None

    def _head_root(self, branch: str) -> str | None:
        """The root the branch's head was snapshotted in (only for branches never bound:
        stores older than bindings)."""
        ident = self.store.meta.get_head(self.name, branch)
        cp = self.store.get(ident) if ident else None
        return cp.workspace.root if cp is not None and cp.workspace is not None else None

    def _restore_refusal(
        self, branch: str, target: Checkpoint
    ) -> restore_target.RestoreRefused | None:
        """The rule every restore into this session's workspace goes through: None when
        ``target``'s files may be written into it, else the error that says why not."""
        assert self.root is not None
        if self.explicit_root:
            return None
        source = None
        if target.branch != branch and not self._in_history(branch, target.id):
            theirs = restore_target.bound_to(self.store, self.name, target.branch)
            if theirs is None:  # older than bindings: where that branch's head was taken
                theirs = self._head_root(target.branch)
            source = (target.id, target.branch, theirs or None)
        try:
            restore_target.check_workspace(
                self.name,
                branch,
                self.root,
                self.bound_root(branch, target),
                source=source,
            )
        except restore_target.RestoreRefused as exc:
            return exc
        return None

    def _in_history(self, branch: str, ident: str) -> bool:
        """Whether checkpoint ``ident`` is on ``branch``'s line (its head or an ancestor):
        a fork's own past, taken on the branch it forked from, is its history too."""
        meta = self.store.meta
        current = meta.get_head(self.name, branch)
        seen: set[str] = set()
        while current is not None and current not in seen:
            if current == ident:
                return True
            seen.add(current)
            row = meta.get_checkpoint(current)
            current = row.parent if row is not None else None
        return False

    def _check_restore(self, branch: str, target: Checkpoint) -> None:
        refused = self._restore_refusal(branch, target)
        if refused is not None:
            raise refused

    def _bind(self, branch: str) -> None:
        """Bind ``branch`` to this workspace (its checkpoints are taken, or restored, here)."""
        assert self.root is not None
        restore_target.bind(self.store, self.name, branch, self.root)
        self._bound = (branch, str(self.root))
        self._bound_here = None

    def _snapshot_binding(self) -> str | None:
        """This branch's binding, read once per session object (a checkpoint pays nothing
        for it after the first)."""
        if self._bound is None or self._bound[0] != self.branch:
            bound = restore_target.bound_to(self.store, self.name, self.branch)
            self._bound = (self.branch, bound)
            if bound is None:
                self._bound = (self.branch, self._legacy_binding())
        return self._bound[1]

    def _check_snapshot_here(self) -> None:
        """A branch bound to another directory does not take this one's files: its history
        would hold them, and a rewind there would pour them over that directory. Named
        explicitly (``-C``, ``bind=True``), it is recorded, with a warning."""
        assert self.root is not None
        if self._bound_here == self.branch:
            return  # checked for this branch already: a checkpoint pays one dict lookup
        bound = self._snapshot_binding()
        if not restore_target.usable(bound) or Path(str(bound)) == self.root:
            return
        if not self.explicit_root:
            raise restore_target.RestoreRefused(
                f"refusing to snapshot {self.root} into session {self.name!r} branch "
                f"{self.branch!r}: its checkpoints are taken in {bound}. Run it there, use "
                f"a session of its own (--session NAME), or name this directory explicitly "
                f"(stashpoint -C {self.root} snap; Python: bind=True)"
            )
        self._bound = (self.branch, str(self.root))  # warn once per session object
        warnings.warn(
            f"recorded the files of {self.root} in branch {self.branch!r} of session "
            f"{self.name!r}, whose checkpoints are taken in {bound}; a rewind there puts "
            "these files back",
            StashpointWarning,
            stacklevel=4,
        )

    def _bind_on_checkpoint(self) -> None:
        """A checkpoint of this workspace binds a branch that has no usable directory yet:
        new, imported and now snapshotted here, or whose directory is gone (a moved
        project)."""
        if self._bound_here == self.branch:
            return
        if not restore_target.usable(self._snapshot_binding()):
            self._bind(self.branch)
        self._bound_here = self.branch

    def _legacy_binding(self) -> str | None:
        """A branch of a store older than bindings stays where its head was taken, unless
        the store lives in this workspace (it moved with its project)."""
        assert self.root is not None
        home = self.store.home
        if home is not None and (home.parent == self.root or self.root in home.parents):
            return None
        root = self._head_root(self.branch)
        if root is not None and restore_target.usable(root):
            restore_target.bind(self.store, self.name, self.branch, Path(root))
        return root

    # -- reading --------------------------------------------------------------------------
    @property
    def head(self) -> Checkpoint | None:
        """The branch head (verified), or None for a branch with no checkpoint yet."""
        if not self._head_loaded:
            self._reload_head()
        return self._head

    def _reload_head(self) -> None:
        ident = self.store.meta.get_head(self.name, self.branch)
        if ident is None:
            self._head = None
        elif self._head is None or self._head.id != ident:
            self._head = self.store.get(ident)
            self._conv_objs = None
        self._head_loaded = True

    def resolve(self, ref: str) -> str:
        """Full id from an id, unique prefix, label, ``HEAD`` or ``HEAD~N``."""
        upper = ref.upper()
        if upper == "HEAD" or upper.startswith("HEAD~"):
            steps = upper[5:]
            if steps and not steps.isdigit():
                raise UsageError(f"bad reference {ref!r}: use HEAD~N with a number N")
            cp = self.head
            back = int(steps or 1) if "~" in upper else 0
            for n in range(back):
                if cp is None:
                    break
                if cp.parent is None:  # as git: no silent clamping to the first checkpoint
                    raise NotFoundError(
                        f"{ref}: branch {self.branch!r} goes back only {n} checkpoint(s)"
                    )
                cp = self.store.get(cp.parent)
            if cp is None:
                raise NotFoundError(f"branch {self.branch!r} has no checkpoint {ref}")
            return cp.id
        return self.store.resolve(ref, self.name)

    def get(self, ref: str) -> Checkpoint:
        cp = self.store.get(self.resolve(ref))
        if cp.session != self.name:
            raise NotFoundError(f"checkpoint {cp.id} belongs to session {cp.session!r}")
        return cp

    def history(
        self, *, limit: int | None = None, damaged: list[IntegrityError] | None = None
    ) -> list[Checkpoint]:
        """All checkpoints of the session, newest first, each verified with its chain link.

        Ordered by the parent chain, not by id: an id carries its process's clock, so two
        processes committing in the same millisecond can give a child a smaller id than its
        parent. A child always comes before its parent; among the rest the larger id (the
        newer) comes first. Sorted in memory, from the one query that reads the rows.

        ``damaged``: a list to collect the integrity error of each damaged record in, which
        is then left out, so a caller can still show everything that is intact (``stashpoint
        log``). Without it the first damaged record raises, as before.
        """
        from ._chain import WINDOW_SLACK, chain_order

        window = None if limit is None else max(limit, 0) + WINDOW_SLACK
        rows = chain_order(self.store.meta.list_checkpoints(self.name, limit=window))
        if limit is not None:
            rows = rows[: max(limit, 0)]
        by_id: dict[str, CheckpointRow] = {r.id: r for r in rows}
        out = []
        for row in rows:
            try:
                cp = self.store.open_row(row)
                if cp.parent is not None:
                    prow = by_id.get(cp.parent) or self.store.meta.get_checkpoint(cp.parent)
                    if prow is None or prow.digest != cp.parent_digest:
                        what = "is missing" if prow is None else "was altered"
                        raise IntegrityError(
                            f"checkpoint {cp.id} is broken: its parent {cp.parent} {what}",
                            checkpoint=cp.id,
                        )
            except IntegrityError as exc:
                error = self.store.with_last_good(exc, row)
                if damaged is None:
                    raise error from None
                damaged.append(error)
                continue
            out.append(cp)
        return out

    def labels(self) -> dict[str, str]:
        return self.store.meta.labels(self.name)

    def branches(self) -> dict[str, str]:
        return self.store.meta.branches(self.name)

    def state(self, ref: str | Checkpoint | None = None) -> dict[str, Any]:
        """The full state of a checkpoint (default: the head), decoded and verified."""
        cp = self._as_checkpoint(ref)
        if cp is None:
            return {}
        if ref is not None:
            check_not_pruned(self.store, cp)
        if cp.schema_version > self.schema_version:
            raise SchemaVersionError(
                f"checkpoint {cp.id} has state schema version {cp.schema_version}, newer than "
                f"this program's {self.schema_version}: run a newer version of the program"
            )
        migrate = cp.schema_version < self.schema_version and bool(self.migrations)
        self._warn_if_foreign(cp, schema=not migrate)
        out: dict[str, Any] = {}
        conv = cp.state.conversation
        if conv is not None:
            out[self.conversation_key] = self._load_messages(conv)
        for key, hexd in cp.state.values.items():
            out[key] = serde.decode(self.store.blobs.read(bytes.fromhex(hexd)))
        if migrate:
            for version in range(cp.schema_version, self.schema_version):
                upgrade = self.migrations.get(version)
                if upgrade is None:
                    raise SchemaVersionError(
                        f"checkpoint {cp.id} has state schema version {cp.schema_version}; no "
                        f"migration from version {version} to {version + 1} is registered"
                    )
                out = upgrade(out)
        return out

    def _as_checkpoint(self, ref: str | Checkpoint | None) -> Checkpoint | None:
        if ref is None:
            return self.head
        if isinstance(ref, Checkpoint):
            return ref
        return self.get(ref)

    def _warn_if_foreign(self, cp: Checkpoint, *, schema: bool = True) -> None:
        if schema and cp.schema_version != self.schema_version:
            warnings.warn(
                f"checkpoint {cp.id} has state schema version {cp.schema_version}; this "
                f"session expects {self.schema_version}",
                StashpointWarning,
                stacklevel=3,
            )
        if cp.config_hash and self.config_hash and cp.config_hash != self.config_hash:
            warnings.warn(
                f"checkpoint {cp.id} was made under a different agent configuration",
                StashpointWarning,
                stacklevel=3,
            )

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

    def _load_conversation(self, conv: ConversationRef) -> _Known:
        rows = self._message_rows(conv.log, conv.length)
        chain = EMPTY_CHAIN
        msgs = []
        for stored_chain, data in rows:
            chain = message_chain(chain, data)
            if bytes.fromhex(chain) != stored_chain:
                raise IntegrityError(f"conversation log {conv.log} is corrupt")
            msgs.append(serde.decode(data))
        if chain != conv.hash:
            raise IntegrityError(
                f"conversation of length {conv.length} in log {conv.log} does not match its hash"
            )
        return _Known(msgs, [data for _chain, data in rows])

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
            if result.skipped:
                shown = ", ".join(result.skipped[:5]) + (" …" if len(result.skipped) > 5 else "")
                warnings.warn(
                    f"left out {len(result.skipped)} path(s) that are neither file, directory "
                    f"nor symlink (sockets, FIFOs, devices): {shown}",
                    StashpointWarning,
                    stacklevel=3,
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

    def _known_written(self, msgs: Any, append: LogAppend | None) -> None:
        """After a checkpoint of the conversation ``msgs`` (``append``: what it wrote)."""
        redacting, self._redacting = self._redacting, None
        if not isinstance(msgs, list):
            self._conv_objs = None
            return
        known = self._conv_objs  # what _common_prefix compared against (all of it if unchanged)
        start = append.start if append is not None else len(msgs)
        data = [d for _chain, d in append.messages] if append is not None else []
        if known is None or len(known.objs) < start:
            if start:  # (the head had no conversation to compare against: nothing kept)
                self._conv_objs = None
                return
            known = _Known([], [])
        new = _written(msgs[start:], data)
        if len(known.objs) == start:  # appended: extend the lists (no copy of the prefix)
            known.objs.extend(new)
            known.data.extend(data)
        else:
            known = _Known(known.objs[:start] + new, known.data[:start] + data)
        self._conv_objs = known
        if redacting is not None and redacting[2] is msgs:
            given, k, red = redacting  # given: the messages from k on
            snaps = known.objs
            # A message the redactor left as it was has the copy just written as its copy.
            more = [snaps[i] if red[i] is m else copied(m) for i, m in enumerate(given, start=k)]
            old = self._redacted[0]
            if len(old) == k:
                old.extend(more)
            else:
                old = old[:k] + more
            self._redacted = (old, snaps)

    def _known_appended(self, head: Checkpoint | None, msgs: list[Any], data: list[bytes]) -> None:
        known = self._conv_objs
        n = head.state.conversation.length if head and head.state.conversation else 0
        if n == 0:
            known = _Known([], [])
        if known is None or len(known.objs) != n:
            self._conv_objs = None
            return
        known.objs.extend(_written(msgs, data))
        known.data.extend(data)
        self._conv_objs = known

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

    def _journal_ref(self, head: Checkpoint | None) -> LogRef | None:
        """The durable-execution journal a new checkpoint records: the running program's, or
        the branch's live run (entries appended since the head, e.g. by a crashed run), or
        the head's."""
        if self._durable is not None and self._durable.journal is not None:
            return self._durable.journal.ref()
        inherited = head.journal if head is not None else None
        if self._run_record is _INHERIT:
            from ._runs import run_key

            raw = self.store.meta.get_meta(run_key(self.name, self.branch))
            self._run_record = json.loads(raw) if raw else None
        rec = self._run_record
        if rec is None:
            return inherited
        from ._runs import record_applies

        if not record_applies(rec, head):
            return inherited
        log = str(rec["log"])
        info = self.store.meta.log_info(log)
        if info is None or info.length <= info.parent_len:  # nothing appended since it began
            return inherited
        last = self.store.meta.read_messages(log, info.length - 1, info.length)
        if not last:
            raise IntegrityError(f"journal log {log} has missing entries")
        return LogRef(log, info.length, last[0].chain.hex())

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

    def _conversation_for(
        self, head: Checkpoint | None, state: Mapping[str, Any] | None
    ) -> tuple[ConversationRef | None, LogAppend | None]:
        """Where the conversation goes: extend the parent's log, or branch a new one."""
        parent = head.state.conversation if head else None
        if state is None:
            return parent, None
        msgs = state.get(self.conversation_key)
        if msgs is None:
            return None, None
        n = parent.length if parent else 0
        prefix = self._common_prefix(head, parent, msgs)
        if parent is not None and prefix == n == len(msgs):
            return parent, None
        if parent is not None and prefix == n:
            log, start, chain, new_log = self._log_end(parent)
        else:
            # Diverged (edited or truncated history): a new log continuing the common prefix.
            log, start = new_id(), prefix
            if parent is not None and prefix > 0:
                chain = self._message_rows(parent.log, prefix)[-1][0].hex()
                new_log = LogInfo(self.name, parent.log, prefix, prefix)
            else:
                chain, start = EMPTY_CHAIN, 0
                new_log = LogInfo(self.name, None, 0, 0)
        encoded = [serde.encode(m) for m in msgs[start:]]
        return _chained(log, start, chain, new_log, encoded)

    def _conversation_appended(
        self, head: Checkpoint | None, added: list[bytes]
    ) -> tuple[ConversationRef | None, LogAppend | None]:
        """The head's conversation followed by the ``added`` (encoded) messages."""
        parent = head.state.conversation if head else None
        if not added:
            return parent, None
        return _chained(*self._log_end(parent), added)

    def _log_end(self, parent: ConversationRef | None) -> tuple[str, int, str, LogInfo | None]:
        """Where messages after ``parent`` go: (log, start, chain, new log's info or None).
        The parent's own log when its tip is where ``parent`` ends, else a new log forked
        there (another branch wrote past it); a new root log without a parent."""
        if parent is None:
            return new_id(), 0, EMPTY_CHAIN, LogInfo(self.name, None, 0, 0)
        log, start = parent.log, parent.length
        tip = self._log_tips.get(log)
        if tip is None:
            info = self.store.meta.log_info(log)
            tip = info.length if info else -1
        if tip == start:
            return log, start, parent.hash, None
        return new_id(), start, parent.hash, LogInfo(self.name, log, start, start)

    def _common_prefix(
        self, head: Checkpoint | None, parent: ConversationRef | None, msgs: list[Any]
    ) -> int:
        """How many leading messages equal the parent's conversation.

        Compared by content with copies of the messages as they were checkpointed (decoded
        from the bytes written), not with the objects given then: a message changed in place
        since (``msgs[-1]["content"] = "edited"``) is the same object, but no longer the same
        message. The comparison is one ``list ==`` in C (dicts, lists and strings compare
        there without calling back into Python), so a checkpoint costs O(n) comparisons but
        stays far below encoding the conversation again. Messages of an immutable type (the
        LangGraph saver's encoded strings) are kept as the objects given: one identity test.
        A copy that compares unequal although the message encodes the same bytes (a ``nan``
        inside) is not taken for a change.
        """
        if parent is None or head is None:
            return 0
        known = self._conv_objs
        if known is None or len(known.objs) != parent.length:
            known = self._load_conversation(parent)
            self._conv_objs = known
        objs, n = known.objs, min(len(known.objs), len(msgs))
        red = self._redacting
        if red is not None and red[2] is msgs and self._redacted[1] is objs and 0 < red[1] <= n:
            # The redactor's output: its first k messages are these very copies (it compared
            # the caller's messages with theirs by content), so only the rest is compared.
            k = red[1]
            i = k + same_prefix(msgs[k:], objs[k:])
        else:
            i = same_prefix(msgs, objs)
        while i < n and serde.encode(msgs[i]) == known.data[i]:  # equal after all
            i += 1 + same_prefix(msgs[i + 1 : n], objs[i + 1 : n])
        return i

    def label(self, ref: str, label: str | None) -> Checkpoint:
        cp = self.get(ref)
        self.check_may_write()
        self._set_label(cp.id, self._redact_label(label))
        return cp

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

    def _set_label(self, ident: str, label: str | None) -> None:
        """A label names one checkpoint of the session: set on another, it moves there (as a
        git tag with -f; two checkpoints with one label made ``show NAME`` pick either)."""
        if label is not None:
            for other, name in self.store.meta.labels(self.name).items():
                if name == label and other != ident:
                    self.store.meta.set_label(other, self.name, None)
        self.store.meta.set_label(ident, self.name, label)

    # -- operator edits ---------------------------------------------------------
    def validator(self, fn: F) -> F:
        """Decorator: register a state validator for :meth:`edit`."""
        self.validators.append(fn)
        return fn

    def validate(self, state: dict[str, Any]) -> None:
        """Run every validator; ValidationError naming the first that refuses."""

        for check in self.validators:
            name = getattr(check, "__qualname__", repr(check))
            try:
                verdict = check(state)
            except Exception as exc:
                raise ValidationError(f"validator {name} refused the state: {exc}") from exc
            if verdict is False or (isinstance(verdict, str) and verdict):
                why = verdict if isinstance(verdict, str) else "it returned False"
                raise ValidationError(f"validator {name} refused the state: {why}")

    def edit(
        self,
        ref: str | Checkpoint | None = None,
        *,
        assign: Mapping[str, Any] | None = None,
        patch: list[dict[str, Any]] | None = None,
        state: Mapping[str, Any] | None = None,
        reason: str | None = None,
        by: str | None = None,
        branch: str | None = None,
    ) -> Checkpoint:
        """Correct a checkpoint's state and save it as a new child checkpoint (kind ``edit``,
        with who, when and why); the original stays as it was.

        ``assign`` maps paths (``plan.budget`` or ``/plan/budget``) to new values (the CLI's
        ``--set``), ``patch`` is a
        JSON Patch, ``state`` replaces the state whole. Validators run first: a refused edit
        saves nothing. Editing the head continues the branch (a durable run resumes from the
        edit); editing an older checkpoint needs ``branch``, a new branch starting at the edit.
        """
        from .durable import _user
        from .edit import apply_patch, set_path, split_path

        target = self._as_checkpoint(ref)
        if target is None:
            raise NotFoundError(f"branch {self.branch!r} of session {self.name!r} is empty")
        head = self.head
        if branch is None and (head is None or head.id != target.id):
            raise UsageError(
                f"{target.id} is not the head of branch {self.branch!r}: to edit an older "
                "checkpoint, name a new branch for the edit (branch=… / --branch NAME)"
            )
        new = dict(state) if state is not None else self.state(target)
        changes: list[str] = []
        for path, value in (assign or {}).items():
            set_path(new, split_path(path), value)
            changes.append(f"set {path}")
        if patch is not None:
            new = apply_patch(new, patch)
            changes += [f"{op.get('op')} {op.get('path')}" for op in patch]
        if state is not None:
            changes.append("replaced the state")
        self.validate(new)
        meta: dict[str, dict[str, Any]] = {
            "edit": {
                "of": target.id,
                "by": by or _user(),
                "reason": reason,
                "changes": changes,
                "at": utc_now_iso(),
            }
        }
        message = "edited: " + (reason or "; ".join(changes) or "no change")
        from .durable import Journal

        def withdraw(on: Session, command: Mapping[str, Any] | None = None) -> None:
            # Approved arguments must come from the edited state: unanswered requests are
            # withdrawn, and each call asks again with the arguments it then has.
            withdrawn = Journal(on).cancel_pending(
                f"superseded by an edit: {message}", command=command
            )
            on._run_record = _INHERIT  # the edit checkpoint records the journal with them
            if withdrawn:
                meta["edit"]["withdrew"] = withdrawn[0].to_dict()
            if len(withdrawn) > 1:
                meta["edit"]["withdrew_all"] = [p.to_dict() for p in withdrawn]

        if branch is None:
            withdraw(self)
            return self.checkpoint(new, kind="edit", message=message, meta=meta, files=False)
        _check_name("branch", branch)
        if branch in self.branches():
            raise UsageError(f"branch {branch!r} already exists in session {self.name!r}")
        command = Journal(self).last_command  # a resume on the new branch runs the same program
        self.store.meta.set_head(self.name, branch, target.id, None, fence=self.fence)
        other = Session(
            self.store,
            self.name,
            branch=branch,
            schema_version=self.schema_version,
            conversation_key=self.conversation_key,
        )
        other.config_hash = self.config_hash
        withdraw(other, command)
        return other.checkpoint(new, kind="edit", message=message, meta=meta, files=False)

    # -- durable execution (see stashpoint.durable) -----------------------------------------
    @property
    def durable(self) -> Durable:
        if self._durable is None:
            from .durable import Durable

            self._durable = Durable(self, self._policy)
        return self._durable

    @overload
    def step(self, fn: F, /) -> F: ...

    @overload
    def step(
        self, fn: None = None, /, *, name: str | None = None, retries: int = 0, backoff: float = 0.5
    ) -> Callable[[F], F]: ...

    def step(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        retries: int = 0,
        backoff: float = 0.5,
    ) -> F | Callable[[F], F]:
        """Decorator: a durable step. It runs once; its result (or error) is journaled, and
        when the program runs again after a crash the recorded result is returned instead.

        ``@run.step`` or ``@run.step(name="ask", retries=3)``; sync and async functions.
        Name steps explicitly when their ``__qualname__`` may change between versions.
        """

        def wrap(f: F) -> F:
            return cast(F, self.durable.step(f, name=name, retries=retries, backoff=backoff))

        return wrap if fn is None else wrap(fn)

    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        irreversible: bool = False,
        approval: bool = False,
        compensate: Callable[..., Any] | None = None,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        irreversible: bool = False,
        approval: bool = False,
        compensate: Callable[..., Any] | None = None,
    ) -> F | Callable[[F], F]:
        """Decorator: a durable tool call. ``irreversible`` tools go into the side-effect
        ledger (intent before, outcome after: a crash in between is never silently re-run);
        ``approval`` tools pause the run until ``approve`` / ``reject``; ``compensate(result,
        *args, **kwargs)`` undoes an effect when a rewind asks for it (saga)."""

        def wrap(f: F) -> F:
            return cast(
                F,
                self.durable.tool(
                    f,
                    name=name,
                    irreversible=irreversible,
                    approval=approval,
                    compensate=compensate,
                ),
            )

        return wrap if fn is None else wrap(fn)

    def plan(self, tasks: Any) -> list[Task]:
        """Declare the task list (ids, or (id, title) pairs, or {id: title}); journaled."""
        return self.durable.plan(tasks)

    def task(self, task_id: str) -> Any:
        """Context manager: the task is in_progress inside, completed after, failed (or
        skipped, for a rejected tool) on an exception."""
        return self.durable.task(task_id)

    def set_task(self, task_id: str, status: str, note: str | None = None) -> None:
        self.durable.set_task(task_id, status, note)

    def tasks(self, ref: str | Checkpoint | None = None) -> list[Task]:
        """Task statuses: as of the running program's position, or of a checkpoint."""
        from .durable import Journal, tasks_at

        if ref is not None:
            cp = self._as_checkpoint(ref)
            return tasks_at(self, cp) if cp is not None else []
        if self._durable is not None and self._durable.journal is not None:
            return self._durable.tasks()
        return Journal(self).tasks()

    def remaining_tasks(self) -> list[Task]:
        """Tasks not completed or skipped, in plan order: where a resumed run continues."""
        return self.durable.remaining()

    def track(self, provider: Callable[[], Mapping[str, Any]]) -> Callable[[], Mapping[str, Any]]:
        """Register what automatic checkpoints of a durable run record as state."""
        self.durable.state_provider = provider
        return provider

    def resource(self, name: str) -> Callable[[F], F]:
        """Decorator: a factory that re-creates a live resource (database connection, API
        client) in each process; ``run.get_resource(name)`` returns it, created once."""

        def register(factory: F) -> F:
            self.durable.resources[name] = factory
            return factory

        return register

    def get_resource(self, name: str) -> Any:
        return self.durable.resource(name)

    def run(
        self, fn: Callable[..., Any], *args: Any, fresh: bool = False, **kwargs: Any
    ) -> RunResult:
        """Run (or resume) ``fn`` as a durable program: calls already journaled on this
        branch return their recorded results; the rest execute. Returns when it completes or
        pauses for a decision (``result.status``); exceptions propagate after a ``failed``
        checkpoint. ``fresh`` starts a new run with an empty journal."""
        return self.durable.run(fn, args, kwargs, fresh=fresh)

    resume = run

    async def arun(
        self, fn: Callable[..., Any], *args: Any, fresh: bool = False, **kwargs: Any
    ) -> RunResult:
        """:meth:`run` for an async ``fn``."""
        return await self.durable.arun(fn, args, kwargs, fresh=fresh)

    def pending(self) -> Pending | None:
        """The decision the branch's run waits for, if any."""
        from .durable import Journal

        return Journal(self).pending()

    def approve(
        self,
        ident: str | None = None,
        *,
        reason: str | None = None,
        by: str | None = None,
        done: bool = False,
        result: Any = None,
    ) -> Checkpoint:
        """Approve what the run waits for. For an in-doubt effect: retry it, or with ``done``
        record that it happened (with ``result``) so it is not run again."""
        from .durable import decide

        return decide(
            self, ident, approved=True, reason=reason, by=by, mark_done=done, done_result=result
        )

    def reject(
        self, ident: str | None = None, *, reason: str | None = None, by: str | None = None
    ) -> Checkpoint:
        """Reject it: the resumed run's call raises :class:`ToolRejected`."""
        from .durable import decide

        return decide(self, ident, approved=False, reason=reason, by=by)

    def effects(self, since: str | Checkpoint | None = None) -> list[Effect]:
        """The side-effect ledger of the branch's journal (after checkpoint ``since``)."""
        from .durable import Journal, common_prefix

        j = Journal(self)
        start = 0
        if since is not None:
            cp = self._as_checkpoint(since)
            start = common_prefix(j, cp.journal if cp else None, self)
        return self._mark_compensable(j.effects(start))

    def _mark_compensable(self, effects: list[Effect]) -> list[Effect]:
        import dataclasses

        tools = self._durable.tools if self._durable is not None else {}
        return [
            dataclasses.replace(e, compensable=bool(tools.get(e.tool) and tools[e.tool].compensate))
            for e in effects
        ]

    # -- artifacts ---------------------------------------
    def artifacts(self, ref: str | Checkpoint | None = None) -> dict[str, ArtifactRef]:
        """Name -> artifact attached to a checkpoint (default: the head)."""
        cp = self._as_checkpoint(ref)
        return dict(cp.artifacts) if cp is not None else {}

    def _artifact(self, ref: str | Checkpoint | None, name: str) -> ArtifactRef:
        cp = self._as_checkpoint(ref)
        if cp is None:
            raise NotFoundError(f"branch {self.branch!r} of session {self.name!r} is empty")
        check_not_pruned(self.store, cp)
        found = cp.artifacts.get(name)
        if found is None:
            have = ", ".join(cp.artifacts) or "none"
            raise NotFoundError(f"checkpoint {cp.id} has no artifact {name!r} (it has: {have})")
        return found

    def read_artifact(self, ref: str | Checkpoint | None, name: str) -> Iterator[bytes]:
        """Stream an artifact's content, verified chunk by chunk (and whole, at the end)."""
        from .artifacts import read_artifact

        return read_artifact(self.store.blobs, self._artifact(ref, name))

    def fetch_artifact(
        self,
        ref: str | Checkpoint | None,
        name: str,
        dest: str | os.PathLike[str],
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> Path:
        """Write an artifact to ``dest`` (a directory gets its original file name),
        atomically; returns the path written. Nothing else changes: no safety checkpoint."""
        from .artifacts import restore_artifact
        from .artifacts import restore_target as artifact_path

        art = self._artifact(ref, name)
        target = restore_target.check_artifact_target(
            name, artifact_path(art, dest, name), self.store.own_paths
        )
        restore_artifact(self.store.blobs, art, target, progress=progress)
        return target

    # -- rewind and fork ------------------------------------------------------------------
    def _restoring(self, *, wait: bool = True) -> contextlib.AbstractContextManager[bool]:
        """The workspace's restore lock (see :func:`stashpoint.workspace.restoring`)."""
        if self.root is None:
            return contextlib.nullcontext(True)
        home = self.store.home
        return restoring(self.root, home / "locks" if home is not None else None, wait=wait)

    def _journal_key(self) -> str | None:
        return f"restore-journal:{self.root}" if self.root is not None else None

    def rewind(
        self,
        ref: str,
        *,
        files: bool = True,
        state: bool = True,
        compensate: bool = False,
        artifacts: bool | Mapping[str, str | os.PathLike[str] | None] = False,
        progress: Callable[[int, int], None] | None = None,
        artifacts_to: str | os.PathLike[str] | None = None,
        recorded_paths: bool = False,
    ) -> RewindResult:
        """Go back to a checkpoint: files, state, or both.

        A safety checkpoint of whatever is there now is taken first, so every rewind can be
        undone by rewinding to it. With both files and state, the branch head moves to the
        target; with only one, a new ``rewind`` checkpoint combines the target's part with the
        current other part.

        Irreversible effects recorded after the target (sent messages, deployments) cannot be
        undone by a rewind: they are listed in the result and in a warning. With
        ``compensate``, their registered compensations run newest first — now, if this
        process registered them, else when the program next runs on this branch.

        ``artifacts`` also puts the target's artifacts back: True for all of them, or
        ``{name: path or None}`` for some. An artifact given no path goes under
        ``artifacts_to`` (a directory), or, only with ``recorded_paths``, to the path it was
        attached from; never over the store's own files. The files there now are attached
        to the safety checkpoint first, so this is undoable too.

        Files are restored only into the directory this branch is bound to (where its
        checkpoints were taken) unless the session was opened with ``bind=True``;
        otherwise :class:`~stashpoint.restore_target.RestoreRefused` (exit 1), before
        anything is written. A restore that fails on damaged data puts the workspace and
        the branch head back as they were.
        """
        if not (files or state):
            raise UsageError("rewind needs files, state or both")
        target = self.get(ref)
        check_not_pruned(self.store, target)
        if files and target.workspace is not None and self.workspace is None:
            raise UsageError("this session has no workspace directory to restore files into")
        if files and target.workspace is not None:
            self._check_restore(self.branch, target)
        self._warn_if_foreign(target)
        effects = self.effects(since=target) if state else []
        plan = (
            _artifact_plan(
                target,
                artifacts,
                to_dir=artifacts_to,
                recorded_ok=recorded_paths,
                protected=self.store.own_paths,
            )
            if artifacts
            else {}
        )
        captured = {n: p for n, p in plan.items() if p.is_file()}
        # A state-only rewind run from a directory the branch is not bound to records no
        # files of it: the branch keeps its own directory's files.
        here = files or (self.root is not None and self.bound_root() == str(self.root))
        safety = self.checkpoint(
            kind="pre-rewind",
            message=f"before rewind to {target.id}",
            artifacts=captured,
            progress=progress if captured else None,
            files=here,
        )
        extra = {
            "artifacts": {n: str(p) for n, p in plan.items()},
            "captured": sorted(captured),
            "bind": "explicit" if self.explicit_root else None,
        }
        with self._restoring():
            journal = self._journal(target, safety, files=files, state=state, extra=extra)
            try:
                result = self._finish_rewind(journal, safety, recovering=False, progress=progress)
            except (IntegrityError, NotFoundError, RestoreBlocked):
                self._drop_safety(safety)
                raise
        result.effects = effects
        result.artifacts = {n: str(p) for n, p in plan.items()}
        result.undo = restore_target.undo_command(
            self.store.url,
            self.name,
            self.root,
            result.safety.id,
            files=files,
            state=state,
            artifacts=captured,
        )
        if effects and compensate:
            self.durable.request_compensation(effects)
            result.compensations = self.durable.run_pending_compensations()
        elif effects:
            self._warn_effects(effects, f"rewound past {len(effects)}")
        return result

    @staticmethod
    def _warn_effects(effects: list[Effect], what: str) -> None:
        listed = "; ".join(f"{e.tool}{_args_summary(e.args)} [{e.status}]" for e in effects)
        warnings.warn(
            f"{what} irreversible effect(s) that cannot be undone: {listed}",
            StashpointWarning,
            stacklevel=3,
        )

    def _journal(
        self,
        target: Checkpoint,
        safety: Checkpoint | None,
        *,
        branch: str | None = None,
        files: bool = True,
        state: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Record, durably and before touching any file, what a restore is going to do."""
        journal = {
            "session": self.name,
            "branch": branch or self.branch,
            "target": target.id,
            "safety": safety.id if safety else None,
            "files": files,
            "state": state,
            "result": new_id(),
            **(extra or {}),
        }
        key = self._journal_key()
        if key is not None:
            self.store.meta.set_meta(key, json.dumps(journal))
        return journal

    def _finish_rewind(
        self,
        journal: dict[str, Any],
        safety: Checkpoint | None,
        *,
        recovering: bool,
        progress: Callable[[int, int], None] | None = None,
    ) -> RewindResult:
        target = self.store.get(journal["target"])
        files, state = bool(journal["files"]), bool(journal["state"])
        stats = None
        if files and self.workspace is not None and target.workspace is not None:
            if recovering or safety is None or safety.workspace is None:
                # recovering (the directory may be half-restored), or materialising a fork
                self.workspace.clean_temp_files()
                current = self._current_tree()
            else:
                current = bytes.fromhex(safety.workspace.tree)
            want = bytes.fromhex(target.workspace.tree)
            try:
                stats = self.workspace.restore(current, want)
                if recovering:  # after a crash, check the whole tree, not just what we touched
                    self.workspace.verify_equals(want, stats.kept_dirs)
            except (IntegrityError, NotFoundError, RestoreBlocked) as exc:
                self._roll_back(safety, exc)
                raise
        if journal.get("artifacts"):
            self._restore_artifacts(journal, target, safety, recovering, progress)
        if state:  # the execution position went back: the branch's durable run is over
            from .durable import end_run

            end_run(self)
            self._run_record = _INHERIT
            if self._durable is not None:
                self._durable.end()
        if files and state:
            current_head = self.store.meta.get_head(self.name, self.branch)
            if current_head != target.id:
                self.store.meta.set_head(
                    self.name, self.branch, target.id, current_head, fence=self.fence
                )
            self._head_loaded = False
            head = self.store.get(target.id)
        else:
            assert safety is not None, "partial rewinds always take a safety checkpoint"
            head = self._compose(journal, target, safety)
        if journal.get("bind") and files and self.root and target.workspace is not None:
            # A new branch (fork, import --into) is bound here; an explicit restore binds a
            # branch only when it has no usable directory (it does not take a project away).
            bound = restore_target.bound_to(self.store, self.name, journal["branch"])
            if journal["bind"] == "new" or not restore_target.usable(bound):
                self._bind(journal["branch"])
        if journal.get("checkout"):
            self._set_checkout(journal["branch"])
        key = self._journal_key()
        if key is not None:
            self.store.meta.set_meta(key, None)
        return RewindResult(target, safety or head, head, stats)

    def _drop_safety(self, safety: Checkpoint) -> None:
        """A failed rewind moves nothing: the branch head goes back from the safety
        checkpoint to where it was (the workspace is already back as it was, so the safety
        checkpoint holds nothing that is not still there; GC frees it)."""
        if safety.parent is None:
            return
        try:
            self.store.meta.set_head(
                self.name, safety.branch, safety.parent, safety.id, fence=self.fence
            )
        except ConflictError:
            return  # another writer moved on from it: theirs stays
        self._head_loaded = False

    def _roll_back(self, safety: Checkpoint | None, exc: Exception) -> None:
        """A restore hit damaged data: put the workspace back as it was and drop the journal.

        The safety checkpoint was written (and its blobs verified) just before, so going back
        to it loses nothing. If even that fails, the journal stays for a later attempt.
        """
        assert self.workspace is not None
        if safety is not None and safety.workspace is not None:
            back = bytes.fromhex(safety.workspace.tree)
            try:
                self.workspace.clean_temp_files()
                self.workspace.restore(self._current_tree(), back)
            except StashpointError as again:
                raise again from exc
        key = self._journal_key()
        if key is not None:
            self.store.meta.set_meta(key, None)

    def _restore_artifacts(
        self,
        journal: dict[str, Any],
        target: Checkpoint,
        safety: Checkpoint | None,
        recovering: bool,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        """Put the target's artifacts back, each atomically. On damage, undo the ones done
        (from the safety checkpoint, or by removing files that were not there) and the
        workspace restore, then raise."""
        from .artifacts import restore_artifact, sweep_leftovers

        targets = {str(n): Path(p) for n, p in journal["artifacts"].items()}
        if recovering:
            sweep_leftovers(targets)
        done: list[str] = []
        try:
            for name, path in targets.items():
                ref = target.artifacts.get(name)
                if ref is None:
                    raise IntegrityError(f"checkpoint {target.id} has no artifact {name!r}")
                restore_artifact(self.store.blobs, ref, path, progress=progress)
                done.append(name)
        except (IntegrityError, NotFoundError) as exc:
            captured = set(journal.get("captured") or ())
            for name in done:
                old = safety.artifacts.get(name) if safety is not None else None
                if name in captured and old is not None:
                    restore_artifact(self.store.blobs, old, targets[name])
                else:
                    targets[name].unlink(missing_ok=True)
            if journal.get("files") and self.workspace is not None and target.workspace:
                self._roll_back(safety, exc)
            else:
                key = self._journal_key()
                if key is not None:
                    self.store.meta.set_meta(key, None)
            raise

    def _current_tree(self) -> bytes:
        assert self.workspace is not None
        result, rows = self.workspace.scan()
        if rows:
            self.store.meta.put_blobs(rows)
        self.workspace.save_cache()
        return result.tree

    def _compose(
        self, journal: dict[str, Any], target: Checkpoint, safety: Checkpoint
    ) -> Checkpoint:
        """The checkpoint after a files-only or state-only rewind (idempotent via its id)."""
        ident = journal["result"]
        if self.store.meta.get_checkpoint(ident) is not None:
            self._head_loaded = False
            return self.store.get(ident)
        files = bool(journal["files"])
        ws = target.workspace if files else safety.workspace
        st = safety.state if files else target.state
        jr = safety.journal if files else target.journal
        arts = dict(safety.artifacts)
        arts.update({n: target.artifacts[n] for n in journal.get("artifacts") or ()})
        what = "files" if files else "state"
        cp = Checkpoint(
            id=ident,
            session=self.name,
            branch=self.branch,
            parent=safety.id,
            parent_digest=safety.digest,
            step=safety.step + 1,
            kind="rewind",
            message=f"rewound {what} to {target.id}",
            created_at=utc_now_iso(),
            schema_version=(safety if files else target).schema_version,
            config_hash=self.config_hash or (safety if files else target).config_hash,
            deps=self._deps,
            state=st,
            workspace=ws,
            journal=jr,
            artifacts=dict(sorted(arts.items())),
        )
        sealed, body = self.store.hasher.seal(cp)
        row = CheckpointRow(cp.id, cp.session, cp.branch, cp.parent, body, sealed.digest)
        self.store.meta.commit(Commit(row, safety.id, fence=self.fence))
        self._head, self._head_loaded, self._conv_objs = sealed, True, None
        return sealed

    def complete_interrupted_restore(self) -> bool:
        """Finish a rewind that a crash interrupted (called on open); True if there was one."""
        key = self._journal_key()
        if key is None:
            return False
        raw = self.store.meta.get_meta(key)
        if raw is None:
            return False
        journal = json.loads(raw)
        if journal.get("session") != self.name:
            return False
        with self._restoring(wait=False) as mine:
            if not mine:
                return False  # the rewind that wrote it is running now: not interrupted
            if self.store.meta.get_meta(key) != raw:
                return False  # it finished between our read and taking the lock
            return self._complete(journal)

    def _complete(self, journal: dict[str, Any]) -> bool:
        saved_branch = self.branch
        self.branch = journal["branch"]
        safety = None
        try:
            safety = self.store.get(journal["safety"]) if journal.get("safety") else None
            self._finish_rewind(journal, safety, recovering=True)
        except (IntegrityError, NotFoundError, RestoreBlocked) as exc:
            if safety is not None:
                self._drop_safety(safety)
            # The target is damaged (or blocked by ignored files): the workspace went back to
            # its safety checkpoint and the journal is gone, so this command can go on.
            warnings.warn(
                f"an interrupted rewind to {journal['target']} could not be completed ({exc}); "
                "the workspace was put back as it was before that rewind",
                StashpointWarning,
                stacklevel=3,
            )
        else:
            if journal.get("checkout") and self.root is not None:
                saved_branch = journal["branch"]  # a fork here finished: follow its branch
        finally:
            self.branch = saved_branch
            self._head_loaded = False
        return True

    def fork(
        self,
        ref: str,
        branch: str | None = None,
        *,
        into: str | os.PathLike[str] | None = None,
    ) -> Session:
        """A new branch starting at a checkpoint.

        With ``into``, the checkpoint's files are materialised in that (new or empty) directory,
        which then follows the new branch, bound to it: two directories, two independent runs
        from identical state. Without it, this workspace switches to the new branch (after a
        safety checkpoint), under the same rule as a rewind of where files may be written.

        The branch exists only once its files are in place: a fork that fails, or is killed,
        leaves no branch behind, and re-running it (or any command in ``into``) finishes it.
        """
        target = self.get(ref)
        check_not_pruned(self.store, target)
        branch = branch or f"fork-{target.id[-8:].lower()}"
        _check_name("branch", branch)
        if into is not None:
            dest = Path(into).resolve()
            resumed = self._resume_fork_into(dest, branch)
            if resumed is not None:
                return resumed
        if branch in self.store.meta.branches(self.name):
            raise UsageError(f"branch {branch!r} already exists in session {self.name!r}")
        files = self.workspace is not None and target.workspace is not None
        if into is None and files:
            self._check_restore(self.branch, target)
        effects = self.effects(since=target)
        if effects:  # the new branch starts before them; the world has them already
            self._warn_effects(effects, f"the fork starts before {len(effects)}")
        if into is not None:
            return self._materialise(dest, target, branch)
        safety = None
        if files:
            safety = self.checkpoint(kind="pre-rewind", message=f"before fork to {branch}")
        with self._restoring():
            journal = self._journal(
                target,
                safety,
                branch=branch,
                extra={"bind": "new" if files else None, "checkout": True},
            )
            old_branch = self.branch
            self.branch, self._head_loaded = branch, False
            try:
                self._finish_rewind(journal, safety, recovering=False)
            except (IntegrityError, NotFoundError, RestoreBlocked):
                self.branch, self._head_loaded = old_branch, False
                if safety is not None:
                    self._drop_safety(safety)
                raise
        return self

    def materialize(self, into: str | os.PathLike[str], ref: str = "HEAD") -> Session:
        """Write a checkpoint of this branch (default: its head) into a new or empty
        directory, which then follows this branch and is bound to it: how an imported
        session gets a workspace (``stashpoint import FILE --into DIR``)."""
        target = self.get(ref)
        check_not_pruned(self.store, target)
        if self.store.meta.get_head(self.name, self.branch) != target.id:
            raise UsageError(
                f"{ref} is not the head of branch {self.branch!r}: fork it --into a directory"
            )
        return self._materialise(Path(into).resolve(), target, self.branch)

    def _materialise(self, dest: Path, target: Checkpoint, branch: str) -> Session:
        """``target``'s files into the new or empty ``dest``, bound to ``branch``, whose head
        is set to ``target`` once they are there."""
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise UsageError(f"{dest} exists and is not an empty directory")
        for own in self.store.own_paths:
            own = own.resolve()
            if dest == own or own in dest.parents or dest in own.parents:
                raise restore_target.RestoreRefused(
                    f"refusing to write into {dest}: it holds or is inside the store {own}"
                )
        created = not dest.exists()
        dest.mkdir(parents=True, exist_ok=True)
        other = Session(self.store, self.name, workspace=dest, branch=branch, force=True, bind=True)
        other.schema_version, other.config_hash = self.schema_version, self.config_hash
        # Journal first, then the link file: a crash while materialising is completed by the
        # next stashpoint command run inside the new directory (or the same command run
        # again); the branch head is set last, when the files are there.
        with other._restoring():
            journal = other._journal(
                target, None, branch=branch, extra={"bind": "new", "checkout": True}
            )
            try:
                self._write_link_file(dest, branch)
                other._finish_rewind(journal, None, recovering=False)
            except (IntegrityError, NotFoundError, RestoreBlocked):
                # Damaged data: the directory was empty (or new) before, so nothing in it is
                # the user's; leave it as it was rather than half made.
                _empty_directory(dest, remove=created)
                raise
        return other

    def _resume_fork_into(self, dest: Path, branch: str) -> Session | None:
        """A ``fork --into`` killed after writing ``dest``'s link file: finish it (opening a
        session there completes its journal) instead of refusing a non-empty directory."""
        link = dest / _LINK_FILE
        if self.store.home is None or not link.is_file():
            return None
        try:
            if [p.name for p in dest.iterdir()] != [_LINK_FILE]:
                return None
            data = json.loads(link.read_text())
        except (OSError, ValueError):
            return None
        mine = {"store": str(self.store.home), "session": self.name, "branch": branch}
        if data != mine or self.store.meta.get_meta(f"restore-journal:{dest}") is None:
            return None
        other = Session(self.store, self.name, workspace=dest, branch=branch, force=True, bind=True)
        return other if other.head is not None else None

    def _write_link_file(self, dest: Path, branch: str) -> None:
        """A ``.stashpoint`` file telling the CLI, run inside ``dest``, which store to use."""
        if self.store.home is None:
            return
        link = {"store": str(self.store.home), "session": self.name, "branch": branch}
        (dest / _LINK_FILE).write_text(json.dumps(link) + "\n")

    # -- diff -----------------------------------------------------------------------------
    def diff(self, a: str | Checkpoint, b: str | Checkpoint) -> CheckpointDiff:
        """What changed from ``a`` to ``b``: decoded state values, the conversation as
        messages added, removed and edited, and the files (see :mod:`stashpoint.statediff`)."""
        ca = a if isinstance(a, Checkpoint) else self.get(a)
        cb = b if isinstance(b, Checkpoint) else self.get(b)
        check_not_pruned(self.store, [ca, cb])
        from .statediff import compare

        return compare(self, ca, cb)


def _chained(
    log: str, start: int, chain: str, new_log: LogInfo | None, encoded: list[bytes]
) -> tuple[ConversationRef, LogAppend]:
    """The conversation ref and the append (fenced by the commit that carries it) of
    ``encoded`` messages written to ``log`` from ``start``, each chained to the last."""
    rows = []
    for data in encoded:
        chain = message_chain(chain, data)
        rows.append((bytes.fromhex(chain), data))
    return ConversationRef(log, start + len(encoded), chain), LogAppend(log, start, rows, new_log)


def _empty_directory(path: Path, *, remove: bool) -> None:
    import shutil

    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    if remove:
        with contextlib.suppress(OSError):
            path.rmdir()


def _merge_artifacts(head: Checkpoint | None, changes: Mapping[str, Any]) -> dict[str, Any]:
    base = head.artifacts if head is not None else {}
    if not changes:
        return dict(base)
    from .artifacts import merge

    return merge(base, changes)


def _artifact_plan(
    target: Checkpoint,
    spec: bool | Mapping[str, str | os.PathLike[str] | None],
    *,
    to_dir: str | os.PathLike[str] | None,
    recorded_ok: bool,
    protected: Iterable[Path],
) -> dict[str, Path]:
    """Name -> where a rewind writes each of the target's artifacts (see
    :mod:`stashpoint.restore_target` for the rule)."""
    from .artifacts import restore_target as artifact_path

    wanted = dict.fromkeys(target.artifacts) if spec is True else dict(spec or {})
    missing = [n for n in wanted if n not in target.artifacts]
    if missing:
        raise NotFoundError(f"checkpoint {target.id} has no artifact named {missing[0]!r}")
    dests = restore_target.artifact_destinations(
        wanted,
        {n: target.artifacts[n].path for n in wanted},
        to_dir=to_dir,
        recorded_ok=recorded_ok,
    )
    protected = list(protected)
    return {
        n: restore_target.check_artifact_target(
            n, artifact_path(target.artifacts[n], dest, n), protected
        )
        for n, dest in dests.items()
    }


def _args_summary(args: Any, limit: int = 80) -> str:
    """``(to='a@b', n=2)`` from a ledger's recorded [args, kwargs], cut to ``limit``."""
    try:
        pos, kw = args
        parts = [repr(a) for a in pos] + [f"{k}={v!r}" for k, v in kw.items()]
    except (TypeError, ValueError, AttributeError):
        parts = [repr(args)]
    text = "(" + ", ".join(parts) + ")"
    return text if len(text) <= limit else text[: limit - 2] + "…)"


def checkpoint_json(cp: Checkpoint, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The CLI contract's object for a checkpoint."""
    d = cp.to_dict()
    if labels is not None:  # the current label (a deleted one is gone; the record keeps its
        d["label"] = labels.get(cp.id)  # creation label, which only history shows)
    return msgspec.to_builtins(d)  # type: ignore[no-any-return]


def _unicode_text(text: str) -> str:
    """``text`` storable as UTF-8: a lone surrogate (from ``json.loads`` of a tool's broken
    output, which an integration may quote in a checkpoint message) becomes U+FFFD, as a
    decoder would show it. Messages describe checkpoints; state values keep theirs exactly."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _check_name(kind: str, name: str) -> None:
    """Names are stored as text by every backend: one that is empty, holds NUL or is not
    valid Unicode (a stray byte from a command line) is refused here, with a clear error."""
    if not name:
        raise UsageError(f"a {kind} needs a non-empty name")
    if "\0" in name:
        raise UsageError(f"a {kind} name cannot contain NUL: {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"a {kind} name must be valid Unicode: {name!r}") from None
