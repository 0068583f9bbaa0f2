"""Reading a session: references, the branch head, history, state, diffs and artifacts;
and its labels, the names people give checkpoints.

Everything here only reads the store (and verifies what it reads): a checkpoint's state
decoded and migrated, the history in chain order, an artifact streamed chunk by chunk.

These are :class:`~stashpoint.Session` methods defined here, by concern, and joined into
the class by :class:`Reading`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from . import restore_target, serde
from ._store import check_not_pruned
from .errors import IntegrityError, NotFoundError, SchemaVersionError, StashpointWarning, UsageError
from .model import Checkpoint

if TYPE_CHECKING:
    from .model import ArtifactRef
    from .session import Session
    from .statediff import CheckpointDiff
    from .stores.base import CheckpointRow

__all__ = ["Reading", "checkpoint_json"]


def checkpoint_json(cp: Checkpoint, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The CLI contract's object for a checkpoint."""
    d = cp.to_dict()
    if labels is not None:  # the current label (a deleted one is gone; the record keeps its
        d["label"] = labels.get(cp.id)  # creation label, which only history shows)
    return msgspec.to_builtins(d)  # type: ignore[no-any-return]


def _reload_head(self: Session) -> None:
    ident = self.store.meta.get_head(self.name, self.branch)
    if ident is None:
        self._head = None
    elif self._head is None or self._head.id != ident:
        self._head = self.store.get(ident)
        self._conv_objs = None
    self._head_loaded = True


def resolve(self: Session, ref: str) -> str:
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


def get(self: Session, ref: str) -> Checkpoint:
    cp = self.store.get(self.resolve(ref))
    if cp.session != self.name:
        raise NotFoundError(f"checkpoint {cp.id} belongs to session {cp.session!r}")
    return cp


def history(
    self: Session, *, limit: int | None = None, damaged: list[IntegrityError] | None = None
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


def labels(self: Session) -> dict[str, str]:
    return self.store.meta.labels(self.name)


def branches(self: Session) -> dict[str, str]:
    return self.store.meta.branches(self.name)


def state(self: Session, ref: str | Checkpoint | None = None) -> dict[str, Any]:
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


def _as_checkpoint(self: Session, ref: str | Checkpoint | None) -> Checkpoint | None:
    if ref is None:
        return self.head
    if isinstance(ref, Checkpoint):
        return ref
    return self.get(ref)


def _warn_if_foreign(self: Session, cp: Checkpoint, *, schema: bool = True) -> None:
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


def diff(self: Session, a: str | Checkpoint, b: str | Checkpoint) -> CheckpointDiff:
    """What changed from ``a`` to ``b``: decoded state values, the conversation as
    messages added, removed and edited, and the files (see :mod:`stashpoint.statediff`)."""
    ca = a if isinstance(a, Checkpoint) else self.get(a)
    cb = b if isinstance(b, Checkpoint) else self.get(b)
    check_not_pruned(self.store, [ca, cb])
    from .statediff import compare

    return compare(self, ca, cb)


def artifacts(self: Session, ref: str | Checkpoint | None = None) -> dict[str, ArtifactRef]:
    """Name -> artifact attached to a checkpoint (default: the head)."""
    cp = self._as_checkpoint(ref)
    return dict(cp.artifacts) if cp is not None else {}


def _artifact(self: Session, ref: str | Checkpoint | None, name: str) -> ArtifactRef:
    cp = self._as_checkpoint(ref)
    if cp is None:
        raise NotFoundError(f"branch {self.branch!r} of session {self.name!r} is empty")
    check_not_pruned(self.store, cp)
    found = cp.artifacts.get(name)
    if found is None:
        have = ", ".join(cp.artifacts) or "none"
        raise NotFoundError(f"checkpoint {cp.id} has no artifact {name!r} (it has: {have})")
    return found


def read_artifact(self: Session, ref: str | Checkpoint | None, name: str) -> Iterator[bytes]:
    """Stream an artifact's content, verified chunk by chunk (and whole, at the end)."""
    from .artifacts import read_artifact

    return read_artifact(self.store.blobs, self._artifact(ref, name))


def fetch_artifact(
    self: Session,
    ref: str | Checkpoint | None,
    name: str,
    dest: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write an artifact to ``dest`` (a directory gets its original file name),
    atomically; returns the path written. Nothing else changes: no safety checkpoint, so
    an existing file there is replaced only with ``overwrite`` (and only a regular file)."""
    from .artifacts import restore_artifact
    from .artifacts import restore_target as artifact_path

    art = self._artifact(ref, name)
    target = restore_target.check_artifact_target(
        name, artifact_path(art, dest, name), self.store.own_paths
    )
    restore_target.check_fetch_target(name, target, overwrite=overwrite)
    try:
        # Without overwrite the check above is not enough: a file made at target while the
        # artifact is written would be replaced, so the write itself takes only a free name.
        restore_artifact(self.store.blobs, art, target, progress=progress, replace=overwrite)
    except FileExistsError:
        restore_target.check_fetch_target(name, target, overwrite=False)
        raise  # gone again already: the OS error says what happened
    return target


def label(self: Session, ref: str, label: str | None) -> Checkpoint:
    cp = self.get(ref)
    self.check_may_write()
    self._set_label(cp.id, self._redact_label(label))
    return cp


def _set_label(self: Session, ident: str, label: str | None) -> None:
    """A label names one checkpoint of the session: set on another, it moves there (as a
    git tag with -f; two checkpoints with one label made ``show NAME`` pick either)."""
    if label is not None:
        for other, name in self.store.meta.labels(self.name).items():
            if name == label and other != ident:
                self.store.meta.set_label(other, self.name, None)
    self.store.meta.set_label(ident, self.name, label)


class Reading:
    """The methods above, as :class:`~stashpoint.Session` has them."""

    _reload_head = _reload_head
    resolve = resolve
    get = get
    history = history
    labels = labels
    branches = branches
    state = state
    _as_checkpoint = _as_checkpoint
    _warn_if_foreign = _warn_if_foreign
    diff = diff
    artifacts = artifacts
    _artifact = _artifact
    read_artifact = read_artifact
    fetch_artifact = fetch_artifact
    label = label
    _set_label = _set_label
