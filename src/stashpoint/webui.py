"""The local web UI: a time-travel debugger over one store, served on loopback.

Pages: the sessions, one session's checkpoint tree, a checkpoint (metadata, state, tasks, the
files of its snapshot), the diff between two checkpoints (state, conversation, files), and the
actions that change history: rewind, fork, approve and reject. Every page is rendered on the
server from the same library calls the CLI makes; the pages carry no script.

Why so strict for a local page: a web page on any site can make the browser send requests to
127.0.0.1, and a DNS name can be rebound to 127.0.0.1. So:

- the server binds a loopback address only;
- every request needs the token printed at start (``?token=`` once, then an HttpOnly,
  SameSite=Strict cookie; or ``Authorization: Bearer``);
- the Host header must name the loopback address and port the server listens on (rebinding);
- a POST needs a CSRF field derived from the token, and an Origin, when sent, of this server;
- a GET never changes anything; responses forbid framing and scripts, and send referrers
  to this server only.

``starlette`` routes the requests and ``uvicorn`` serves them: ``pip install 'stashpoint[ui]'``.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import os
import secrets
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from .copy import printable_url
from .errors import MissingExtraError, StashpointError, UsageError

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    from ._store import Store
    from .model import Checkpoint
    from .session import Session
    from .statediff import CheckpointDiff

__all__ = ["LOOPBACK", "create_app", "new_token"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")
COOKIE = "stashpoint_ui"
MAX_STATE_CHARS = 200_000
MAX_FILES_LISTED = 2_000
MAX_DIFF_CHARS = 400_000
MAX_VALUE_CHARS = 2_000
_CLASSES = {"add": "add", "del": "del", "head": "hunk"}

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232a;background:#fafbfc}
header{background:#1d232a;color:#fff;padding:.6em 1.2em}header a{color:#fff}
main{padding:1em 1.4em;max-width:1200px}
table{border-collapse:collapse;width:100%}td,th{padding:.3em .6em;border-bottom:1px solid #e3e6ea;
text-align:left;vertical-align:top}th{background:#f0f2f5}
code,pre{font:12.5px/1.4 ui-monospace,monospace}pre{background:#fff;border:1px solid #e3e6ea;
padding:.6em;overflow:auto;max-height:32em}
.id{color:#8a5a00}.head{background:#dff3e4;border-radius:3px;padding:0 .3em}
.label{background:#e2efff;border-radius:3px;padding:0 .3em}.warn{background:#fff4d6;padding:.6em}
.add{color:#116329}.del{color:#a40e26}.hunk{color:#6639ba}
ul.tree{list-style:none;padding-left:1.1em;border-left:2px solid #d0d7de;margin:.2em 0}
form.inline{display:inline}button{margin:.1em .3em}.muted{color:#6e7781}
.error{background:#ffe3e6;padding:.6em}
"""


_PER_PAGE = 50
"""Sessions listed per page of the sessions page."""


def new_token() -> str:
    """A fresh random token (printed once; the URL carries it to the browser)."""
    return secrets.token_urlsafe(24)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _json(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False, default=str)


def _short(ident: str | None) -> str:
    return ident[:12] if ident else "-"


class _Forbidden(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def _same(given: str, secret: str) -> bool:
    """A constant-time comparison that also takes what no ASCII secret equals (a non-ASCII
    token or field made ``hmac.compare_digest`` raise: a 500 before any authentication)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), secret.encode())


def create_app(
    store: Store,
    *,
    token: str,
    port: int,
    root: Path | None = None,
    force: bool = False,
    host: str = "127.0.0.1",
) -> Starlette:
    """The ASGI app over ``store``; ``root`` is the workspace that rewind and fork use
    (None: state only). ``port`` is the one the server listens on (the Host check)."""
    try:
        from starlette.applications import Starlette
        from starlette.responses import HTMLResponse, RedirectResponse
        from starlette.routing import Route
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(
            "the web UI needs starlette and uvicorn: pip install 'stashpoint[ui]'"
        ) from exc
    if len(token) < 16:
        raise UsageError("the web UI token must be at least 16 characters")
    hosts = {f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]")}
    hosts.add(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    origins = {f"http://{h}" for h in hosts}
    csrf = hmac.new(token.encode(), b"stashpoint-ui-csrf", hashlib.sha256).hexdigest()
    lock = threading.Lock()  # one request at a time touches the store

    def session(name: str) -> Session:
        return store.session(name, workspace=root, force=force)

    def check(request: Request) -> bool:
        """Whether the request carries the token in its URL (to move it into a cookie); a
        request that may not go on raises _Forbidden."""
        if request.headers.get("host", "") not in hosts:
            raise _Forbidden(421, "unexpected Host header (this server answers only on loopback)")
        given = request.cookies.get(COOKIE) or ""
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        fresh = request.query_params.get("token")
        if fresh is not None and _same(fresh, token):
            return True
        if not given or not _same(given, token):
            raise _Forbidden(401, "token required: open the URL `stashpoint ui` printed")
        return False

    async def check_post(request: Request) -> dict[str, str]:
        origin = request.headers.get("origin")
        if origin is not None and origin not in origins:
            raise _Forbidden(403, "cross-origin request refused")
        form = await request.form()
        fields = {k: str(v) for k, v in form.items() if isinstance(v, str)}
        if not _same(fields.get("csrf", ""), csrf):
            raise _Forbidden(403, "missing or wrong CSRF field")
        return fields

    shown_url = printable_url(store.url)

    def page(title: str, body: str, status: int = 200, *, anonymous: bool = False) -> Response:
        where = "" if anonymous else f" · <span class='muted'>{_e(shown_url)}</span>"
        doc = (
            "<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{_e(title)} · stashpoint</title><style>{_CSS}</style></head><body>"
            f"<header><a href='/'><b>stashpoint</b></a> · time-travel debugger{where}</header>"
            f"<main><h2>{_e(title)}</h2>{body}</main></body></html>"
        )
        return HTMLResponse(doc, status_code=status, headers=_SECURITY_HEADERS)

    def form(action: str, fields: dict[str, str], button: str, extra: str = "") -> str:
        hidden = "".join(
            f"<input type='hidden' name='{_e(k)}' value='{_e(v)}'>"
            for k, v in {**fields, "csrf": csrf}.items()
        )
        return (
            f"<form class='inline' method='post' action='{_e(action)}'>{hidden}{extra}"
            f"<button type='submit'>{_e(button)}</button></form>"
        )

    def guarded(fn: Callable[..., Response], *, post: bool = False) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                cookie = check(request)
                fields = await check_post(request) if post else {}
            except _Forbidden as exc:  # says nothing of the store to whoever asked
                return page(
                    "refused", f"<p class='error'>{_e(exc)}</p>", exc.status, anonymous=True
                )
            if cookie:  # the token leaves the address bar (history, logs, screenshots)
                keep = {k: v for k, v in request.query_params.items() if k != "token"}
                target = request.url.path + (f"?{urlencode(keep)}" if keep else "")
                resp: Response = RedirectResponse(target, status_code=303)
                resp.set_cookie(COOKIE, token, httponly=True, samesite="strict")
                return resp
            from starlette.concurrency import run_in_threadpool

            def call() -> Response:
                with lock:
                    try:
                        return fn(request, fields) if post else fn(request)
                    except StashpointError as exc:
                        return page("error", f"<p class='error'>{_e(exc)}</p>", 400)
                    except OSError as exc:  # a fork into a directory that cannot be made
                        where = f" at {exc.filename}" if exc.filename else ""
                        text = f"{exc.strerror or exc}{where}"
                        return page("error", f"<p class='error'>{_e(text)}</p>", 400)

            return await run_in_threadpool(call)

        return endpoint

    # -- pages ---------------------------------------------------------------------------
    def sessions_page(request: Request) -> Response:
        names = sorted(store.sessions())
        try:
            at = max(0, int(request.query_params.get("page", "1")) - 1)
        except ValueError:
            raise UsageError("page must be a number") from None
        # Each row reads the session's heads, head record, journal and checkpoint list: a
        # page of them, not every session of a store that holds thousands.
        shown = names[at * _PER_PAGE : (at + 1) * _PER_PAGE]
        if names and not shown:
            return page("sessions", f"<p>No page {at + 1}: {len(names)} sessions.</p>", 404)
        rows = []
        for name in shown:
            s = session(name)
            heads = s.branches()
            head = s.head
            pending = _pending(s)
            rows.append(
                f"<tr><td><a href='{_e(_s_url(name))}'>{_e(name)}</a></td>"
                f"<td>{len(heads)}</td><td>{len(store.meta.list_checkpoints(name))}</td>"
                f"<td>{_e(head.created_at[:19].replace('T', ' ')) if head else '-'}</td>"
                f"<td>{'<b>waits for a decision</b>' if pending else ''}</td></tr>"
            )
        if not rows:
            return page("sessions", "<p>No checkpoints in this store yet.</p>")
        table = (
            "<table><tr><th>session</th><th>branches</th><th>checkpoints</th>"
            "<th>last checkpoint (UTC)</th><th></th></tr>" + "".join(rows) + "</table>"
        )
        if len(names) > _PER_PAGE:
            last = (len(names) - 1) // _PER_PAGE
            links = [f"sessions {at * _PER_PAGE + 1}-{at * _PER_PAGE + len(shown)} of {len(names)}"]
            if at > 0:
                links.append(f"<a href='/?page={at}'>previous</a>")
            if at < last:
                links.append(f"<a href='/?page={at + 2}'>next</a>")
            table += "<p>" + " · ".join(links) + "</p>"
        return page("sessions", table)

    def session_page(request: Request) -> Response:
        name = request.path_params["name"]
        s = session(name)
        cps = s.history()
        if not cps:
            return page(f"session {name}", "<p>No checkpoints.</p>", 404)
        labels = s.labels()
        heads: dict[str, list[str]] = {}
        for branch, head in s.branches().items():
            heads.setdefault(head, []).append(branch)
        body = _pending_html(s, form)
        body += f"<p>{len(cps)} checkpoints, newest first on each line of history; a fork "
        body += "starts an indented line. Click one to inspect it, restore it or fork it.</p>"
        body += _tree_html(name, cps, labels, heads, s.head.id if s.head else None)
        return page(f"session {name}", body)

    def checkpoint_page(request: Request) -> Response:
        name = request.path_params["name"]
        s = session(name)
        cp = s.get(request.path_params["ref"])
        body = _checkpoint_html(s, cp, form)
        safety = request.query_params.get("rewound")
        if safety:  # just rewound here: say how to undo it
            body = (
                f"<p class='warn'>Rewound to this checkpoint. What was there before is "
                f"checkpoint <a href='{_e(_cp_url(name, safety))}'><code>{_short(safety)}"
                "</code></a>: restore it to undo.</p>" + body
            )
        return page(f"checkpoint {_short(cp.id)}", body)

    def diff_page(request: Request) -> Response:
        name = request.path_params["name"]
        a, b = request.query_params.get("a"), request.query_params.get("b", "HEAD")
        if not a:
            raise UsageError("diff needs ?a=ID (and optionally &b=ID)")
        s = session(name)
        d = s.diff(a, b)
        return page(f"diff {_short(d.a.id)} → {_short(d.b.id)}", _diff_html(s, d))

    # -- actions (POST only) -------------------------------------------------------------
    def rewind_action(request: Request, f: dict[str, str]) -> Response:
        name = request.path_params["name"]
        mode = f.get("mode", "both")
        if mode not in ("both", "files", "state"):
            raise UsageError("mode must be both, files or state")
        s = session(name)
        if mode != "state" and s.workspace is None:
            raise UsageError("no workspace is bound to this UI: only state can be rewound")
        ref = f.get("ref", "")
        # Where the files may go is the session's rule (the branch's bound directory), the
        # same for every restore: one click never pours them over another directory.
        result = s.rewind(ref, files=mode != "state", state=mode != "files")
        done = urlencode({"rewound": result.safety.id})
        return RedirectResponse(f"{_cp_url(name, result.head.id)}?{done}", status_code=303)

    def fork_action(request: Request, f: dict[str, str]) -> Response:
        name = request.path_params["name"]
        s = session(name)
        target = s.get(f.get("ref", ""))
        into = f.get("into") or None
        new = s.fork(target.id, f.get("branch") or None, into=into)
        return RedirectResponse(_s_url(name) + f"#b-{quote(new.branch)}", status_code=303)

    def decide_action(request: Request, f: dict[str, str], approved: bool) -> Response:
        name = request.path_params["name"]
        s = session(name)
        ident = f.get("id") or None
        reason = f.get("reason") or None
        by = os.environ.get("USER") or "web-ui"
        cp = (
            s.approve(ident, reason=reason, by=by)
            if approved
            else s.reject(ident, reason=reason, by=by)
        )
        return RedirectResponse(_cp_url(name, cp.id), status_code=303)

    routes = [
        Route("/", guarded(sessions_page)),
        Route("/s/{name:path}/c/{ref}", guarded(checkpoint_page)),
        Route("/s/{name:path}/diff", guarded(diff_page)),
        Route("/s/{name:path}/rewind", guarded(rewind_action, post=True), methods=["POST"]),
        Route("/s/{name:path}/fork", guarded(fork_action, post=True), methods=["POST"]),
        Route(
            "/s/{name:path}/approve",
            guarded(lambda r, f: decide_action(r, f, True), post=True),
            methods=["POST"],
        ),
        Route(
            "/s/{name:path}/reject",
            guarded(lambda r, f: decide_action(r, f, False), post=True),
            methods=["POST"],
        ),
        Route("/s/{name:path}", guarded(session_page)),
    ]
    return Starlette(routes=routes)


_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make the browser send Origin: null
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def _s_url(name: str) -> str:
    return f"/s/{quote(name, safe='')}"


def _cp_url(name: str, ident: str) -> str:
    return f"{_s_url(name)}/c/{quote(ident, safe='')}"


def _pending(s: Session) -> Any:
    from .durable import Journal

    return Journal(s).pending()


def _pending_html(s: Session, form: Callable[..., str]) -> str:
    p = _pending(s)
    if p is None:
        return ""
    target = p.checkpoint or p.id
    url = _s_url(s.name)
    reason = "<input name='reason' placeholder='reason (recorded)' size='28'>"
    what = "waits for approval" if p.kind == "approval" else "outcome unknown (process died)"
    return (
        f"<div class='warn'><b>{_e(p.tool)}</b> {what}: <code>"
        f"{_e(json.dumps(p.args, default=str)[:400])}</code><br>"
        + form(url + "/approve", {"id": target}, "approve", reason)
        + form(url + "/reject", {"id": target}, "reject", reason)
        + "</div>"
    )


def _tree_html(
    name: str,
    cps: list[Checkpoint],
    labels: dict[str, str],
    heads: dict[str, list[str]],
    current: str | None,
) -> str:
    """Lines of history as nested lists: a line runs from its tip down to where it forked."""
    by_id = {cp.id: cp for cp in cps}
    children: dict[str | None, list[Checkpoint]] = {}
    for cp in cps:
        parent = cp.parent if cp.parent in by_id else None
        children.setdefault(parent, []).append(cp)
    # The line that goes on is the one leading to the session's head, else to the newest
    # checkpoint (ids sort by time): the live line stays on the left, others are indented.
    rank = {cp.id: (cp.id == current, cp.id) for cp in cps}
    for cp in sorted(cps, key=lambda c: c.id, reverse=True):  # children before parents
        if cp.parent in rank:
            rank[cp.parent] = max(rank[cp.parent], rank[cp.id])
    for kids in children.values():
        kids.sort(key=lambda c: rank[c.id], reverse=True)

    def item(cp: Checkpoint) -> str:
        label = labels.get(cp.id)
        bits = [
            f"<a class='id' href='{_e(_cp_url(name, cp.id))}'><code>{_short(cp.id)}</code></a>",
            f"step {cp.step}",
            _e(cp.kind),
            f"<span class='muted'>{_e(cp.created_at[:19].replace('T', ' '))}</span>",
        ]
        bits += [f"<span class='head' id='b-{_e(b)}'>{_e(b)}</span>" for b in heads.get(cp.id, [])]
        if label:
            bits.append(f"<span class='label'>{_e(label)}</span>")
        if cp.status and cp.status != "running":
            bits.append(f"&lt;{_e(cp.status)}&gt;")
        if cp.message:
            bits.append(_e(cp.message[:160]))
        return "<li>" + " ".join(bits) + "</li>"

    def line(start: Checkpoint) -> str:
        """From ``start`` along first children to a tip; other children open nested lines.
        Printed tip first (newest on top), as ``log`` does."""
        chain: list[Checkpoint] = [start]
        forks: list[tuple[Checkpoint, Checkpoint]] = []
        cur = start
        while children.get(cur.id):
            first, *others = children[cur.id]
            forks.extend((cur, o) for o in others)
            chain.append(first)
            cur = first
        nested = {c.id: [o for p, o in forks if p.id == c.id] for c in chain}
        out = []
        for cp in reversed(chain):
            subs = "".join(f"<ul class='tree'>{line(o)}</ul>" for o in nested[cp.id])
            out.append(subs + item(cp))
        return "".join(out)

    return "".join(f"<ul class='tree'>{line(r)}</ul>" for r in children.get(None, []))


def _checkpoint_html(s: Session, cp: Checkpoint, form: Callable[..., str]) -> str:
    from .retention import PrunedError
    from .serde import to_tree

    name = s.name
    rows = [
        ("id", f"<code>{_e(cp.id)}</code>"),
        ("session / branch", f"{_e(cp.session)} / {_e(cp.branch)}"),
        (
            "parent",
            f"<a href='{_e(_cp_url(name, cp.parent))}'><code>{_short(cp.parent)}</code></a>"
            if cp.parent
            else "-",
        ),
        ("step · kind · status", f"{cp.step} · {_e(cp.kind)} · {_e(cp.status or '-')}"),
        ("label", _e(s.labels().get(cp.id) or "-")),
        ("message", _e(cp.message or "-")),
        ("created (UTC)", _e(cp.created_at)),
        ("digest", f"<code>{_e(cp.digest)}</code>"),
        (
            "schema · deps",
            _e(f"v{cp.schema_version} · " + ", ".join(f"{k} {v}" for k, v in cp.deps.items())),
        ),
    ]
    body = "<table>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"
    url = _s_url(name)
    body += "<h3>Actions</h3><p>"
    if cp.parent:
        q = urlencode({"a": cp.parent, "b": cp.id})
        body += f"<a href='{_e(url)}/diff?{_e(q)}'>diff with parent</a> · "
    body += (
        f"<a href='{_e(url)}/diff?{_e(urlencode({'a': cp.id, 'b': 'HEAD'}))}'>"
        "diff with HEAD</a></p><p>"
    )
    modes = [("both", "restore files + state")] if s.workspace is not None else []
    if s.workspace is not None:
        modes.append(("files", "restore files only"))
    modes.append(("state", "restore state only"))
    for mode, text in modes:
        body += form(url + "/rewind", {"ref": cp.id, "mode": mode}, text)
    body += "</p><p>" + form(
        url + "/fork",
        {"ref": cp.id},
        "fork a new branch here",
        "<input name='branch' placeholder='branch name (optional)' size='22'> "
        "<input name='into' placeholder='into directory (optional)' size='28'> ",
    )
    body += (
        "</p><p class='muted'>A restore first checkpoints what is there now, so it can be "
        "undone; ignored files are never touched; external effects recorded after the target "
        "are not undone.</p>"
    )
    body += _pending_html(s, form) if s.head is not None and s.head.id == cp.id else ""
    try:
        state = to_tree(s.state(cp))
    except PrunedError:
        return (
            body + "<p class='warn'>Pruned by retention: the record stays, its contents were "
            "released.</p>"
        )
    text = json.dumps(state, indent=2, ensure_ascii=False, default=str)
    cut = len(text) > MAX_STATE_CHARS
    body += f"<h3>State</h3><pre>{_e(text[:MAX_STATE_CHARS])}{' …' if cut else ''}</pre>"
    if cp.journal is not None:
        from .durable import tasks_at

        tasks = tasks_at(s, cp)
        if tasks:
            body += (
                "<h3>Tasks</h3><table><tr><th>task</th><th>status</th></tr>"
                + "".join(f"<tr><td>{_e(t.id)}</td><td>{_e(t.status)}</td></tr>" for t in tasks)
                + "</table>"
            )
    if cp.workspace is not None:
        from .workspace.tree import TreeReader

        ws = cp.workspace
        body += (
            f"<h3>Files</h3><p>{ws.files} files, {ws.bytes:,} bytes in "
            f"<code>{_e(ws.root)}</code></p>"
        )
        entries = []
        for i, (path, e) in enumerate(TreeReader(s.store.blobs).walk(bytes.fromhex(ws.tree))):
            if i >= MAX_FILES_LISTED:
                entries.append("<tr><td colspan='3'>…</td></tr>")
                break
            entries.append(
                f"<tr><td><code>{_e(os.fsdecode(path))}</code></td><td>{_e(e.kind)}</td>"
                f"<td>{e.size:,}</td></tr>"
            )
        body += (
            "<table><tr><th>path</th><th>type</th><th>bytes</th></tr>"
            + "".join(entries)
            + "</table>"
        )
    return body


def _diff_html(s: Session, d: CheckpointDiff) -> str:
    from .cli.textdiff import file_diff
    from .statediff import text_lines

    out = []
    lines = [
        f"<span class='{_CLASSES[style]}'>{_e(line)}</span>" if _CLASSES.get(style) else _e(line)
        for style, line in text_lines(d, limit=MAX_VALUE_CHARS)
    ]
    if lines:
        out.append(f"<h3>State and conversation</h3><pre>{chr(10).join(lines)}</pre>")
    budget = MAX_DIFF_CHARS
    files = []
    for change in d.files:
        path = os.fsdecode(change.path)
        text = file_diff(s.store.blobs, change, path) if budget > 0 else f"{change.status} {path}\n"
        budget -= len(text)
        files.append(
            f"<h4>{_e(change.status)} <code>{_e(path)}</code></h4><pre>{_colour(text)}</pre>"
        )
    if files:
        out.append(f"<h3>Files ({len(d.files)} changed)</h3>" + "".join(files))
    if not out:
        out.append("<p>No differences.</p>")
    return "".join(out)


def _colour(diff: str) -> str:
    lines: Iterable[str] = diff.splitlines()
    out = []
    for line in lines:
        cls = ""
        if line.startswith("+") and not line.startswith("+++"):
            cls = "add"
        elif line.startswith("-") and not line.startswith("---"):
            cls = "del"
        elif line.startswith("@@"):
            cls = "hunk"
        out.append(f"<span class='{cls}'>{_e(line)}</span>" if cls else _e(line))
    return "\n".join(out)
