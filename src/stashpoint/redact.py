"""Redaction (SPEC C21, §5 "secrets in state"): scrub secrets from state before it is persisted.

Agents copy credentials into their state more often than anyone intends: a tool echoes its
environment, a user pastes a key into the chat, an HTTP call's headers land in a message. A
checkpoint keeps that forever, in every backup and bundle. So :class:`Session` runs a redactor
over the state, the conversation and the checkpoint's message and metadata *before* encoding
anything, and replaces each secret with a marker such as ``[REDACTED:openai]``.

On by default. Why: a false positive costs one string in a checkpoint (the agent re-reads a
credential from its environment, where it belongs), while a false negative costs a leaked key
in every copy of the store; the default patterns are anchored on the vendors' fixed prefixes
(``sk-ant-``, ``AKIA``, ``ghp_``, ``xoxb-``, ``AIza``, ``eyJ…``, PEM armour), so ordinary text
does not match. Turn it off with ``Session(redact=False)`` or ``[tool.stashpoint] redact =
false``; add patterns with ``redact={"name": r"regex"}`` or ``[tool.stashpoint]
redact_patterns = {name = "regex"}`` (a ``(?P<secret>...)`` group limits the replacement to that
part); pass any callable ``value -> value`` to redact your own way.

What is walked: str, dict (keys kept; values under keys named like password / secret / token /
api_key are replaced whole), list, tuple, and the fields of dataclasses and pydantic models
(LangChain messages are pydantic models): a changed one is a copy (``model_copy``), never the
caller's object mutated. Other values (bytes, numbers, other objects) pass unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from .errors import UsageError

__all__ = ["DEFAULT_PATTERNS", "Redactor", "RedactorFn", "load_config", "make_redactor"]

DEFAULT_PATTERNS: dict[str, str] = {
    # Order matters: the more specific prefix first (sk-ant- is also sk-).
    "private_key": (
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]*?"
        r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----"
    ),
    "anthropic": r"\bsk-ant-[A-Za-z0-9_\-]{20,}",
    "openai": r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",
    "aws": r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b",
    "aws_secret": r"(?i:aws_?secret_?access_?key)\W{0,3}(?P<secret>[A-Za-z0-9/+=]{40})\b",
    "github": r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
    "slack": r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",
    "google": r"\bAIza[0-9A-Za-z_\-]{35}",
    "jwt": r"\beyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{10,}",
    "bearer": r"\b[Bb]earer\s+(?P<secret>[A-Za-z0-9\-._~+/]{16,}=*)",
}
"""Name -> regex of the secrets scrubbed by default."""

_TRIGGERS: dict[str, tuple[str, ...]] = {
    "private_key": ("PRIVATE KEY",),
    "anthropic": ("sk-ant-",),
    "openai": ("sk-",),
    "aws": ("AKIA", "ASIA", "AGPA", "AIDA", "AROA"),
    "aws_secret": ("ecret", "ECRET"),
    "github": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    "slack": ("xox",),
    "google": ("AIza",),
    "jwt": ("eyJ",),
    "bearer": ("earer",),
}
"""Substrings without which a default pattern cannot match: a substring test (C speed) skips
the regex for almost every string."""

SECRET_KEYS = re.compile(
    r"(?i)^(?:.*[_\-.])?(?:password|passwd|passphrase|secret|client_secret|secret_?key|"
    r"token|access_?token|refresh_?token|id_?token|auth_?token|session_?token|api_?key|"
    r"apikey|private_?key|access_?key|credentials?|authorization|cookie)$"
)
"""Dict keys whose string values are secrets, whatever they look like."""


_LEAVES = frozenset({int, float, bool, type(None), bytes, bytearray, complex})
"""Types that hold no text: returned as they are, without a look inside."""


class RedactorFn(Protocol):
    """Anything that returns a scrubbed copy of a value (the original must not be mutated)."""

    def __call__(self, value: Any, /) -> Any: ...


class Redactor:
    """Pattern-based redactor: ``[REDACTED:<name>]`` for every match, recursively."""

    def __init__(
        self, extra: Mapping[str, str] | None = None, *, defaults: bool = True, keys: bool = True
    ) -> None:
        patterns = {**(DEFAULT_PATTERNS if defaults else {}), **(extra or {})}
        self.patterns: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = []
        for name, rx in patterns.items():
            try:
                compiled = re.compile(rx)
            except re.error as exc:
                raise UsageError(f"redaction pattern {name!r} is not a valid regex: {exc}") from exc
            default = DEFAULT_PATTERNS.get(name) == rx
            self.patterns.append((name, compiled, _TRIGGERS.get(name, ()) if default else ()))
        triggers = sorted({t for _, _, ts in self.patterns for t in ts})
        self._gate = re.compile("|".join(map(re.escape, triggers))) if triggers else None
        """Any trigger at all, in one pass of the text (most strings hold none)."""
        self._ungated = [p for p in self.patterns if not p[2]]
        self.keys = keys
        self._key_cache: dict[str, bool] = {}
        self.counts: Counter[str] = Counter()
        """Secrets replaced so far, by pattern name (the session reads and resets it)."""

    def __call__(self, value: Any, /) -> Any:
        return self._walk(value, 0)

    def _walk(self, value: Any, depth: int) -> Any:
        t = type(value)
        if t is str:
            return self.scrub(value)
        if t in _LEAVES or depth > 200:  # serde refuses deeper state anyway
            return value
        if t is dict:
            changed = self._changes(value, depth)
            return {**value, **changed} if changed else value
        if t is list or t is tuple:
            items = [self._walk(x, depth + 1) for x in value]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return items if t is list else tuple(items)
        fields = getattr(value, "__dict__", None)
        if type(fields) is not dict:
            return value
        if getattr(t, "__pydantic_fields__", None) is not None:  # a pydantic v2 model
            changed = self._changes(fields, depth)
            return value.model_copy(update=changed) if changed else value
        if dataclasses.is_dataclass(t):
            changed = self._changes(fields, depth)
            if not changed:
                return value
            out = copy.copy(value)
            for k, v in changed.items():
                object.__setattr__(out, k, v)  # frozen dataclasses too
            return out
        return value

    def _changes(self, fields: Mapping[Any, Any], depth: int) -> dict[Any, Any]:
        """The scrubbed values of the fields that changed (dict items, model attributes)."""
        out: dict[Any, Any] = {}
        for k, v in fields.items():
            if self.keys and type(v) is str and v and type(k) is str and self._secret_key(k):
                if v.startswith("[REDACTED:"):
                    continue
                conv: Any = "[REDACTED:field]"
                self.counts["field"] += 1
            else:
                conv = self._walk(v, depth + 1)
            if conv is not v:
                out[k] = conv
        return out

    def _secret_key(self, key: str) -> bool:
        hit = self._key_cache.get(key)
        if hit is None:
            hit = SECRET_KEYS.match(key) is not None
            if len(self._key_cache) < 10_000:  # keys repeat (role, content, ...): remember
                self._key_cache[key] = hit
        return hit

    def scrub(self, text: str) -> str:
        """One string with every match replaced."""
        gate = self._gate
        patterns = self._ungated if gate is not None and not gate.search(text) else self.patterns
        for name, rx, triggers in patterns:
            if triggers:
                for t in triggers:  # a plain loop: twice as fast as any() over a generator
                    if t in text:
                        break
                else:
                    continue
            if rx.search(text) is None:
                continue
            marker = f"[REDACTED:{name}]"

            def sub(m: re.Match[str], marker: str = marker, name: str = name, rx: Any = rx) -> str:
                self.counts[name] += 1
                if "secret" in rx.groupindex and m.group("secret") is not None:
                    s, e = m.span("secret")
                    return m.group(0)[: s - m.start()] + marker + m.group(0)[e - m.start() :]
                return marker

            text = rx.sub(sub, text)
        return text


def load_config(root: Path | None) -> dict[str, Any]:
    """``[tool.stashpoint]`` of ``pyproject.toml`` in ``root`` (or the current directory)."""
    path = (root or Path.cwd()) / "pyproject.toml"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
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


def make_redactor(
    redact: bool | Mapping[str, str] | Callable[[Any], Any] | None, root: Path | None
) -> Callable[[Any], Any] | None:
    """The session's redactor from its ``redact`` argument (None: project config, else on)."""
    if redact is False:
        return None
    if callable(redact) and not isinstance(redact, Mapping):
        return redact
    config = load_config(root)
    if redact is None and config.get("redact", True) is False:
        return None
    extra = config.get("redact_patterns", {})
    if not isinstance(extra, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in extra.items()
    ):
        raise UsageError("[tool.stashpoint] redact_patterns must be a table of name = regex")
    if isinstance(redact, Mapping):
        extra = {**extra, **redact}
    return Redactor(extra)
