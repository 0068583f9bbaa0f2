"""How history is printed: one line per checkpoint, and the branch tree of ``log --graph``
(the demo draws it too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ._app import printable, short

if TYPE_CHECKING:
    from ..model import Checkpoint


def checkpoint_line(cp: Checkpoint, labels: dict[str, str], heads: dict[str, list[str]]) -> str:
    label = labels.get(cp.id)
    parts = [
        click.style(short(cp.id), fg="yellow"),
        f"step {cp.step:<4}",
        f"{cp.kind:<10}",
        cp.created_at[:19].replace("T", " "),
    ]
    if cp.id in heads:
        parts.append(click.style(printable(f"({', '.join(heads[cp.id])})"), fg="green"))
    if label:
        parts.append(click.style(printable(f"[{label}]"), fg="cyan"))
    if cp.status and cp.status != "running":
        colour = {"completed": "green", "failed": "red"}.get(cp.status, "magenta")
        parts.append(click.style(f"<{cp.status}>", fg=colour))
    if cp.message:
        parts.append(printable(cp.message))
    return "  ".join(parts)


def draw_graph(
    cps: list[Checkpoint],
    labels: dict[str, str],
    heads: dict[str, list[str]],
    current: str | None = None,
) -> None:
    """Oldest first; the line leading to ``current`` (else the newest) runs down the left
    edge, and every other branch is drawn indented where it leaves it."""
    by_id = {cp.id: cp for cp in cps}
    children: dict[str | None, list[Checkpoint]] = {}
    for cp in sorted(cps, key=lambda c: c.id):
        parent = cp.parent if cp.parent in by_id else None
        children.setdefault(parent, []).append(cp)
    newest: dict[str, str] = {}
    for cp in sorted(cps, key=lambda c: c.id, reverse=True):  # children before parents
        newest[cp.id] = max([cp.id, *(newest[k.id] for k in children.get(cp.id, []))])
    on_path: set[str] = set()
    node = by_id.get(current) if current else None
    while node is not None:
        on_path.add(node.id)
        node = by_id.get(node.parent) if node.parent else None

    def main_child(kids: list[Checkpoint]) -> Checkpoint:
        for k in kids:
            if k.id in on_path:
                return k
        return max(kids, key=lambda k: newest[k.id])

    def walk(cp: Checkpoint, lead: str, rest: str) -> None:
        while True:
            click.echo(lead + "● " + checkpoint_line(cp, labels, heads))
            kids = children.get(cp.id, [])
            if not kids:
                return
            main = main_child(kids)
            for k in kids:
                if k is not main:
                    walk(k, rest + "├─", rest + "│ ")
            cp, lead = main, rest

    roots = children.get(None, [])
    for root in roots:
        walk(root, "", "")
