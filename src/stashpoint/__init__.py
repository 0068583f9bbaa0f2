"""stashpoint: save, restore, rewind and fork the complete execution state of AI agents.

    import stashpoint
    store = stashpoint.open()                       # ./.stashpoint (SQLite + local blobs)
    run = store.session("fix-issue-42", workspace="repo/")
    cp = run.checkpoint({"messages": msgs, "plan": plan}, message="before migration")
    run.rewind(cp.id)                                # files and state; undoable
"""

from __future__ import annotations

from ._store import Store
from ._store import open_store as open
from .errors import (
    ConflictError,
    IntegrityError,
    NotFoundError,
    SchemaVersionError,
    SerializationError,
    StashpointError,
    StoreError,
    UsageError,
)
from .model import Checkpoint
from .serde import register_type
from .session import CheckpointDiff, RewindResult, Session, StashpointWarning

__version__ = "0.1.0"

__all__ = [
    "Checkpoint",
    "CheckpointDiff",
    "ConflictError",
    "IntegrityError",
    "NotFoundError",
    "RewindResult",
    "SchemaVersionError",
    "SerializationError",
    "Session",
    "StashpointError",
    "StashpointWarning",
    "Store",
    "StoreError",
    "UsageError",
    "__version__",
    "open",
    "register_type",
]
