"""One checkpoint: what it is, what can be done from it, and everything it holds: the
conversation as a chat, the state as a tree, the files as a browsable tree with a viewer, the
run's tasks, journal and side-effect ledger."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..langgraph_format import RECORD_META
from ..statediff import readable_state, render_message, short_text
from .data import (
    effects_in,
    journal_entries,
    list_dir,
    read_file,
    search_files,
)
from .render import Frame, cp_url, dumps, e, q, s_url, short

if TYPE_CHECKING:
    from ..model import Checkpoint
    from ..session import Session

__all__ = ["checkpoint_body", "file_body"]

MAX_MESSAGES = 500
"""Messages shown (the latest); an older part of a long conversation is summarised."""
FOLD_CHARS = 600
"""A message or tool result longer than this is shown folded."""
MAX_NODES = 4000
"""State tree nodes shown."""
MAX_DIR = 500
MAX_FOUND = 200
MAX_JOURNAL = 500


def checkpoint_body(s: Session, cp: Checkpoint, params: Mapping[str, str], frame: Frame) -> str:
    from ..retention import PrunedError

    name = s.name
    label = s.labels().get(cp.id)
    head = s.branches().get(cp.branch)
    rows = [
        ("id", f"<code>{e(cp.id)}</code>"),
        ("branch", e(cp.branch) + (" <span class='headmark'>head</span>" if head == cp.id else "")),
        (
            "parent",
            f"<a href='{e(cp_url(name, cp.parent))}'><code>{short(cp.parent)}</code></a>"
            if cp.parent
            else "-",
        ),
        ("step · kind · status", f"{cp.step} · {e(cp.kind)} · {e(cp.status or '-')}"),
        ("label", e(label or "-")),
        ("message", e(cp.message or "-")),
        ("created (UTC)", e(cp.created_at)),
        ("digest", f"<code>{e(cp.digest)}</code>"),
    ]
    if cp.workspace is not None:
        ws = cp.workspace
        rows.append(
            ("files", f"{ws.files:,} files, {ws.bytes:,} bytes in <code>{e(ws.root)}</code>")
        )
    body = "<table class='meta'>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    body += "</table>"
    if head == cp.id:  # what the run paused here waits for
        from .sessions import pending_html

        body += pending_html(s, frame, only=cp.branch)
    body += _actions(s, cp, label, frame)
    try:
        messages, state = readable_state(s, cp)
    except PrunedError:
        return body + (
            "<p class='warn'>Pruned by retention: the record stays, its contents were released.</p>"
        )
    if messages is not None:
        body += _section("Conversation", f"{len(messages)} messages", _chat(messages))
    body += _section("State", f"{len(state)} keys", _state_tree(state))
    notes = {k: v for k, v in cp.meta.items() if k != RECORD_META}
    if notes:  # who decided or edited what, compensations run, a run's command...
        body += _section("Record", f"{len(notes)} notes", _state_tree(notes), closed=True)
    if cp.workspace is not None:
        body += _section("Files", f"{cp.workspace.files:,}", _files(s, cp, params))
    if cp.journal is not None:
        entries = journal_entries(s, cp)
        tasks = s.tasks(cp)
        if tasks:
            body += _section("Tasks", str(len(tasks)), _tasks(tasks))
        ledger = effects_in(entries)
        body += _section("Side-effect ledger", str(len(ledger)), _ledger(ledger))
        body += _section("Journal", f"{len(entries)} entries", _journal(entries), closed=True)
    return body


def _section(title: str, count: str, inner: str, *, closed: bool = False) -> str:
    slug = title.lower().replace(" ", "-")
    return (
        f"<details class='section' id='{slug}'{'' if closed else ' open'}><summary><h3>"
        f"{e(title)} <span class='muted'>({e(count)})</span></h3></summary>{inner}</details>"
    )


def _actions(s: Session, cp: Checkpoint, label: str | None, frame: Frame) -> str:
    name = s.name
    url = s_url(name)
    links = []
    if cp.parent:
        links.append(
            f"<a href='{e(q(url + '/diff', a=cp.parent, b=cp.id))}'>compare with parent</a>"
        )
    links.append(f"<a href='{e(q(url + '/diff', a=cp.id, b='HEAD'))}'>compare with HEAD</a>")
    links.append(f"<a href='{e(url)}#r-{e(cp.id)}'>back to the graph</a>")
    out = "<h3>Actions</h3><p>" + " · ".join(links) + "</p><p>"
    modes = [("state", "rewind state")]
    if s.workspace is not None and cp.workspace is not None:
        modes = [("both", "rewind files + state"), ("files", "rewind files"), *modes]
    for mode, text in modes:
        go = q(url + "/confirm", op="rewind", ref=cp.id, mode=mode)
        out += f"<a class='button' href='{e(go)}'>{e(text)}…</a> "
    out += "</p>"
    out += (
        f"<form class='inline' method='get' action='{e(url)}/confirm'>"
        f"<input type='hidden' name='op' value='fork'><input type='hidden' name='ref' "
        f"value='{e(cp.id)}'><input name='branch' placeholder='new branch name' size='18' "
        "aria-label='branch'> <input name='into' placeholder='into directory (optional)' "
        "size='26' aria-label='into'> <button type='submit'>fork…</button></form>"
    )
    out += "<p>" + frame.form(
        url + "/label",
        {"ref": cp.id},
        "set label",
        f"<input name='label' value='{e(label or '')}' placeholder='label (empty: remove)' "
        "size='18' aria-label='label'> ",
    )
    out += "</p><details><summary>edit state…</summary><p class='muted'>Saves a corrected "
    out += "copy of this state as a new checkpoint (kind <code>edit</code>); this one stays. "
    out += "An older checkpoint's edit starts a new branch.</p>" + frame.form(
        url + "/edit",
        {"ref": cp.id},
        "save edit",
        "<input name='path' placeholder='path, e.g. plan.budget' size='20' aria-label='path'> "
        "<input name='value' placeholder='JSON value, e.g. 10' size='20' aria-label='value'> "
        "<input name='reason' placeholder='reason' size='16' aria-label='reason'> "
        "<input name='branch' placeholder='new branch (older checkpoints)' size='20' "
        "aria-label='edit branch'> ",
    )
    return out + "</details>"


# -- conversation ------------------------------------------------------------------------------
def _fold(text: str, cls: str = "text") -> str:
    if len(text) <= FOLD_CHARS:
        return f"<div class='{cls}'>{e(text)}</div>"
    return (
        f"<details class='{cls}'><summary>{e(short_text(text, 300))}</summary>"
        f"<div>{e(text)}</div></details>"
    )


def _chat(messages: list[Any]) -> str:
    out = ["<div class='chat'>"]
    skip = max(0, len(messages) - MAX_MESSAGES)
    if skip:
        out.append(f"<p class='muted'>{skip} earlier messages not shown.</p>")
    for i, m in enumerate(messages[skip:], start=skip):
        role, text, ident, calls = render_message(m)
        kind = role.split(" ")[0] if role else "other"
        css = kind if kind in ("user", "assistant", "system", "tool", "reasoning") else "other"
        who = f"<span class='role'>{e(role)}</span> <span class='muted'>#{i}</span>"
        if ident:
            who += f" <span class='muted'>{e(ident[:40])}</span>"
        parts = [f"<div class='msg {css}'><div class='who'>{who}</div>"]
        if text:
            parts.append(_fold(text))
        for call in calls:
            parts.append(f"<div class='call'>→ {_fold(call, 'callargs')}</div>")
        parts.append("</div>")
        out.append("".join(parts))
    out.append("</div>")
    return "".join(out)


# -- state -------------------------------------------------------------------------------------
def _state_tree(state: Mapping[str, Any]) -> str:
    budget = [MAX_NODES]

    def node(key: str, value: Any, depth: int) -> str:
        budget[0] -= 1
        if budget[0] < 0:
            return "<li class='muted'>…</li>" if budget[0] == -1 else ""
        k = f"<span class='key'>{e(key)}</span>"
        if isinstance(value, Mapping) and value:
            items = "".join(node(str(k2), v2, depth + 1) for k2, v2 in value.items())
            return (
                f"<li><details{' open' if depth < 1 else ''}><summary>{k} "
                f"<span class='muted'>{{{len(value)}}}</span></summary>"
                f"<ul>{items}</ul></details></li>"
            )
        if isinstance(value, list | tuple) and value:
            items = "".join(node(str(i), v2, depth + 1) for i, v2 in enumerate(value))
            return (
                f"<li><details{' open' if depth < 1 else ''}><summary>{k} "
                f"<span class='muted'>[{len(value)}]</span></summary>"
                f"<ul>{items}</ul></details></li>"
            )
        text = dumps(value) if not isinstance(value, str) else repr(value)
        return f"<li>{k}: <span class='val'>{e(short_text(text, 2000))}</span></li>"

    if not state:
        return "<p class='muted'>empty</p>"
    return "<ul class='state'>" + "".join(node(str(k), v, 0) for k, v in state.items()) + "</ul>"


# -- files -------------------------------------------------------------------------------------
def _files(s: Session, cp: Checkpoint, params: Mapping[str, str]) -> str:
    base = cp_url(s.name, cp.id)
    where = params.get("dir", "").strip("/")
    find = params.get("find", "").strip()
    out = (
        f"<form method='get' action='{e(base)}#files' class='inline'>"
        f"<input name='find' value='{e(find)}' placeholder='find a file by name' size='28' "
        "aria-label='find a file'> <button type='submit'>find</button></form>"
    )
    if find:
        found, cut = search_files(s, cp, find, MAX_FOUND)
        items = "".join(
            f"<li><a href='{e(q(base + '/file', path=p))}'>{e(p)}</a></li>" for p in found
        )
        more = f"<li class='muted'>first {MAX_FOUND} shown</li>" if cut else ""
        return out + f"<ul class='files'>{items or '<li>no match</li>'}{more}</ul>"
    crumbs = [f"<a href='{e(q(base, dir=''))}#files'>/</a>"]
    acc = ""
    for part in [p for p in where.split("/") if p]:
        acc = f"{acc}/{part}" if acc else part
        crumbs.append(f"<a href='{e(q(base, dir=acc))}#files'>{e(part)}</a>")
    out += "<p class='path'>" + " / ".join(crumbs) + "</p>"
    entries = list_dir(s, cp, where)
    listed: list[str] = []
    for n, entry in entries[:MAX_DIR]:
        path = f"{where}/{n}" if where else n
        if entry.kind == "d":
            listed.append(
                f"<li class='dir'><a href='{e(q(base, dir=path))}#files'>{e(n)}/</a></li>"
            )
        else:
            link = f"<a href='{e(q(base + '/file', path=path))}'>{e(n)}</a>"
            extra = (
                " → link" if entry.kind == "l" else f" <span class='muted'>{entry.size:,} B</span>"
            )
            listed.append(f"<li class='file'>{link}{extra}</li>")
    if len(entries) > MAX_DIR:
        listed.append(f"<li class='muted'>… {len(entries) - MAX_DIR} more: use find</li>")
    return out + "<ul class='files'>" + "".join(listed) + "</ul>"


def file_body(s: Session, cp: Checkpoint, params: Mapping[str, str]) -> tuple[str, str]:
    """(title, body) of the file viewer."""
    path = params.get("path", "")
    try:
        page = int(params.get("page", "1"))
    except ValueError:
        page = 1
    view = read_file(s, cp, path, page)
    base = cp_url(s.name, cp.id)
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    out = (
        f"<p><a href='{e(q(base, dir=parent))}#files'>← back to the files of "
        f"{short(cp.id)}</a> · {view.size:,} bytes · mode {e(stat.filemode(view.mode | 0o100000))}"
        "</p>"
    )
    if view.text is None:
        return path, out + f"<p class='warn'>{e(view.why)}</p>"
    out += f"<div class='hl'>{_highlight(path, view.text, view.first_line)}</div>"
    if view.pages > 1:
        nav = [f"page {view.page} of {view.pages}"]
        if view.page > 1:
            nav.append(
                f"<a href='{e(q(base + '/file', path=path, page=view.page - 1))}'>previous</a>"
            )
        if view.page < view.pages:
            nav.append(f"<a href='{e(q(base + '/file', path=path, page=view.page + 1))}'>next</a>")
        out += "<p class='pager'>" + " · ".join(nav) + "</p>"
    return path, out


def _highlight(path: str, text: str, first: int) -> str:
    """Pygments HTML with CSS classes (never inline styles: the CSP allows none)."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_for_filename
    from pygments.lexers.special import TextLexer
    from pygments.util import ClassNotFound

    try:
        lexer = get_lexer_for_filename(os.path.basename(path), stripnl=False)
    except ClassNotFound:
        lexer = TextLexer(stripnl=False)
    formatter = HtmlFormatter(linenos="inline", linenostart=first, nowrap=False, cssclass="src")
    return str(highlight(text, lexer, formatter))


# -- durable runs ------------------------------------------------------------------------------
def _tasks(tasks: list[Any]) -> str:
    rows = "".join(
        f"<tr><td>{e(t.id)}</td><td>{e(t.title)}</td><td class='t-{e(t.status)}'>{e(t.status)}"
        f"</td><td>{e(t.note or '')}</td></tr>"
        for t in tasks
    )
    return f"<table><tr><th>task</th><th>title</th><th>status</th><th>note</th></tr>{rows}</table>"


def _ledger(ledger: list[Any]) -> str:
    if not ledger:
        return "<p class='muted'>No irreversible effects recorded.</p>"
    rows = "".join(
        f"<tr><td>{x.position}</td><td>{e(x.tool)}</td>"
        f"<td><code>{e(short_text(dumps(x.args), 300))}"
        f"</code></td><td>{e(x.status)}</td><td><code>{e(short_text(dumps(x.result), 300))}</code>"
        f"</td><td><code>{e(x.key[:16])}</code></td></tr>"
        for x in ledger
    )
    return (
        "<p class='muted'>Effects outside (messages sent, deployments) are not undone by a "
        "rewind; <code>stashpoint rewind --compensate</code> runs the compensations the "
        "program registered.</p><table><tr><th>#</th><th>tool</th><th>arguments</th>"
        f"<th>status</th><th>result</th><th>key</th></tr>{rows}</table>"
    )


def _journal(entries: list[dict[str, Any]]) -> str:
    rows = []
    skip = max(0, len(entries) - MAX_JOURNAL)
    for i, entry in enumerate(entries[skip:], start=skip):
        rest = {k: v for k, v in entry.items() if k not in ("k", "s", "n")}
        rows.append(
            f"<tr><td>{i}</td><td>{e(entry.get('k', ''))}</td><td>{e(entry.get('s', ''))}</td>"
            f"<td>{e(entry.get('n', ''))}</td><td><code>{e(short_text(dumps(rest), 300))}</code>"
            "</td></tr>"
        )
    note = f"<p class='muted'>{skip} earlier entries not shown.</p>" if skip else ""
    return (
        note
        + "<table><tr><th>#</th><th>entry</th><th>slot</th><th>name</th><th>data</th></tr>"
        + "".join(rows)
        + "</table>"
    )
