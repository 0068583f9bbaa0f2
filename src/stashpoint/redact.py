"""Redaction: scrub secrets from state before it is persisted.

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

What is walked: str, dict (keys kept), list, tuple, set, frozenset, and the fields of
dataclasses (``slots=True`` too) and pydantic models, ``extra="allow"`` fields included
(LangChain messages are pydantic models): a changed one is a copy (``model_copy``), never the
caller's object mutated. A value under a key named like password / secret / token / api_key
(``PGPASSWORD``, ``X-Api-Key``, ``clientSecret`` too; see :data:`SECRET_KEYS`) is replaced
whole, a list or dict as well as a string; in a model's attribute, every string inside it.
Other values (bytes, numbers, other objects) pass unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from .config import project_table as load_config
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

_SEP = r"[_\-. ]?"
SECRET_KEYS = re.compile(
    r"(?i)^(?!.*(?:next|page|continuation|max|min|num|eos|bos|pad|unk|sep|cls|mask)"
    rf"{_SEP}token$)"
    rf".*(?:password|passwd|passphrase|secrets?|token|api{_SEP}key|secret{_SEP}key|"
    rf"private{_SEP}key|access{_SEP}key|credentials?|authorization|cookie)$"
)
"""Keys whose values are secrets, whatever they look like: the keyword ends the key, after any
prefix (``PGPASSWORD``, ``X-Api-Key``, ``clientSecret``, ``githubToken``), so ``tokens``,
``token_count``, ``max_tokens`` or ``passwords_checked`` do not match; pagination cursors
(``nextPageToken``) and tokenizer settings (``eos_token``, ``max_token``) are not secrets."""

_MARK = "[REDACTED:field]"


_LEAVES = frozenset({int, float, bool, type(None), bytes, bytearray, complex})
"""Types that hold no text: returned as they are, without a look inside."""


def _hides(value: Any) -> bool:
    """Whether a value under a secret-named key can hold a secret (not None, a flag or empty)."""
    if value is None or type(value) is bool:
        return False
    try:
        return len(value) > 0
    except TypeError:
        return True


def _rebuilt(value: Any, items: list[Any]) -> Any:
    """``value`` (list, tuple, set, frozenset) itself if no item changed, else a new one."""
    if all(a is b for a, b in zip(items, value, strict=True)):
        return value
    return items if type(value) is list else type(value)(items)


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
        if t is list or t is tuple or t is set or t is frozenset:
            return _rebuilt(value, [self._walk(x, depth + 1) for x in value])
        if getattr(t, "__pydantic_fields__", None) is not None:  # a pydantic v2 model
            return self._model(value, depth)
        if dataclasses.is_dataclass(t):  # slots=True too: no __dict__, fields are what serde keeps
            return self._dataclass(value, depth)
        return value

    def _attrs(self, attrs: Mapping[Any, Any], depth: int, mark: bool) -> dict[Any, Any]:
        """The changed attributes of an object (``mark``: it sits under a secret key)."""
        if not mark:
            return self._changes(attrs, depth, whole=False)
        return {k: c for k, v in attrs.items() if (c := self._mark(v, depth + 1)) is not v}

    def _model(self, value: Any, depth: int, mark: bool = False) -> Any:
        """A pydantic model: its declared fields and its ``extra="allow"`` ones, in a copy."""
        fields = getattr(value, "__dict__", None)
        changed = self._attrs(fields, depth, mark) if type(fields) is dict else {}
        extra: Any = getattr(value, "__pydantic_extra__", None)
        extra_changed = self._attrs(extra, depth, mark) if type(extra) is dict else {}
        if not changed and not extra_changed:
            return value
        out = value.model_copy(update=changed)  # shallow: a new __dict__, the caller's is kept
        if extra_changed:
            object.__setattr__(out, "__pydantic_extra__", {**extra, **extra_changed})
        return out

    def _dataclass(self, value: Any, depth: int, mark: bool = False) -> Any:
        """A dataclass (``slots=True`` too: no ``__dict__``): its fields, what serde stores."""
        unset = object()
        fields = {f.name: getattr(value, f.name, unset) for f in dataclasses.fields(value)}
        changed = self._attrs({k: v for k, v in fields.items() if v is not unset}, depth, mark)
        if not changed:
            return value
        out = copy.copy(value)
        for k, v in changed.items():
            object.__setattr__(out, k, v)  # frozen dataclasses too
        return out

    def _changes(
        self, fields: Mapping[Any, Any], depth: int, *, whole: bool = True
    ) -> dict[Any, Any]:
        """The scrubbed values of the fields that changed (dict items, model attributes).

        A value under a secret-named key is replaced: a string by the marker; in a dict
        (``whole``) any other value too (a list, a dict, a number), except under a bare
        ``token`` (LLM APIs use it for text tokens: ``{"token": {"id": 1, "text": "Hi"}}``);
        in a model's or dataclass's attribute, every string inside it, keeping its shape (the
        model must still validate when the checkpoint is restored). None, flags and empty
        values are kept: they hide nothing."""
        out: dict[Any, Any] = {}
        for k, v in fields.items():
            if not (self.keys and type(k) is str and _hides(v) and self._secret_key(k)):
                conv = self._walk(v, depth + 1)
            elif type(v) is str:
                if v.startswith("[REDACTED:"):
                    continue
                conv = _MARK
                self.counts["field"] += 1
            elif not whole:
                conv = self._mark(v, depth + 1)
            elif k.lower() == "token":
                conv = self._walk(v, depth + 1)
            else:
                conv = _MARK
                self.counts["field"] += 1
            if conv is not v:
                out[k] = conv
        return out

    def _mark(self, value: Any, depth: int) -> Any:
        """``value`` with every non-empty string inside it replaced by the marker."""
        t = type(value)
        if t is str:
            if not value or value.startswith("[REDACTED:"):
                return value
            self.counts["field"] += 1
            return _MARK
        if t in _LEAVES or depth > 200:
            return value
        if t is dict:
            changed = {k: c for k, v in value.items() if (c := self._mark(v, depth + 1)) is not v}
            return {**value, **changed} if changed else value
        if t is list or t is tuple or t is set or t is frozenset:
            return _rebuilt(value, [self._mark(x, depth + 1) for x in value])
        if getattr(t, "__pydantic_fields__", None) is not None:
            return self._model(value, depth, mark=True)
        if dataclasses.is_dataclass(t):
            return self._dataclass(value, depth, mark=True)
        return value

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
