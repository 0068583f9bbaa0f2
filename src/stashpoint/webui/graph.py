"""The session's checkpoints drawn as lanes: one small server-rendered SVG per table row.

Why one SVG per row rather than one for the page: the row and its drawing stay aligned
whatever the browser does with the table, and a page of 100 rows costs a few kilobytes.

A session's checkpoints form a tree (each has one parent). Rows come newest first with a
child always before its parent (``Session.history``). Walking them top-down, each lane waits
for one checkpoint id (the parent of the row that last drew in it): a row takes the first lane
waiting for it, the other lanes waiting for it (its other children: forks) end there with a
diagonal, and a row nobody waits for (a branch tip) opens a free lane.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["LANE_W", "ROW_H", "Cell", "layout", "svg"]

LANE_W = 14
ROW_H = 26
_COLOURS = 6


@dataclass(frozen=True)
class Cell:
    """What one row draws: its node's lane, lanes passing above and below, joins."""

    lane: int
    above: tuple[int, ...]
    """Lanes drawn in the row's top half (straight down), not counting joins."""
    joins: tuple[int, ...]
    """Lanes whose line ends in this row's node (this lane included, when it was waited for)."""
    below: tuple[int, ...]
    """Lanes drawn in the bottom half (this lane: when the row has a parent to come)."""


def layout(rows: Iterable[tuple[str, str | None]], head: str | None = None) -> list[Cell]:
    """One cell per ``(id, parent)`` row, in order (children before parents). The line of
    ``head`` (the checked-out branch) keeps the first lane: lane 0 waits for it from the top,
    drawn only from where it appears."""
    lanes: list[str | None] = [head] if head is not None else []
    held = head is not None  # lane 0 is only held for the head: nothing drawn in it yet

    def drawn(i: int, x: str | None) -> bool:
        return x is not None and not (held and i == 0)

    out: list[Cell] = []
    for ident, parent in rows:
        waiting = [i for i, x in enumerate(lanes) if x == ident]
        if waiting:
            lane = waiting[0]
        else:
            lane = lanes.index(None) if None in lanes else len(lanes)
            if lane == len(lanes):
                lanes.append(None)
        above = tuple(i for i, x in enumerate(lanes) if drawn(i, x) and x != ident)
        joins = tuple(i for i in waiting if drawn(i, ident))
        if ident == head:
            held = False
        for i in waiting:
            lanes[i] = None
        lanes[lane] = parent
        while lanes and lanes[-1] is None:
            lanes.pop()
        below = tuple(i for i, x in enumerate(lanes) if drawn(i, x))
        out.append(Cell(lane, above, joins, below))
    return out


def _x(lane: int) -> int:
    return lane * LANE_W + LANE_W // 2 + 2


def svg(cell: Cell, kind: str, *, head: bool = False, width_lanes: int | None = None) -> str:
    """The row's drawing: lines by lane colour (CSS classes), the node by checkpoint kind."""
    lanes = max((cell.lane, *cell.above, *cell.joins, *cell.below)) + 1
    width = max(lanes, width_lanes or 0) * LANE_W + 4
    mid = ROW_H // 2
    parts = []
    for i in cell.above:
        if i in cell.below:
            parts.append(
                f"<line class='c{i % _COLOURS}' x1='{_x(i)}' y1='0' x2='{_x(i)}' y2='{ROW_H}'/>"
            )
        else:  # pragma: no cover - a lane only ends in the node that it waits for
            parts.append(
                f"<line class='c{i % _COLOURS}' x1='{_x(i)}' y1='0' x2='{_x(i)}' y2='{mid}'/>"
            )
    for i in cell.joins:
        parts.append(
            f"<line class='c{i % _COLOURS}' x1='{_x(i)}' y1='0' x2='{_x(cell.lane)}' y2='{mid}'/>"
        )
    for i in cell.below:
        if i not in cell.above:
            parts.append(
                f"<line class='c{i % _COLOURS}' x1='{_x(i)}' y1='{mid}' x2='{_x(i)}' y2='{ROW_H}'/>"
            )
    r = 6 if head else 4
    kind_class = "".join(ch if ch.isalnum() else "-" for ch in kind)[:24]
    parts.append(
        f"<circle class='k-{kind_class}{' headnode' if head else ''}' "
        f"cx='{_x(cell.lane)}' cy='{mid}' r='{r}'/>"
    )
    return (
        f"<svg class='lanes' width='{width}' height='{ROW_H}' aria-hidden='true'>"
        + "".join(parts)
        + "</svg>"
    )


def collapse(rows: list[tuple[str, str | None]], hidden: set[str]) -> list[tuple[str, str | None]]:
    """The rows without ``hidden`` ones; a child of a hidden row hangs from its nearest shown
    ancestor (safety checkpoints folded away keep the lines joined)."""
    parent_of: Mapping[str, str | None] = dict(rows)
    out = []
    for ident, parent in rows:
        if ident in hidden:
            continue
        seen = 0
        while parent is not None and parent in hidden and seen < len(rows):
            parent = parent_of.get(parent)
            seen += 1
        out.append((ident, parent))
    return out
