"""The sessions page and one session's page: the graph of its checkpoints, filtered and
paged, with A/B pickers for a comparison and the decisions its runs wait for.

A page reads only the rows it shows: the first page of a 10,000-checkpoint session asks
``history(limit=...)`` for one page, and only a filter reads the whole history.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from . import graph
from .data import branch_pending
from .render import Frame, command, cp_url, dumps, e, q, s_url, short, when

if TYPE_CHECKING:
    from .._store import Store
    from ..model import Checkpoint
    from ..session import Session

__all__ = ["PER_PAGE", "Filter", "live_rows", "pending_html", "session_body", "sessions_body"]

PER_PAGE = 100
"""Checkpoints per page of a session's graph."""
SESSIONS_PER_PAGE = 50
SAFETY_KINDS = frozenset({"pre-rewind"})
"""Kinds a user can fold away: the checkpoints a rewind or fork takes before it acts."""
KINDS = ("manual", "auto", "milestone", "paused", "approval", "edit", "rewind", "pre-rewind")
COUNT_UPTO = 100
"""The sessions page counts checkpoints up to this many (a count reads and verifies every
row: a page of 50 sessions of 10,000 checkpoints each would take seconds)."""


def page_number(params: Mapping[str, str]) -> int:
    try:
        return max(1, int(params.get("page", "1")))
    except ValueError:
        raise UsageError("page must be a number") from None


def sessions_body(store: Store, params: Mapping[str, str]) -> tuple[str, int]:
    names = sorted(store.sessions())
    at = page_number(params) - 1
    shown = names[at * SESSIONS_PER_PAGE : (at + 1) * SESSIONS_PER_PAGE]
    if names and not shown:
        return f"<p>No page {at + 1}: {len(names)} sessions.</p>", 404
    if not shown:
        return "<p>No checkpoints in this store yet.</p>", 200
    rows = []
    for name in shown:
        s = store.session(name)
        head = s.head
        counted = len(s.history(limit=COUNT_UPTO + 1))
        count = f"{COUNT_UPTO:,}+" if counted > COUNT_UPTO else str(counted)
        waiting = branch_pending(s)
        rows.append(
            f"<tr><td><a href='{e(s_url(name))}'>{e(name)}</a></td>"
            f"<td>{len(s.branches())}</td><td>{count}</td>"
            f"<td>{e(when(head.created_at)) if head else '-'}</td>"
            f"<td>{'<b>waits for a decision</b>' if waiting else ''}</td></tr>"
        )
    table = (
        "<table><tr><th>session</th><th>branches</th><th>checkpoints</th>"
        "<th>last checkpoint (UTC)</th><th></th></tr>" + "".join(rows) + "</table>"
    )
    if len(names) > SESSIONS_PER_PAGE:
        last = (len(names) - 1) // SESSIONS_PER_PAGE
        start = at * SESSIONS_PER_PAGE
        links = [f"sessions {start + 1}-{start + len(shown)} of {len(names)}"]
        if at > 0:
            links.append(f"<a href='/?page={at}'>previous</a>")
        if at < last:
            links.append(f"<a href='/?page={at + 2}'>next</a>")
        table += "<p>" + " · ".join(links) + "</p>"
    return table, 200


def pending_html(s: Session, frame: Frame, only: str | None = None) -> str:
    """Each decision a run of this session waits for (on branch ``only``, or any), with
    approve / reject forms."""
    out = []
    url = s_url(s.name)
    for branch, p in branch_pending(s):
        if only is not None and branch != only:
            continue
        target = p.checkpoint or p.id
        reason = "<input name='reason' placeholder='reason (recorded)' size='24'> "
        what = "waits for approval" if p.kind == "approval" else "outcome unknown (process died)"
        fields = {"id": target, "branch": branch}
        out.append(
            f"<div class='pending'><b>{e(p.tool)}</b> on branch <b>{e(branch)}</b> {what}: "
            f"<code>{e(dumps(p.args)[:400])}</code><br>"
            f"<form class='inline' method='post' action='{e(url)}/approve'>"
            f"{frame.hidden(fields)}{reason}<button type='submit'>approve</button>"
            f"<button type='submit' formaction='{e(url)}/reject'>reject</button></form>"
            "<span class='muted'> An approved call runs when the program resumes "
            f"(<code>{e(command('stashpoint', '--session', s.name, 'resume'))}</code>); its "
            "effect outside cannot be taken back by a rewind.</span></div>"
        )
    return "".join(out)


@dataclass(frozen=True)
class Filter:
    text: str = ""
    kind: str = ""
    label: str = ""
    hide_safety: bool = False

    @classmethod
    def of(cls, params: Mapping[str, str]) -> Filter:
        return cls(
            params.get("q", "").strip(),
            params.get("kind", "").strip(),
            params.get("label", "").strip(),
            params.get("safety") == "hide",
        )

    @property
    def active(self) -> bool:
        return bool(self.text or self.kind or self.label)

    def matches(self, cp: Checkpoint, label: str | None) -> bool:
        if self.kind and cp.kind != self.kind:
            return False
        if self.label and (label is None or (self.label != "*" and self.label not in label)):
            return False
        if self.text:
            hay = f"{cp.id} {cp.message or ''} {label or ''} {cp.branch}".lower()
            return self.text.lower() in hay
        return True

    def params(self) -> dict[str, str]:
        return {
            "q": self.text,
            "kind": self.kind,
            "label": self.label,
            "safety": "hide" if self.hide_safety else "",
        }


def _filter_form(name: str, f: Filter) -> str:
    kinds = "".join(f"<option value='{k}'>" for k in KINDS)
    hide = " checked" if f.hide_safety else ""
    return (
        f"<form class='filter' method='get' action='{e(s_url(name))}'>"
        f"<input name='q' value='{e(f.text)}' placeholder='text, id, message' size='24' "
        "aria-label='text'> "
        f"<input name='kind' value='{e(f.kind)}' placeholder='kind' list='kinds' size='10' "
        f"aria-label='kind'><datalist id='kinds'>{kinds}</datalist> "
        f"<input name='label' value='{e(f.label)}' placeholder='label (* any)' size='12' "
        "aria-label='label'> "
        f"<label><input type='checkbox' name='safety' value='hide'{hide}> fold safety "
        "checkpoints</label> <button type='submit'>filter</button>"
        + (f" <a href='{e(s_url(name))}'>clear</a>" if f.active or f.hide_safety else "")
        + "</form>"
    )


def session_body(s: Session, params: Mapping[str, str], frame: Frame) -> tuple[str, int]:
    name = s.name
    f = Filter.of(params)
    page = page_number(params)
    # unfiltered: only as far as this page reaches, and one more to know if there is a next
    whole = f.active or f.hide_safety
    cps = s.history() if whole else s.history(limit=page * PER_PAGE + 1)
    if not cps:
        return "<p>No checkpoints.</p>", 404
    labels = s.labels()
    heads: dict[str, list[str]] = {}
    for branch, ident in s.branches().items():
        heads.setdefault(ident, []).append(branch)
    current = s.head.id if s.head else None
    hidden = {cp.id for cp in cps if cp.kind in SAFETY_KINDS} if f.hide_safety else set()
    rows = graph.collapse([(cp.id, cp.parent) for cp in cps], hidden)
    cells = dict(
        zip(
            (r[0] for r in rows),
            graph.layout(rows, current if current not in hidden else None),
            strict=True,
        )
    )
    visible = [cp for cp in cps if cp.id not in hidden and f.matches(cp, labels.get(cp.id))]
    start = (page - 1) * PER_PAGE
    shown = visible[start : start + PER_PAGE]
    more = len(visible) > start + PER_PAGE
    if not shown and page > 1:
        return f"<p>No page {page}.</p>", 404
    width = max(
        (max((c.lane, *c.above, *c.joins, *c.below)) + 1 for c in (cells[cp.id] for cp in shown)),
        default=1,
    )
    body = pending_html(s, frame)
    body += _filter_form(name, f)
    head_note = f"HEAD of branch <b>{e(s.branch)}</b> is <code>{short(current)}</code>. "
    body += (
        f"<p class='muted'>{head_note}Newest first; each lane is a line of history, a fork "
        "opens a lane. Pick A and B to compare any two checkpoints.</p>"
    )
    live = "" if (f.active or page > 1) else " data-live='1'"
    newest = e(cps[0].id)
    table = [
        f"<form method='get' action='{e(s_url(name))}/diff' id='graph-form'>"
        "<p><button type='submit' id='compare'>compare A → B</button> "
        "<span class='muted' id='live-status'></span></p>"
        f"<table class='graph' id='graph' data-session='{e(name)}' data-newest='{newest}'"
        f"{live}><thead><tr><th>A</th><th>B</th><th></th><th>checkpoint</th><th>kind</th>"
        "<th>step</th><th>time (UTC)</th><th>message</th></tr></thead><tbody>"
    ]
    for cp in shown:
        table.append(_row(name, cp, cells[cp.id], labels.get(cp.id), heads, current, width))
    table.append("</tbody></table></form>")
    body += "".join(table)
    nav = []
    if page > 1:
        nav.append(f"<a href='{e(q(s_url(name), **f.params(), page=page - 1))}'>newer</a>")
    if more:
        nav.append(f"<a href='{e(q(s_url(name), **f.params(), page=page + 1))}'>older</a>")
    what = f"{len(visible)} match" if f.active else f"checkpoints {start + 1}-{start + len(shown)}"
    body += "<p class='pager'>" + " · ".join([what, *nav]) + "</p>"
    return body, 200


def _row(
    name: str,
    cp: Checkpoint,
    cell: graph.Cell,
    label: str | None,
    heads: Mapping[str, list[str]],
    current: str | None,
    width: int,
) -> str:
    badges = "".join(f"<span class='branch'>{e(b)}</span>" for b in heads.get(cp.id, ()))
    if cp.id == current:
        badges = "<span class='headmark'>HEAD</span>" + badges
    if label:
        badges += f"<span class='label'>{e(label)}</span>"
    status = (
        f" <span class='status'>{e(cp.status)}</span>" if cp.status not in (None, "running") else ""
    )
    ident = e(cp.id)
    return (
        f"<tr id='r-{ident}'><td><input type='radio' name='a' value='{ident}' "
        f"aria-label='A'></td><td><input type='radio' name='b' value='{ident}' aria-label='B'>"
        f"</td><td class='g'>{graph.svg(cell, cp.kind, head=cp.id == current, width_lanes=width)}"
        f"</td><td><a class='id' href='{e(cp_url(name, cp.id))}'>{short(cp.id)}</a>{badges}</td>"
        f"<td class='kind'>{e(cp.kind)}{status}</td><td>{cp.step}</td>"
        f"<td class='muted'>{e(when(cp.created_at))}</td>"
        f"<td class='msg'>{e((cp.message or '')[:140])}</td></tr>"
    )


def live_rows(s: Session, after: str) -> dict[str, Any]:
    """Checkpoints newer than ``after`` (newest first, at most a page), for the live view."""
    cps = s.history(limit=PER_PAGE)
    labels = s.labels()
    new = []
    for cp in cps:
        if cp.id == after:
            break
        new.append(
            {
                "id": cp.id,
                "short": short(cp.id),
                "url": cp_url(s.name, cp.id),
                "kind": cp.kind,
                "step": cp.step,
                "time": when(cp.created_at),
                "message": (cp.message or "")[:140],
                "label": labels.get(cp.id),
                "branch": cp.branch,
            }
        )
    else:
        if cps and after:  # ``after`` is not among the newest: more came than a page
            new.append({"more": True})
    head = s.head
    return {"new": new, "head": head.id if head else None}
