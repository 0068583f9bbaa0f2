"""What the saver uses of LangGraph, imported in one place: without the ``langgraph`` extra,
importing the saver fails here, with the install line to run."""

from __future__ import annotations

from ...errors import MissingExtraError

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        CheckpointMetadata,
        CheckpointTuple,
        PendingWrite,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.base import Checkpoint as LGCheckpoint
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
except ImportError as exc:
    raise MissingExtraError(
        "stashpoint.integrations.langgraph needs LangGraph: pip install 'stashpoint[langgraph]'"
    ) from exc


__all__ = [
    "WRITES_IDX_MAP",
    "BaseCheckpointSaver",
    "ChannelVersions",
    "CheckpointMetadata",
    "CheckpointTuple",
    "JsonPlusSerializer",
    "LGCheckpoint",
    "PendingWrite",
    "RunnableConfig",
    "SerializerProtocol",
    "get_checkpoint_id",
    "get_serializable_checkpoint_metadata",
]
