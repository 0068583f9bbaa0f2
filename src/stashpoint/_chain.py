"""Checkpoints in the order of their parent chain, newest first.

Why not by id: an id starts with its process's clock, so two processes committing to one
session in the same millisecond (or on machines whose clocks disagree) can give a child a
smaller id than its parent, and a list by id then shows the pair the wrong way round.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from .stores.base import CheckpointRow

__all__ = ["WINDOW_SLACK", "chain_order"]

WINDOW_SLACK = 32
"""Rows read beyond a limit before ordering: a child whose id sorts just below the last row of
the window (its parent's same-millisecond neighbour) still lands before its parent."""


def chain_order(rows: Sequence[CheckpointRow]) -> list[CheckpointRow]:
    """``rows`` with every child before its parent; otherwise the larger id first.

    In memory from the index columns (``id``, ``parent``), O(n log n), no query: a parent
    outside ``rows`` does not hold its child back. Rows on a parent cycle (only damaged index
    columns make one) follow at the end by id, so nothing is dropped."""
    ordered = sorted(rows, key=_row_id, reverse=True)  # the store's order already: ~O(n)
    rank = {r.id: i for i, r in enumerate(ordered)}
    end = len(ordered)  # a parent outside ``rows`` (or none) counts as after every row
    if all(rank.get(r.parent or "", end) > i for i, r in enumerate(ordered)):
        return ordered  # every parent already after its children (the usual case): no heap
    waiting: dict[str, int] = {}
    for r in ordered:
        if r.parent is not None and r.parent in rank:
            waiting[r.parent] = waiting.get(r.parent, 0) + 1
    ready = [i for i, r in enumerate(ordered) if r.id not in waiting]  # ascending: a heap
    out: list[CheckpointRow] = []
    while ready:
        row = ordered[heapq.heappop(ready)]
        out.append(row)
        parent = row.parent
        if parent is not None and parent in waiting:
            waiting[parent] -= 1
            if not waiting[parent]:
                heapq.heappush(ready, rank[parent])
    if len(out) < len(ordered):
        done = {r.id for r in out}
        out += [r for r in ordered if r.id not in done]
    return out


def _row_id(row: CheckpointRow) -> str:
    return row.id
