"""Every exception and warning stashpoint raises on purpose, in one tree; each error carries a
stable CLI exit code.

    StashpointError                      exit 1
    ├── UsageError                       exit 1   bad arguments, refused workspace roots
    │   ├── EncryptionKeyError           exit 1   encrypted store opened without / with another key
    │   ├── ValidationError              exit 1   a state validator refused an edit
    │   ├── RestoreRefused               exit 1   a restore would write where the user did not point
    │   ├── RestoreBlocked               exit 1   a restore would overwrite files no snapshot holds
    │   │   └── RestoreImpossible        exit 1   the target filesystem cannot hold a path
    │   ├── ClashError                   exit 1   an imported id or branch differs from the store's
    │   └── UpgradeRequired              exit 1   a write to a store in an older format
    ├── NotFoundError                    exit 1   unknown checkpoint, session or branch
    │   └── PrunedError                  exit 1   the checkpoint's state and files were released
    ├── SerializationError               exit 1   a value of a type the allowlist does not know
    ├── StoreError                       exit 1   the backend failed (wrapped driver error)
    │   └── SchemaVersionError           exit 1   store written by a newer stashpoint
    ├── IntegrityError                   exit 2   digest mismatch, broken hash chain, missing record
    │   ├── PackMissing                  exit 2   a pack file is not there
    │   └── RollbackError                exit 2   the store is older than this user's witness
    ├── ConflictError                    exit 3   head moved under us, lease lost
    │   ├── LeaseHeld                    exit 3   another worker owns the session's lease
    │   ├── LeaseLost                    exit 3   this worker's lease was taken over
    │   └── GcEpochChanged               exit 3   a commit raced a garbage collection
    ├── GcBusy                           exit 1   another collector holds the store
    ├── DivergenceError                  exit 1   a durable run made another call than its journal
    ├── ToolRejected                     exit 1   a human rejected a gated tool call
    ├── StepFailed                       exit 1   a replayed step had failed
    └── MissingExtraError                exit 1   an integration's framework is not installed

    StashpointWarning                             soft problems: another agent config on resume
    └── MirrorWarning                             a read was served by the mirror

``RunPaused`` (in :mod:`stashpoint.durable`) is not an error: it is the control-flow signal
that stops a run until a human decides, and never leaves :meth:`Session.run`.

Exit codes are part of the CLI contract and stay reserved once used.
"""

from __future__ import annotations

__all__ = [
    "ClashError",
    "ConflictError",
    "DivergenceError",
    "EncryptionKeyError",
    "GcBusy",
    "GcEpochChanged",
    "IntegrityError",
    "LeaseHeld",
    "LeaseLost",
    "MirrorWarning",
    "MissingExtraError",
    "NotFoundError",
    "PackMissing",
    "PrunedError",
    "RestoreBlocked",
    "RestoreImpossible",
    "RestoreRefused",
    "RollbackError",
    "SchemaVersionError",
    "SerializationError",
    "StashpointError",
    "StashpointWarning",
    "StepFailed",
    "StoreError",
    "ToolRejected",
    "UpgradeRequired",
    "UsageError",
    "ValidationError",
]


class StashpointError(Exception):
    """Root of every error stashpoint raises on purpose."""

    exit_code = 1


class UsageError(StashpointError):
    """The caller asked for something that cannot be done as asked."""


class EncryptionKeyError(UsageError):
    """The store is encrypted and no key, or another key, was given (nothing is damaged: the
    caller must supply the right key), or a key was given for a store that holds plaintext."""


class NotFoundError(StashpointError):
    """A checkpoint, session, branch or blob that does not exist."""


class SerializationError(StashpointError):
    """A value cannot be encoded (unsupported type) or decoded (hostile or over limits)."""


class StoreError(StashpointError):
    """The storage backend failed; the driver's exception is chained as ``__cause__``."""


class SchemaVersionError(StoreError):
    """The store or a record uses a format version this stashpoint does not understand."""


class UpgradeRequired(UsageError):
    """A write to a store in an older format (it reads as it is, but is written only in the
    current format): ``stashpoint upgrade`` converts it. Nothing was written."""


class IntegrityError(StashpointError):
    """Stored data does not match its digest or its place in the hash chain.

    ``checkpoint`` names the damaged checkpoint when known; ``last_good`` names the newest
    ancestor that still verifies, so callers can offer it instead of failing blind.
    """

    exit_code = 2

    def __init__(
        self, message: str, *, checkpoint: str | None = None, last_good: str | None = None
    ) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint
        self.last_good = last_good


class ConflictError(StashpointError):
    """Another writer moved the branch head (compare-and-set failed) or a lease was lost."""

    exit_code = 3


class LeaseHeld(ConflictError):
    """Another worker owns the session's lease and it has not expired."""

    def __init__(self, message: str, *, owner: str | None = None, expires_in: float = 0.0):
        super().__init__(message)
        self.owner = owner
        self.expires_in = expires_in


class LeaseLost(ConflictError):
    """This worker's lease was taken over (it expired): its writes are fenced off."""


class PrunedError(NotFoundError):
    """The checkpoint's record is there (its chain link verifies) but retention released its
    state and files."""

    def __init__(self, ident: str, at: str | None = None) -> None:
        when = f" at {at}" if at else ""
        super().__init__(
            f"checkpoint {ident} was pruned by retention{when}: its record remains for the hash "
            "chain, but its state and files were released; pick a kept checkpoint "
            "(stashpoint log)"
        )
        self.checkpoint = ident


class GcEpochChanged(ConflictError):
    """A commit was built on blob-existence checks made before a GC condemned blobs.

    Raised only for commits that carry ``gc_epoch``: the writer must re-check (re-scan) and
    commit again, since a blob it found may be deleted by that GC.
    """


class DivergenceError(StashpointError):
    """The program made a different durable call than the journal recorded at that slot.

    Replaying recorded results into different calls would be silent corruption, so the run
    stops at exactly that call. Rewind to a checkpoint before it, or start a fresh run.
    """


class ToolRejected(StashpointError):
    """A human rejected this tool call (or an in-doubt effect); the agent decides what next."""

    def __init__(self, message: str, *, tool: str, reason: str | None) -> None:
        super().__init__(message)
        self.tool = tool
        self.reason = reason


class StepFailed(StashpointError):
    """A replayed step had failed with an exception type stashpoint does not re-create."""

    def __init__(self, message: str, *, type_name: str) -> None:
        super().__init__(message)
        self.type_name = type_name


class GcBusy(StashpointError):
    """Another collector holds the store (one at a time per blob directory)."""


class MissingExtraError(StashpointError, ImportError):
    """An adapter's framework is not installed; the message names the extra to install.

    An ``ImportError`` so that ``try: import ... except ImportError`` guards keep working, and
    a ``StashpointError`` so the CLI maps it to exit code 1 with a readable line.
    """


class PackMissing(IntegrityError):
    """A pack file is not there: damage, or a GC repacked it after the row was read."""


class RollbackError(IntegrityError):
    """A branch head is older than the newest one this user saw (``seen``: its sequence
    number then; ``now``: now, None if the branch is gone): the store was rolled back
    (:mod:`stashpoint.witness`)."""

    def __init__(self, message: str, *, seen: int, now: int | None) -> None:
        super().__init__(message)
        self.seen = seen
        self.now = now


class ClashError(UsageError):
    """The store holds an id of the bundle with other contents, or a branch whose history
    differs: refused (exit 1 for an import; ``stashpoint copy`` reports it as a conflict)."""


class RestoreRefused(UsageError):
    """A restore would write where the user did not point it (exit 1)."""


class RestoreBlocked(UsageError):
    """The target has a file or link where the workspace has a directory that still holds
    ignored files, which a restore never touches: the user must move them first (as git
    refuses to overwrite untracked files)."""


class RestoreImpossible(RestoreBlocked):
    """The target filesystem cannot hold a path of the checkpoint (a name or path too long, a
    name it cannot encode, a file too large for it). Unlike a full disk, running the restore
    again fails the same way, so it is undone like a blocked one - a fork's new directory is
    removed - instead of being left for a re-run that can never finish it."""


class ValidationError(UsageError):
    """A state validator refused an edit; nothing was saved."""


class StashpointWarning(UserWarning):
    """Resuming under another agent config or state schema, and similar soft problems."""


class MirrorWarning(StashpointWarning):
    """A read was served by the mirror because the primary failed (or a mirror write failed)."""
