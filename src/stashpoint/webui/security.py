"""Who may talk to the UI, and what its pages may do in the browser.

Why so strict for a local page: a web page on any site can make the browser send requests to
127.0.0.1, and a DNS name can be rebound to 127.0.0.1. So:

- the server binds a loopback address only;
- every request needs the token printed at start (``?token=`` once, then an HttpOnly,
  SameSite=Strict cookie; or ``Authorization: Bearer``);
- the Host header must name the loopback address and port the server listens on (rebinding);
- a POST needs a CSRF field derived from the token, and an Origin, when sent, of this server;
- a GET never changes anything; responses forbid framing, run only the package's own script
  and style files (no inline script, no other origin), and send referrers to this server only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["COOKIE", "LOOPBACK", "SECURITY_HEADERS", "Forbidden", "Guard", "new_token"]

LOOPBACK = ("127.0.0.1", "localhost", "::1")
COOKIE = "stashpoint_ui"

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make the browser send Origin: null
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def new_token() -> str:
    """A fresh random token (printed once; the URL carries it to the browser)."""
    return secrets.token_urlsafe(24)


def same(given: str, secret: str) -> bool:
    """A constant-time comparison that also takes what no ASCII secret equals (a non-ASCII
    token or field made ``hmac.compare_digest`` raise: a 500 before any authentication)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), secret.encode())


class Forbidden(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


class Guard:
    """The checks every request passes before it reaches a page or an action."""

    def __init__(self, token: str, port: int, host: str) -> None:
        self.token = token
        hosts = {f"{h}:{port}" for h in ("127.0.0.1", "localhost", "[::1]")}
        hosts.add(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        self.hosts = frozenset(hosts)
        self.origins = frozenset(f"http://{h}" for h in hosts)
        self.csrf = hmac.new(token.encode(), b"stashpoint-ui-csrf", hashlib.sha256).hexdigest()

    def check(self, request: Request) -> bool:
        """Whether the request carries the token in its URL (to move it into a cookie); a
        request that may not go on raises Forbidden."""
        if request.headers.get("host", "") not in self.hosts:
            raise Forbidden(421, "unexpected Host header (this server answers only on loopback)")
        given = request.cookies.get(COOKIE) or ""
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        fresh = request.query_params.get("token")
        if fresh is not None and same(fresh, self.token):
            return True
        if not given or not same(given, self.token):
            raise Forbidden(401, "token required: open the URL `stashpoint ui` printed")
        return False

    async def check_post(self, request: Request) -> dict[str, str]:
        origin = request.headers.get("origin")
        if origin is not None and origin not in self.origins:
            raise Forbidden(403, "cross-origin request refused")
        form = await request.form()
        fields = {k: str(v) for k, v in form.items() if isinstance(v, str)}
        if not same(fields.get("csrf", ""), self.csrf):
            raise Forbidden(403, "missing or wrong CSRF field")
        return fields
