"""Which directory a session's workspace is, which branch it follows, and where a restore
into it may write.

A workspace directory *follows* a branch (its checkout, kept in the store's meta) and a
branch is *bound* to the directory its checkpoints are taken in: the rule itself is
:mod:`stashpoint.restore_target`; this module applies it to one session object, with the
caches that keep a checkpoint from paying for it more than once.

These are :class:`~stashpoint.Session` methods defined here, by concern, and joined into
the class by :class:`Binding`: they read and write the session's own fields, as methods do.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from . import restore_target
from ._store import Store
from .errors import StashpointWarning, UsageError
from .metakeys import checkout_key
from .workspace import Workspace, check_root

if TYPE_CHECKING:
    from .model import Checkpoint
    from .session import Session

__all__ = ["Binding", "open_workspace"]


def open_workspace(
    store: Store, workspace: Path, *, force: bool, watch: bool
) -> tuple[Path, Workspace]:
    """The checked root of a session's workspace and the scanner over it: never the store's
    own directory (snapshotting the store into itself)."""
    root = check_root(workspace, force=force)
    home = store.home
    if home is not None and (root == home or home in root.parents):
        raise UsageError(
            f"the workspace {root} is the store's own directory {home}: snapshot "
            "the project that holds the store, not the store"
        )
    exclude = store.own_paths
    ws = Workspace(
        root,
        store.blobs,
        store_id=store.id,
        epoch=store.gc_epoch,
        cache_dir=store.cache_dir,
        exclude=exclude,
        watch=watch,
        seal=store.cache_seal,
    )
    return root, ws


def _checkout_key(self: Session) -> str | None:
    return checkout_key(self.name, self.root) if self.root is not None else None


def _checkout_branch(self: Session) -> str | None:
    key = self._checkout_key()
    return self.store.meta.get_meta(key) if key else None


def _set_checkout(self: Session, branch: str) -> None:
    key = self._checkout_key()
    if key:
        self.store.meta.set_meta(key, branch)


def bound_root(
    self: Session, branch: str | None = None, target: Checkpoint | None = None
) -> str | None:
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


def _head_root(self: Session, branch: str) -> str | None:
    """The root the branch's head was snapshotted in (only for branches never bound:
    stores older than bindings)."""
    ident = self.store.meta.get_head(self.name, branch)
    cp = self.store.get(ident) if ident else None
    return cp.workspace.root if cp is not None and cp.workspace is not None else None


def _restore_refusal(
    self: Session, branch: str, target: Checkpoint
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


def _in_history(self: Session, branch: str, ident: str) -> bool:
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


def _check_restore(self: Session, branch: str, target: Checkpoint) -> None:
    refused = self._restore_refusal(branch, target)
    if refused is not None:
        raise refused


def _check_restore_here(self: Session) -> None:
    """Refuse a restore into this workspace before anything else is looked at when this
    branch is bound to another directory: then every restore here is refused, and a
    rewind run from the wrong directory must say that, not that its reference (say
    ``HEAD~1`` of a branch at its first checkpoint) does not resolve."""
    if self.root is None or self.explicit_root:
        return
    bound = restore_target.bound_to(self.store, self.name, self.branch)
    if restore_target.usable(bound) and Path(str(bound)) != self.root:
        restore_target.check_workspace(self.name, self.branch, self.root, bound)


def _bind(self: Session, branch: str) -> None:
    """Bind ``branch`` to this workspace (its checkpoints are taken, or restored, here)."""
    assert self.root is not None
    restore_target.bind(self.store, self.name, branch, self.root)
    self._bound = (branch, str(self.root))
    self._bound_here = None


def _snapshot_binding(self: Session) -> str | None:
    """This branch's binding, read once per session object (a checkpoint pays nothing
    for it after the first)."""
    if self._bound is None or self._bound[0] != self.branch:
        bound = restore_target.bound_to(self.store, self.name, self.branch)
        self._bound = (self.branch, bound)
        if bound is None:
            self._bound = (self.branch, self._legacy_binding())
    return self._bound[1]


def _check_snapshot_here(self: Session) -> None:
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


def _bind_on_checkpoint(self: Session) -> None:
    """A checkpoint of this workspace binds a branch that has no usable directory yet:
    new, imported and now snapshotted here, or whose directory is gone (a moved
    project)."""
    if self._bound_here == self.branch:
        return
    if not restore_target.usable(self._snapshot_binding()):
        self._bind(self.branch)
    self._bound_here = self.branch


def _legacy_binding(self: Session) -> str | None:
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


class Binding:
    """The methods above, as :class:`~stashpoint.Session` has them."""

    _checkout_key = _checkout_key
    _checkout_branch = _checkout_branch
    _set_checkout = _set_checkout
    bound_root = bound_root
    _head_root = _head_root
    _restore_refusal = _restore_refusal
    _in_history = _in_history
    _check_restore = _check_restore
    _check_restore_here = _check_restore_here
    _bind = _bind
    _snapshot_binding = _snapshot_binding
    _check_snapshot_here = _check_snapshot_here
    _bind_on_checkpoint = _bind_on_checkpoint
    _legacy_binding = _legacy_binding
