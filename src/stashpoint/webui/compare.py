"""Any two checkpoints compared: the changed-file tree (renames found by content), each file's
diff unified or side by side, the conversation (messages added, removed, edited) and the
state values that differ."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..statediff import MessageView, value_text
from .render import cp_url, e, q, s_url, short, when

if TYPE_CHECKING:
    from ..blobs.objects import Blobs
    from ..model import Checkpoint
    from ..session import Session
    from ..statediff import CheckpointDiff
    from ..workspace.tree import Change

__all__ = ["diff_body"]

MAX_DIFF_CHARS = 400_000
MAX_VALUE_CHARS = 2_000
MAX_SPLIT_ROWS = 3_000
MAX_FILES_SHOWN = 1_000
"""Changed files listed (and diffed, within MAX_DIFF_CHARS); the rest are counted."""


@dataclass(frozen=True)
class Item:
    path: str
    status: str
    change: Change | None
    old_path: str | None = None


def _items(d: CheckpointDiff) -> list[Item]:
    """Changed files (not directories), with a deleted and an added file of the same content
    shown as one rename."""
    files = [c for c in d.files if not _is_dir(c)]
    added = {c.new.ref: c for c in files if c.status == "added" and c.new and c.new.kind == "f"}
    out: list[Item] = []
    used: set[bytes] = set()
    for c in files:
        path = os.fsdecode(c.path)
        if c.status == "deleted" and c.old is not None and c.old.kind == "f":
            twin = added.get(c.old.ref)
            if twin is not None and c.old.ref not in used:
                used.add(c.old.ref)
                out.append(Item(os.fsdecode(twin.path), "renamed", None, path))
                continue
        if c.status == "added" and c.new is not None and c.new.ref in used:
            continue
        out.append(Item(path, c.status, c))
    # an add seen before its delete (sorted paths): drop the add paired later
    renamed = {i.path for i in out if i.status == "renamed"}
    return sorted(
        (i for i in out if not (i.status == "added" and i.path in renamed)), key=lambda i: i.path
    )


def _is_dir(c: Change) -> bool:
    return (c.old is not None and c.old.kind == "d") or (c.new is not None and c.new.kind == "d")


def _checkpoint_line(name: str, tag: str, cp: Checkpoint) -> str:
    return (
        f"<tr><th>{tag}</th><td><a href='{e(cp_url(name, cp.id))}'><code>{short(cp.id)}</code>"
        f"</a> {e(cp.branch)} · step {cp.step} · {e(cp.kind)} · {e(when(cp.created_at))} · "
        f"{e((cp.message or '')[:120])}</td></tr>"
    )


def diff_body(s: Session, d: CheckpointDiff, params: Mapping[str, str]) -> str:
    name = s.name
    split = params.get("view") == "split"
    base = s_url(name) + "/diff"
    items = _items(d)
    conv = d.conversation
    out = [
        "<table class='meta'>",
        _checkpoint_line(name, "A", d.a),
        _checkpoint_line(name, "B", d.b),
    ]
    out.append("</table><p>")
    out.append(
        f"<a href='{e(q(base, a=d.b.id, b=d.a.id, view=params.get('view')))}'>swap A and B</a> · "
    )
    other = "unified" if split else "split"
    out.append(f"<a href='{e(q(base, a=d.a.id, b=d.b.id, view=other))}'>{other} view</a> · ")
    out.append(f"<a href='{e(s_url(name))}'>back to the graph</a></p>")
    out.append(
        f"<p class='summary'>{len(items)} files changed · "
        f"{len(conv.added)} messages added, {len(conv.removed)} removed, {len(conv.edited)} "
        f"edited · {len(d.state_changes)} state values changed</p>"
    )
    if conv.changed:
        out.append(_conversation(d))
    if d.state_changes:
        rows = []
        for c in d.state_changes:
            before = "" if c.kind == "added" else value_text(c.before, MAX_VALUE_CHARS)
            after = "" if c.kind == "removed" else value_text(c.after, MAX_VALUE_CHARS)
            rows.append(
                f"<tr class='v-{c.kind}'><td><code>{e(c.key)}</code></td><td>{e(c.kind)}</td>"
                f"<td class='del'><code>{e(before)}</code></td>"
                f"<td class='add'><code>{e(after)}</code></td></tr>"
            )
        out.append(
            "<h3>State</h3><table class='statediff'><tr><th>key</th><th>change</th><th>A</th>"
            "<th>B</th></tr>" + "".join(rows) + "</table>"
        )
    if items:
        shown = items[:MAX_FILES_SHOWN]
        out.append(_file_tree(shown))
        if len(items) > len(shown):
            out.append(
                f"<p class='warn'>{len(items) - len(shown)} more changed files not listed.</p>"
            )
        out.append(_file_diffs(s.store.blobs, shown, split))
    if not (items or conv.changed or d.state_changes):
        out.append("<p>No differences.</p>")
    return "".join(out)


def _message(m: MessageView, cls: str, sign: str) -> str:
    calls = "".join(f"<div class='call'>→ {e(c[:2000])}</div>" for c in m.tool_calls)
    return (
        f"<div class='msg {cls}'><div class='who'>{sign} <span class='role'>{e(m.role)}</span> "
        f"<span class='muted'>#{m.index}</span></div><div class='text'>{e(m.text[:4000])}</div>"
        f"{calls}</div>"
    )


def _conversation(d: CheckpointDiff) -> str:
    c = d.conversation
    out = [
        "<h3>Conversation</h3><p class='muted'>"
        f"{c.common_prefix} messages in common; A has {c.before_length}, B has "
        f"{c.after_length}.</p><div class='chat'>"
    ]
    out += [_message(m, "removed", "-") for m in c.removed]
    for edit in c.edited:
        out.append("<div class='edited'><div class='muted'>edited</div>")
        out.append(_message(edit.before, "removed", "-") + _message(edit.after, "added", "+"))
        out.append("</div>")
    out += [_message(m, "added", "+") for m in c.added]
    return "".join(out) + "</div>"


def _file_tree(items: list[Item]) -> str:
    """The changed files grouped by directory, each linking to its diff below."""
    out = ["<h3>Files</h3><ul class='changed'>"]
    last_dir: str | None = None
    for n, item in enumerate(items):
        folder, _, leaf = item.path.rpartition("/")
        if folder != last_dir:
            if last_dir is not None:
                out.append("</ul></li>")
            out.append(f"<li class='dir'>{e(folder or '.')}/<ul>")
            last_dir = folder
        was = f" ← {e(item.old_path)}" if item.old_path else ""
        out.append(
            f"<li><span class='st st-{e(item.status)}'>{e(item.status)}</span> "
            f"<a href='#f{n}'>{e(leaf)}</a>{was}</li>"
        )
    out.append("</ul></li></ul>")
    return "".join(out)


def _file_diffs(blobs: Blobs, items: list[Item], split: bool) -> str:
    from ..textdiff import file_diff

    budget = MAX_DIFF_CHARS
    out = []
    for n, item in enumerate(items):
        head = f"<h4 id='f{n}'><span class='st st-{e(item.status)}'>{e(item.status)}</span> "
        head += f"<code>{e(item.path)}</code>"
        if item.old_path:
            out.append(head + f" ← <code>{e(item.old_path)}</code> (same content)</h4>")
            continue
        assert item.change is not None
        if budget <= 0:
            out.append(f"<p class='warn'>{len(items) - n} more diffs not shown (page full).</p>")
            break
        text = file_diff(blobs, item.change, item.path)
        budget -= len(text)
        body = _split(text) if split else f"<pre class='diff'>{_colour(text)}</pre>"
        out.append(head + "</h4>" + body)
    return "".join(out)


def _colour(diff: str) -> str:
    out = []
    for line in diff.splitlines():
        cls = ""
        if line.startswith("+") and not line.startswith("+++"):
            cls = "add"
        elif line.startswith("-") and not line.startswith("---"):
            cls = "del"
        elif line.startswith("@@"):
            cls = "hunk"
        out.append(f"<span class='{cls}'>{e(line)}</span>" if cls else e(line))
    return "\n".join(out)


def _split(diff: str) -> str:
    """A unified diff as two columns: removed lines left, added right, paired in order."""
    rows: list[str] = []
    left: list[str] = []
    right: list[str] = []

    def flush() -> None:
        for i in range(max(len(left), len(right))):
            a = left[i] if i < len(left) else None
            b = right[i] if i < len(right) else None
            rows.append(
                f"<tr><td class='{'del' if a is not None else 'none'}'>{e(a or '')}</td>"
                f"<td class='{'add' if b is not None else 'none'}'>{e(b or '')}</td></tr>"
            )
        left.clear()
        right.clear()

    for line in diff.splitlines():
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("@@"):
            flush()
            rows.append(f"<tr><td colspan='2' class='hunk'>{e(line)}</td></tr>")
        elif line.startswith("-"):
            left.append(line[1:])
        elif line.startswith("+"):
            right.append(line[1:])
        else:
            flush()
            text = line[1:] if line.startswith(" ") else line
            rows.append(f"<tr><td>{e(text)}</td><td>{e(text)}</td></tr>")
        if len(rows) > MAX_SPLIT_ROWS:
            rows.append("<tr><td colspan='2' class='muted'>…</td></tr>")
            return "<table class='split'>" + "".join(rows) + "</table>"
    flush()
    return "<table class='split'>" + "".join(rows) + "</table>"
