"""The lane layout of a session's graph: the checked-out line keeps the first lane, a fork
opens another and joins its base, folded safety checkpoints keep the lines joined."""

from __future__ import annotations

from stashpoint.webui.graph import collapse, layout


def test_the_head_line_keeps_lane_zero_and_a_fork_joins_its_base() -> None:
    # newest first: f2 -> f1 -> b (a fork of b), head h -> b -> a
    rows = [("f2", "f1"), ("f1", "b"), ("h", "b"), ("b", "a"), ("a", None)]
    cells = layout(rows, head="h")
    lanes = [c.lane for c in cells]
    assert lanes == [1, 1, 0, 0, 0]
    assert 0 not in cells[0].above and 0 not in cells[0].below  # nothing above the head
    assert cells[2].joins == () and cells[2].below == (0, 1)  # the head; the fork passes by
    assert cells[3].joins == (0, 1)  # b: both lines end in it
    assert cells[4].below == ()


def test_without_a_head_the_first_tip_takes_lane_zero() -> None:
    cells = layout([("x", "y"), ("y", None), ("z", None)])
    assert [c.lane for c in cells] == [0, 0, 0]
    assert cells[1].below == () and cells[2].above == ()


def test_folded_rows_hand_their_children_to_the_nearest_shown_ancestor() -> None:
    rows = [("c", "s2"), ("s2", "s1"), ("s1", "a"), ("a", None)]
    assert collapse(rows, {"s1", "s2"}) == [("c", "a"), ("a", None)]
    cells = layout(collapse(rows, {"s1", "s2"}), head="c")
    assert [c.lane for c in cells] == [0, 0] and cells[1].joins == (0,)
