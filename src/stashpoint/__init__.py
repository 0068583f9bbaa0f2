"""stashpoint: save, restore, rewind and fork the complete execution state of AI agents.

    import stashpoint
    store = stashpoint.open()                       # ./.stashpoint (SQLite + local blobs)
    run = store.session("fix-issue-42", workspace="repo/")
    cp = run.checkpoint({"messages": msgs, "plan": plan}, message="before migration")
    run.rewind(cp.id)                                # files and state; undoable

Names are imported on first use (PEP 562), so ``stashpoint --help`` does not pay for the
storage stack: `stashpoint --help` must start in under 60 ms.
"""

# No ``from __future__ import annotations`` here, nor in the thin client's modules: it imports
# the ``__future__`` module, which a served command would pay for.
TYPE_CHECKING = False  # not typing's: importing typing costs every command ~5 ms
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ArtifactRef": "stashpoint.model",
    "AsyncSession": "stashpoint.aio",
    "AsyncStore": "stashpoint.aio",
    "Checkpoint": "stashpoint.model",
    "CheckpointDiff": "stashpoint.statediff",
    "ClashError": "stashpoint.errors",
    "ConflictError": "stashpoint.errors",
    "DivergenceError": "stashpoint.errors",
    "Durability": "stashpoint.durability",
    "Effect": "stashpoint.durable",
    "EncryptionKeyError": "stashpoint.errors",
    "GcBusy": "stashpoint.errors",
    "GcEpochChanged": "stashpoint.errors",
    "IntegrityError": "stashpoint.errors",
    "Lease": "stashpoint.lease",
    "LeaseHeld": "stashpoint.errors",
    "LeaseLost": "stashpoint.errors",
    "MirrorWarning": "stashpoint.errors",
    "MissingExtraError": "stashpoint.errors",
    "NotFoundError": "stashpoint.errors",
    "PackMissing": "stashpoint.errors",
    "RollbackError": "stashpoint.errors",
    "Pending": "stashpoint.durable",
    "PrunedError": "stashpoint.errors",
    "Redactor": "stashpoint.redact",
    "RestoreBlocked": "stashpoint.errors",
    "RestoreImpossible": "stashpoint.errors",
    "RestoreRefused": "stashpoint.errors",
    "RewindResult": "stashpoint.session",
    "RunPaused": "stashpoint.durable",
    "RunResult": "stashpoint.durable",
    "SchemaVersionError": "stashpoint.errors",
    "SerializationError": "stashpoint.errors",
    "Session": "stashpoint.session",
    "StashpointError": "stashpoint.errors",
    "StashpointWarning": "stashpoint.errors",
    "StepFailed": "stashpoint.errors",
    "Store": "stashpoint._store",
    "StoreError": "stashpoint.errors",
    "Task": "stashpoint.durable",
    "ToolRejected": "stashpoint.errors",
    "Trial": "stashpoint.trial",
    "UpgradeRequired": "stashpoint.errors",
    "UsageError": "stashpoint.errors",
    "ValidationError": "stashpoint.errors",
    "current_effect_key": "stashpoint.durable",
    "generate_key": "stashpoint.crypto",
    "open": "stashpoint.opening",
    "upgrade_store": "stashpoint.opening",
    "open_async": "stashpoint.aio",
    "register_type": "stashpoint.serde",
}

__all__ = [
    "ArtifactRef",
    "AsyncSession",
    "AsyncStore",
    "Checkpoint",
    "CheckpointDiff",
    "ClashError",
    "ConflictError",
    "DivergenceError",
    "Durability",
    "Effect",
    "EncryptionKeyError",
    "GcBusy",
    "GcEpochChanged",
    "IntegrityError",
    "Lease",
    "LeaseHeld",
    "LeaseLost",
    "MirrorWarning",
    "MissingExtraError",
    "NotFoundError",
    "PackMissing",
    "Pending",
    "PrunedError",
    "Redactor",
    "RestoreBlocked",
    "RestoreImpossible",
    "RestoreRefused",
    "RewindResult",
    "RollbackError",
    "RunPaused",
    "RunResult",
    "SchemaVersionError",
    "SerializationError",
    "Session",
    "StashpointError",
    "StashpointWarning",
    "StepFailed",
    "Store",
    "StoreError",
    "Task",
    "ToolRejected",
    "Trial",
    "UpgradeRequired",
    "UsageError",
    "ValidationError",
    "__version__",
    "current_effect_key",
    "generate_key",
    "open",
    "open_async",
    "register_type",
    "upgrade_store",
]

if TYPE_CHECKING:
    from ._store import Store
    from .aio import AsyncSession, AsyncStore, open_async
    from .crypto import generate_key
    from .durability import Durability
    from .durable import Effect, Pending, RunPaused, RunResult, Task, current_effect_key
    from .errors import (
        ClashError,
        ConflictError,
        DivergenceError,
        EncryptionKeyError,
        GcBusy,
        GcEpochChanged,
        IntegrityError,
        LeaseHeld,
        LeaseLost,
        MirrorWarning,
        MissingExtraError,
        NotFoundError,
        PackMissing,
        PrunedError,
        RestoreBlocked,
        RestoreImpossible,
        RestoreRefused,
        RollbackError,
        SchemaVersionError,
        SerializationError,
        StashpointError,
        StashpointWarning,
        StepFailed,
        StoreError,
        ToolRejected,
        UpgradeRequired,
        UsageError,
        ValidationError,
    )
    from .lease import Lease
    from .model import ArtifactRef, Checkpoint
    from .opening import open_store as open
    from .opening import upgrade_store
    from .redact import Redactor
    from .serde import register_type
    from .session import RewindResult, Session
    from .statediff import CheckpointDiff
    from .trial import Trial


def __getattr__(name: str) -> "Any":
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stashpoint' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), "open_store" if name == "open" else name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
