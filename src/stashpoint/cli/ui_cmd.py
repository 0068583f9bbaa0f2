"""``stashpoint ui``: serve the local web UI (time-travel debugger) on loopback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ._app import Ctx, json_option, pass_ctx

# Library modules are imported inside the commands, not here: every CLI run (``--help``
# too) imports this module (start-up time).


@click.command()
@click.option("--port", type=int, default=8765, show_default=True, help="0: any free port.")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="A loopback address (127.0.0.1, localhost or ::1); nothing else is accepted.",
)
@click.option(
    "--token",
    envvar="STASHPOINT_UI_TOKEN",
    help="Access token (default: a new random one; env STASHPOINT_UI_TOKEN).",
)
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a browser.")
@json_option
@pass_ctx
def ui(ctx: Ctx, port: int, host: str, token: str | None, open_browser: bool) -> None:
    """Serve the time-travel debugger: sessions, checkpoint tree, state, file diffs,
    restore / fork / approve. Bound to loopback; every request needs the token in the
    printed URL. Stop with Ctrl-C.

    \b
    Example:
      stashpoint ui                  # prints http://127.0.0.1:8765/?token=…
      stashpoint ui --port 0 --json  # {"url": …, "port": …} on the first line, for scripts
    """
    from ..errors import MissingExtraError, UsageError
    from ..webui import LOOPBACK, create_app, new_token
    from ..workspace import check_root

    if host not in LOOPBACK:
        raise UsageError(f"the web UI binds loopback only ({', '.join(LOOPBACK)}), not {host!r}")
    try:
        import uvicorn
    except ImportError:
        raise MissingExtraError(
            "the web UI needs starlette and uvicorn: pip install 'stashpoint[ui]'"
        ) from None
    _url, root, _s, _b = ctx.locate()
    store = ctx.store()
    workspace: Path | None = root
    try:
        check_root(root, force=ctx.force)
    except UsageError:
        workspace = None  # browse and restore state only
    token = token or new_token()
    import socket  # here, not at the top: every CLI run imports this module

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)  # before the URL is printed: a script may connect as soon as it reads it
    port = sock.getsockname()[1]
    app = create_app(store, token=token, port=port, root=workspace, force=ctx.force, host=host)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/?token={token}"
    if ctx.json:
        click.echo(json.dumps({"url": url, "port": port, "host": host, "store": store.url}))
    else:
        click.echo(f"stashpoint ui: {url}\n(store {store.url}; Ctrl-C stops it)")
    sys.stdout.flush()
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # pragma: no cover - uvicorn handles SIGINT itself
        pass
    finally:
        sock.close()
