"""HTML building blocks shared by the pages: escaping, links, forms, the page frame.

Every value that reaches HTML goes through :func:`e` (names, labels, messages, paths and state
all come from agents and users). Pages carry no inline script or style: the CSP allows only
the package's own files under ``/static/``.
"""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

__all__ = [
    "Frame",
    "cp_url",
    "e",
    "q",
    "s_url",
    "short",
    "when",
]


def e(value: object) -> str:
    return html.escape(str(value), quote=True)


def command(*words: str) -> str:
    """A shell command to show for copying: each word quoted, since a session name or a
    directory may hold spaces or ``;`` (a bundle's session name is chosen by its sender)."""
    return " ".join(shlex.quote(w) for w in words)


def short(ident: str | None) -> str:
    return ident[:12] if ident else "-"


def when(iso: str) -> str:
    return iso[:19].replace("T", " ")


def s_url(name: str) -> str:
    return f"/s/{quote(name, safe='')}"


def cp_url(name: str, ident: str) -> str:
    return f"{s_url(name)}/c/{quote(ident, safe='')}"


def q(base: str, /, **params: object) -> str:
    """``base?params`` without the empty ones."""
    keep = {k: str(v) for k, v in params.items() if v not in (None, "", False)}
    return base + (f"?{urlencode(keep)}" if keep else "")


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


class Frame:
    """The page frame and the forms of one server (they carry its CSRF field)."""

    def __init__(self, csrf: str, store_url: str) -> None:
        self.csrf = csrf
        self.store_url = store_url

    def page(
        self,
        title: str,
        body: str,
        *,
        anonymous: bool = False,
        crumbs: Mapping[str, str] | None = None,
        banner: str = "",
    ) -> str:
        where = "" if anonymous else f" · <span class='muted'>{e(self.store_url)}</span>"
        trail = ""
        if crumbs:
            trail = (
                "<nav class='crumbs'>"
                + " / ".join(f"<a href='{e(u)}'>{e(t)}</a>" for t, u in crumbs.items())
                + "</nav>"
            )
        return (
            "<!doctype html><html><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{e(title)} · stashpoint</title>"
            "<link rel='icon' href='/static/favicon.svg'>"
            "<link rel='stylesheet' href='/static/app.css'>"
            "<link rel='stylesheet' href='/static/pygments.css'>"
            "<script src='/static/app.js' defer></script></head><body>"
            f"<header><a href='/'><b>stashpoint</b></a> · time-travel debugger{where}</header>"
            f"<main>{trail}{banner}<h2>{e(title)}</h2>{body}</main></body></html>"
        )

    def hidden(self, fields: Mapping[str, str]) -> str:
        return "".join(
            f"<input type='hidden' name='{e(k)}' value='{e(v)}'>"
            for k, v in {**fields, "csrf": self.csrf}.items()
        )

    def form(self, action: str, fields: Mapping[str, str], button: str, extra: str = "") -> str:
        return (
            f"<form class='inline' method='post' action='{e(action)}'>{self.hidden(fields)}"
            f"{extra}<button type='submit'>{e(button)}</button></form>"
        )


def banner(text: str, undo: str | None = None, kind: str = "ok") -> str:
    """A result banner; ``undo`` is a command (shown as code) that takes it back."""
    tail = f" Undo: <code class='cmd'>{e(undo)}</code>" if undo else ""
    return f"<div class='banner {kind}' role='status'>{text}{tail}</div>"
