"""One error tree for the whole library; every error carries a stable CLI exit code.

    StashpointError                      exit 1
    ├── UsageError                       exit 1   bad arguments, refused workspace roots
    │   └── EncryptionKeyError           exit 1   encrypted store opened without / with another key
    ├── NotFoundError                    exit 1   unknown checkpoint, session or branch
    ├── SerializationError               exit 1   a value of a type the allowlist does not know
    ├── StoreError                       exit 1   the backend failed (wrapped driver error)
    │   └── SchemaVersionError           exit 1   store written by a newer stashpoint
    ├── IntegrityError                   exit 2   digest mismatch, broken hash chain, missing record
    └── ConflictError                    exit 3   head moved under us, lease lost

Exit codes are part of the CLI contract and stay reserved once used.
"""

from __future__ import annotations

__all__ = [
    "ConflictError",
    "EncryptionKeyError",
    "IntegrityError",
    "LeaseHeld",
    "LeaseLost",
    "NotFoundError",
    "PrunedError",
    "SchemaVersionError",
    "SerializationError",
    "StashpointError",
    "StoreError",
    "UsageError",
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
