"""The ASGI app: routes, the guard every request passes, and one request at a time on the
store.

Pages are rendered on the server from the same library calls the CLI makes. The browser gets
HTML, inline SVG and the package's own ``app.js``/``app.css`` (the live view and small
conveniences; every page works without script). Nothing is fetched from the network.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from ..errors import MissingExtraError, StashpointError, UsageError
from ..urls import printable_url
from . import actions, checkpoint, compare, sessions
from .render import Frame, cp_url, e, q, s_url, short
from .security import COOKIE, SECURITY_HEADERS, Forbidden, Guard

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    from .._store import Store
    from ..session import Session

__all__ = ["create_app"]

_STATIC_TYPES = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "pygments.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def static_files() -> dict[str, bytes]:
    """The package's own script and styles, read once (no file system path is ever taken
    from a request)."""
    from pygments.formatters import HtmlFormatter

    base = resources.files("stashpoint.webui") / "static"
    out = {n: (base / n).read_bytes() for n in ("app.js", "app.css", "favicon.svg")}
    out["pygments.css"] = HtmlFormatter(style="default").get_style_defs(".src").encode()
    return out


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
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse
        from starlette.responses import Response as PlainResponse
        from starlette.routing import Route
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(
            "the web UI needs starlette and uvicorn: pip install 'stashpoint[ui]'"
        ) from exc
    if len(token) < 16:
        raise UsageError("the web UI token must be at least 16 characters")
    guard = Guard(token, port, host)
    frame = Frame(guard.csrf, printable_url(store.url))
    files = static_files()
    lock = threading.Lock()  # one request at a time touches the store

    def session(name: str, branch: str | None = None) -> Session:
        if branch:
            return store.session(name, branch=branch, force=force)
        return store.session(name, workspace=root, force=force)

    def html(title: str, body: str, status: int = 200, **kw: Any) -> Response:
        return HTMLResponse(
            frame.page(title, body, **kw), status_code=status, headers=SECURITY_HEADERS
        )

    def error(text: str, status: int = 400, *, anonymous: bool = False) -> Response:
        return html(
            "error" if not anonymous else "refused",
            f"<p class='error'>{e(text)}</p>",
            status,
            anonymous=anonymous,
        )

    def guarded(fn: Callable[..., Response], *, post: bool = False) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                cookie = guard.check(request)
                fields = await guard.check_post(request) if post else {}
            except Forbidden as exc:  # says nothing of the store to whoever asked
                return error(str(exc), exc.status, anonymous=True)
            if cookie:  # the token leaves the address bar (history, logs, screenshots)
                keep = {k: v for k, v in request.query_params.items() if k != "token"}
                target = request.url.path + (f"?{urlencode(keep)}" if keep else "")
                resp: Response = RedirectResponse(target, status_code=303)
                resp.set_cookie(COOKIE, token, httponly=True, samesite="strict")
                return resp

            def call() -> Response:
                with lock:
                    try:
                        return fn(request, fields) if post else fn(request)
                    except StashpointError as exc:
                        return error(str(exc))
                    except OSError as exc:  # a fork into a directory that cannot be made
                        where = f" at {exc.filename}" if exc.filename else ""
                        return error(f"{exc.strerror or exc}{where}")

            return await run_in_threadpool(call)

        return endpoint

    def crumbs(name: str, *more: tuple[str, str]) -> dict[str, str]:
        return {"sessions": "/", f"session {name}": s_url(name), **dict(more)}

    # -- pages ---------------------------------------------------------------------------
    def static(request: Request) -> Response:
        name = request.path_params["file"]
        if name not in files:
            return error("no such file", 404)
        # cached a few minutes (privately): every page loads them
        headers = {**SECURITY_HEADERS, "Cache-Control": "private, max-age=300"}
        return PlainResponse(files[name], media_type=_STATIC_TYPES[name], headers=headers)

    def sessions_page(request: Request) -> Response:
        body, status = sessions.sessions_body(store, request.query_params)
        return html("sessions", body, status)

    def session_page(request: Request) -> Response:
        name = request.path_params["name"]
        s = session(name)
        body, status = sessions.session_body(s, request.query_params, frame)
        banner = actions.done_banner(name, request.query_params)
        return html(f"session {name}", body, status, crumbs=crumbs(name), banner=banner)

    def live(request: Request) -> Response:
        s = session(request.path_params["name"])
        data = sessions.live_rows(s, request.query_params.get("after", ""))
        return JSONResponse(data, headers=SECURITY_HEADERS)

    def checkpoint_page(request: Request) -> Response:
        name = request.path_params["name"]
        s = session(name)
        cp = s.get(request.path_params["ref"])
        body = checkpoint.checkpoint_body(s, cp, request.query_params, frame)
        banner = actions.done_banner(name, request.query_params)
        return html(f"checkpoint {short(cp.id)}", body, crumbs=crumbs(name), banner=banner)

    def file_page(request: Request) -> Response:
        name = request.path_params["name"]
        s = session(name)
        cp = s.get(request.path_params["ref"])
        title, body = checkpoint.file_body(s, cp, request.query_params)
        trail = crumbs(name, (f"checkpoint {short(cp.id)}", cp_url(name, cp.id)))
        return html(title, body, crumbs=trail)

    def diff_page(request: Request) -> Response:
        name = request.path_params["name"]
        a, b = request.query_params.get("a"), request.query_params.get("b") or "HEAD"
        if not a:
            raise UsageError("pick a checkpoint A (and B) to compare")
        s = session(name)
        d = s.diff(a, b)
        body = compare.diff_body(s, d, request.query_params)
        return html(f"compare {short(d.a.id)} → {short(d.b.id)}", body, crumbs=crumbs(name))

    def confirm_page(request: Request) -> Response:
        name = request.path_params["name"]
        title, body = actions.confirm_body(session(name), request.query_params, frame)
        return html(title, body, crumbs=crumbs(name))

    # -- actions (POST only) -------------------------------------------------------------
    def rewind_action(request: Request, f: dict[str, str]) -> Response:
        name = request.path_params["name"]
        mode = f.get("mode", "both")
        if mode not in ("both", "files", "state"):
            raise UsageError("mode must be both, files or state")
        s = session(name)
        if mode != "state" and s.workspace is None:
            raise UsageError("no workspace is bound to this UI: only state can be rewound")
        # Where the files may go is the session's rule (the branch's bound directory), the
        # same for every restore: one click never pours them over another directory.
        result = s.rewind(f.get("ref", ""), files=mode != "state", state=mode != "files")
        done = q(
            cp_url(name, result.head.id),
            done="rewound",
            safety=result.safety.id,
            mode=mode,
            **actions.hooks_params(result),
        )
        return RedirectResponse(done, status_code=303)

    def fork_action(request: Request, f: dict[str, str]) -> Response:
        name = request.path_params["name"]
        s = session(name)
        target = s.get(f.get("ref", ""))
        into = f.get("into") or None
        new = s.fork(target.id, f.get("branch") or None, into=into)
        where = str(Path(into).resolve()) if into else None
        done = q(
            s_url(name),
            done="forked",
            branch=new.branch,
            into=where,
            **actions.hooks_params(new.last_restore),
        )
        return RedirectResponse(f"{done}#graph", status_code=303)

    def label_action(request: Request, f: dict[str, str]) -> Response:
        name = request.path_params["name"]
        label = f.get("label", "").strip() or None
        cp = session(name).label(f.get("ref", ""), label)
        done = q(cp_url(name, cp.id), done="labelled", label=label, ref=cp.id)
        return RedirectResponse(done, status_code=303)

    def edit_action(request: Request, f: dict[str, str]) -> Response:
        name = request.path_params["name"]
        path = f.get("path", "").strip()
        if not path:
            raise UsageError("name the state value to change (a path such as plan.budget)")
        target = session(name).get(f.get("ref", ""))
        on = session(name, target.branch)
        new = on.edit(
            target,
            assign={path: actions.parse_value(f.get("value", ""))},
            reason=f.get("reason") or None,
            by=os.environ.get("USER") or "web-ui",
            branch=f.get("branch") or None,
        )
        done = q(cp_url(name, new.id), done="edited", of=target.id)
        return RedirectResponse(done, status_code=303)

    def decide_action(request: Request, f: dict[str, str], approved: bool) -> Response:
        name = request.path_params["name"]
        s = session(name, f.get("branch") or None)
        pending = s.pending()
        reason = f.get("reason") or None
        by = os.environ.get("USER") or "web-ui"
        ident = f.get("id") or None
        cp = (
            s.approve(ident, reason=reason, by=by)
            if approved
            else s.reject(ident, reason=reason, by=by)
        )
        tool = pending.tool if pending is not None else "call"
        done = q(cp_url(name, cp.id), done="approved" if approved else "rejected", tool=tool)
        return RedirectResponse(done, status_code=303)

    def post(fn: Callable[[Request, dict[str, str]], Response]) -> Callable[[Request], Any]:
        return guarded(fn, post=True)

    routes = [
        Route("/", guarded(sessions_page)),
        Route("/static/{file}", guarded(static)),
        Route("/s/{name:path}/c/{ref}/file", guarded(file_page)),
        Route("/s/{name:path}/c/{ref}", guarded(checkpoint_page)),
        Route("/s/{name:path}/diff", guarded(diff_page)),
        Route("/s/{name:path}/live.json", guarded(live)),
        Route("/s/{name:path}/confirm", guarded(confirm_page)),
        Route("/s/{name:path}/rewind", post(rewind_action), methods=["POST"]),
        Route("/s/{name:path}/fork", post(fork_action), methods=["POST"]),
        Route("/s/{name:path}/label", post(label_action), methods=["POST"]),
        Route("/s/{name:path}/edit", post(edit_action), methods=["POST"]),
        Route(
            "/s/{name:path}/approve",
            post(lambda r, f: decide_action(r, f, True)),
            methods=["POST"],
        ),
        Route(
            "/s/{name:path}/reject",
            post(lambda r, f: decide_action(r, f, False)),
            methods=["POST"],
        ),
        Route("/s/{name:path}", guarded(session_page)),
    ]
    return Starlette(routes=routes)
