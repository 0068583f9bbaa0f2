"""Where a branch's live run is recorded, and whether that record still applies.

Apart from :mod:`stashpoint.durable` because every checkpoint asks (``stashpoint snap`` from an
agent's hook too), and importing the durable-execution engine for two small functions cost a
CLI run ~8 ms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .model import Checkpoint

__all__ = ["UNREAD", "record_applies"]

UNREAD: Any = object()
"""A session's run record not read yet (None is read, and absent): read on first use, and
set back to this after anything that may change it."""


def record_applies(record: Mapping[str, Any], head: Checkpoint | None) -> bool:
    """Whether a run record is the branch's live run: the head is where it started, one of
    its checkpoints, or a checkpoint taken on top without a journal of its own (a ``snap``).
    Rewinds and forks delete the record; this check guards against any other head move."""
    if "log" not in record:  # an ended run: only its command is left
        return False
    if head is None:
        return record.get("base") is None
    if head.id == record.get("base"):
        return True
    j = head.journal
    if j is None:  # the run started from an empty journal and has not checkpointed since
        return record.get("parent") is None
    if j.log == record.get("log"):
        return True
    return j.log == record.get("parent") and j.length == record.get("parent_len")
