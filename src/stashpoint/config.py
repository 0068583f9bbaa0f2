"""Settings, each resolved in one place with one precedence.

A setting's value comes from the first of these that gives one:

1. the argument (``open_store(durability=…)``, a ``?durability=`` URL option, a CLI flag);
2. the environment (``$STASHPOINT_DURABILITY``; an empty variable counts as unset);
3. ``[tool.stashpoint]`` in ``pyproject.toml`` of the project (the current directory, or
   the session's workspace root);
4. the store's own record (``stashpoint init --durability``);
5. the default.

Library modules ask :func:`resolve` (or :func:`value`) for a setting by its entry in
:data:`SETTINGS` instead of reading ``os.environ`` or ``pyproject.toml`` themselves, so
each precedence is written once and the table in ``docs/stores.md`` is the whole story.
Variables that only tests and the ``chaos`` harness set (kill points) stay where they are used.

Only the standard library (``tomllib`` on first use): the CLI may import this at start-up.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, NamedTuple

from . import metakeys
from .errors import UsageError

__all__ = [
    "CACHE_HOME",
    "DURABILITY",
    "INTEGRITY_KEY",
    "INTEGRITY_KEY_FILE",
    "KEY",
    "KEY_FILE",
    "NOTIFY",
    "PG_CONNECT_TIMEOUT",
    "REDACT",
    "REDACT_PATTERNS",
    "S3_ENDPOINT",
    "S3_REGION",
    "SETTINGS",
    "USER",
    "Resolved",
    "Setting",
    "project_table",
    "resolve",
    "value",
]


class Setting(NamedTuple):
    """One setting and every place it may come from."""

    name: str
    env: tuple[str, ...] = ()
    """Environment variables, the first one set wins."""
    pyproject: str | None = None
    """Key in ``[tool.stashpoint]``."""
    meta: str | None = None
    """Store meta key (read by the caller, which has the store, and passed as ``stored``)."""
    default: Any = None
    kind: type = str
    """The type a ``pyproject.toml`` value must have."""
    argument: str = ""
    """Where an argument gives it (for the documentation)."""
    help: str = ""


class Resolved(NamedTuple):
    """A setting's value and where it came from (``argument``, ``$NAME``,
    ``pyproject.toml``, ``store`` or ``default``)."""

    value: Any
    source: str


DURABILITY = Setting(
    "durability",
    ("STASHPOINT_DURABILITY",),
    pyproject="durability",
    meta=metakeys.DURABILITY,
    default="fsync",
    argument="open_store(durability=), ?durability=, --durability",
    help="how soon a checkpoint survives a power loss: fsync, group[:N][,Tms], exit",
)
KEY = Setting(
    "key",
    ("STASHPOINT_KEY",),
    argument="open_store(encryption_key=)",
    help="encryption key, 64 hex digits or base64 (beats the key file)",
)
KEY_FILE = Setting(
    "key_file",
    ("STASHPOINT_KEY_FILE",),
    argument="open_store(encryption_key=)",
    help="file holding the encryption key (chmod 600)",
)
INTEGRITY_KEY = Setting(
    "integrity_key",
    ("STASHPOINT_INTEGRITY_KEY",),
    argument="open_store(key=)",
    help="key of a keyed hash chain (HMAC), 64 hex digits or base64 (beats the key file)",
)
INTEGRITY_KEY_FILE = Setting(
    "integrity_key_file",
    ("STASHPOINT_INTEGRITY_KEY_FILE",),
    argument="open_store(key=)",
    help="file holding the hash chain's key (chmod 600)",
)
S3_ENDPOINT = Setting(
    "s3_endpoint",
    ("STASHPOINT_S3_ENDPOINT", "AWS_ENDPOINT_URL"),
    help="endpoint of an S3-compatible blob store (MinIO, R2 ...); default AWS",
)
S3_REGION = Setting(
    "s3_region",
    ("AWS_REGION", "AWS_DEFAULT_REGION"),
    default="us-east-1",
    help="region of the S3 blob store",
)
NOTIFY = Setting(
    "notify",
    ("STASHPOINT_NOTIFY",),
    argument="Session(notify=)",
    help="where approvals and in-doubt steps are announced: a command or an http(s) URL",
)
REDACT = Setting(
    "redact",
    pyproject="redact",
    default=True,
    kind=bool,
    argument="Session(redact=)",
    help="mask secrets in recorded state and conversation",
)
REDACT_PATTERNS = Setting(
    "redact_patterns",
    pyproject="redact_patterns",
    default={},
    kind=dict,
    argument="Session(redact={name: regex})",
    help="more secret patterns (name = regex)",
)
CACHE_HOME = Setting(
    "cache_home",
    ("XDG_CACHE_HOME",),
    help="user cache directory (restore locks of a store without a directory); ~/.cache",
)
USER = Setting("user", ("USER",), help="who approves, in notifications (after the login name)")
PG_CONNECT_TIMEOUT = Setting(
    "pg_connect_timeout",
    ("PGCONNECT_TIMEOUT",),
    argument="?connect_timeout= in the URL",
    help="libpq's connection timeout; stashpoint sets 5 s when neither is given",
)

SETTINGS: tuple[Setting, ...] = (
    DURABILITY,
    KEY,
    KEY_FILE,
    INTEGRITY_KEY,
    INTEGRITY_KEY_FILE,
    S3_ENDPOINT,
    S3_REGION,
    NOTIFY,
    REDACT,
    REDACT_PATTERNS,
    CACHE_HOME,
    USER,
    PG_CONNECT_TIMEOUT,
)


def resolve(
    setting: Setting, given: Any = None, *, stored: Any = None, root: Path | None = None
) -> Resolved:
    """``setting``'s value: ``given`` (the argument), else the environment, else
    ``pyproject.toml`` in ``root`` (default: the current directory), else ``stored`` (the
    store's record), else the default."""
    if given is not None:
        return Resolved(given, "argument")
    for name in setting.env:
        text = os.environ.get(name)
        if text:
            return Resolved(text, f"${name}")
    if setting.pyproject is not None:
        table = project_table(root)
        if setting.pyproject in table:
            found = table[setting.pyproject]
            if not isinstance(found, setting.kind):
                raise UsageError(
                    f"[tool.stashpoint] {setting.pyproject} must be a {setting.kind.__name__}, "
                    f"not {found!r}"
                )
            return Resolved(found, "pyproject.toml")
    if stored is not None:
        return Resolved(stored, "store")
    return Resolved(setting.default, "default")


def value(
    setting: Setting, given: Any = None, *, stored: Any = None, root: Path | None = None
) -> Any:
    """:func:`resolve`'s value alone."""
    return resolve(setting, given, stored=stored, root=root).value


def project_table(root: Path | None = None) -> dict[str, Any]:
    """``[tool.stashpoint]`` of ``pyproject.toml`` in ``root`` (or the current directory);
    {} when there is none. The file is read on every call (a few microseconds) and parsed
    again only when its text changed."""
    path = (root or Path.cwd()) / "pyproject.toml"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    if "stashpoint" not in text:  # most projects: no section, and no TOML parser to import
        return {}
    return dict(_parse(str(path), text))


@functools.lru_cache(maxsize=8)
def _parse(path: str, text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        return {}
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: {exc}") from exc
    section = data.get("tool", {}).get("stashpoint", {})
    return section if isinstance(section, dict) else {}
