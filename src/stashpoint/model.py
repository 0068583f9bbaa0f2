"""Immutable records: what a checkpoint is, and what a workspace tree is made of.

A checkpoint stores *references*, not copies: the conversation is a prefix of an append-only
message log (so n messages cost O(n) bytes across all checkpoints), values are content-addressed
blobs (an unchanged key is stored once), and the workspace is the root of a Merkle tree whose
unchanged subtrees are shared with earlier checkpoints.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any, Literal

import msgspec

__all__ = [
    "FORMAT_VERSION",
    "ArtifactRef",
    "Checkpoint",
    "ConversationRef",
    "Kind",
    "LogRef",
    "StateRef",
    "TreeEntry",
    "WorkspaceRef",
]

FORMAT_VERSION = 1
"""Version of the checkpoint record layout; a reader refuses records newer than it knows."""

Kind = Literal[
    "auto", "manual", "milestone", "pre-rewind", "rewind", "fork", "edit", "approval", "paused"
]
KINDS: tuple[str, ...] = Kind.__args__  # type: ignore[attr-defined]


class LogRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The first ``length`` entries of append-only log ``log`` (a conversation or a journal)."""

    log: str
    """Id of the append-only log; a log may continue a parent log from a fork point."""
    length: int
    """Number of messages in this checkpoint's conversation."""
    hash: str
    """Running SHA-256 over the messages (h_i = H(h_{i-1} || message_i)), hex."""


ConversationRef = LogRef
"""The conversation is a log of messages."""


class StateRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    conversation: LogRef | None = None
    """The conversation, if the state had one (the ``messages`` key by default)."""
    values: dict[str, str] = {}
    """State key -> SHA-256 hex of the encoded value, stored as a content-addressed blob."""


class WorkspaceRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    root: str
    """Absolute path of the workspace directory the snapshot was taken from."""
    tree: str
    """SHA-256 hex of the root tree object."""
    files: int
    """Number of regular files and symlinks in the snapshot."""
    bytes: int
    """Total size of the regular files, uncompressed."""


class ArtifactRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A large file outside the workspace attached to a checkpoint by name."""

    digest: str
    """SHA-256 hex of the content: a blob, or a list of content-defined chunks."""
    size: int
    path: str
    """Absolute path it was attached from: where a rewind puts it back by default."""
    mode: int = 0o644
    """Permission bits of the file when attached."""
    chunks: int = 1
    """Number of content-defined chunks it is stored as."""


class Checkpoint(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One immutable node of a session's checkpoint DAG.

    ``digest`` is SHA-256 over the canonical encoding of every other field, and that encoding
    includes ``parent_digest``: the checkpoints of a session form a hash chain, so editing,
    deleting or re-ordering any of them is detected by its descendants.
    """

    format: int = FORMAT_VERSION
    id: str
    """Time-sortable id (ULID layout)."""
    session: str
    branch: str
    parent: str | None
    parent_digest: str | None
    step: int
    """Execution position: number of steps taken on this line of history."""
    kind: str
    label: str | None = None
    """Label given at creation; later labels live beside the record (see ``Store.labels``)."""
    message: str | None = None
    created_at: str
    """ISO 8601 UTC with microseconds, e.g. ``2026-11-21T23:59:04.123456Z``."""
    schema_version: int = 1
    """Version of the application's state schema (for migrations)."""
    config_hash: str | None = None
    """SHA-256 of the agent configuration, to warn when resuming under a different one."""
    deps: dict[str, str] = {}
    """Versions of Python, stashpoint and the packages the application named."""
    state: StateRef = StateRef()
    workspace: WorkspaceRef | None = None
    journal: LogRef | None = None
    """Durable-execution journal as of this checkpoint: step results, task changes, the
    side-effect ledger and approval decisions (see :mod:`stashpoint.durable`)."""
    status: str | None = None
    """Run status when recorded by a durable run: ``running``, ``awaiting_approval``,
    ``completed`` or ``failed``; None for checkpoints outside a durable run."""
    meta: dict[str, Any] = {}
    """Free-form application metadata (JSON types only)."""
    artifacts: dict[str, ArtifactRef] = {}
    """Name -> large file outside the workspace (see :mod:`stashpoint.artifacts`). Records
    written before artifacts existed lack the key and decode to ``{}``; their stored bodies
    still verify, since digests are over the stored bytes."""
    digest: str = ""

    @property
    def created(self) -> dt.datetime:
        return dt.datetime.fromisoformat(self.created_at.replace("Z", "+00:00"))

    def to_dict(self, label: str | None = None) -> dict[str, Any]:
        """JSON-ready dict; ``label`` overrides the creation label with the current one."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        if label is not None:
            out["label"] = label
        return out


class TreeEntry(msgspec.Struct, frozen=True, array_like=True):
    """One name in a workspace directory. Names are raw bytes, as the filesystem has them."""

    name: bytes
    kind: str
    """``f`` regular file, ``d`` directory, ``l`` symbolic link."""
    mode: int
    """Permission bits (``st_mode & 0o7777``)."""
    size: int
    ref: bytes
    """File: SHA-256 of the content. Directory: SHA-256 of its tree. Link: the target bytes."""


_second: tuple[int, str] = (-1, "")
"""The last whole second formatted (``2026-11-21T23:59:04.``): reused while it lasts."""


def utc_now_iso() -> str:
    """``2026-11-21T23:59:04.123456Z``: the clock's microseconds after the cached date and
    time of its second. Why not ``datetime.now(timezone.utc)...isoformat()``: ~20k CPU
    instructions once per checkpoint, this ~2k (the second is formatted once a second)."""
    global _second
    sec, us = divmod(time.time_ns() // 1000, 1_000_000)  # floored, as datetime.now() is
    last, prefix = _second
    if sec != last:
        t = time.gmtime(sec)
        prefix = (
            f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T"
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}."
        )
        _second = (sec, prefix)
    return f"{prefix}{us:06d}Z"
