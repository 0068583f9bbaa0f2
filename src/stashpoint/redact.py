"""Redaction: scrub secrets from state before it is persisted.

Agents copy credentials into their state more often than anyone intends: a tool echoes its
environment, a user pastes a key into the chat, an HTTP call's headers land in a message. A
checkpoint keeps that forever, in every backup and bundle. So :class:`Session` runs a redactor
over the state, the conversation and the checkpoint's message and metadata *before* encoding
anything, and replaces each secret with a marker such as ``[REDACTED:openai]``.

On by default. Why: a false positive costs one string in a checkpoint (the agent re-reads a
credential from its environment, where it belongs), while a false negative costs a leaked key
in every copy of the store. What finds secrets in text is :mod:`stashpoint.secrets_rules`:
stashpoint's context rules (a URL's password, ``Authorization`` headers, PEM blocks, providers
the maintained set lacks), then every value plugin of detect-secrets, then the user's
patterns; plus assignments to secret-named keys in free text (``PGPASSWORD=...`` in an env
dump, ``"api_key": "..."`` in a logged JSON line), code excepted (``token =
os.environ[...]``). Turn it off with ``Session(redact=False)`` or ``[tool.stashpoint] redact =
false``; add patterns with ``redact={"name": r"regex"}`` or ``[tool.stashpoint]
redact_patterns = {name = "regex"}`` (a ``(?P<secret>...)`` group limits the replacement to that
part), key names with ``Redactor(extra_keys=[...])`` or ``redact_keys = ["pin"]``; pass any
callable ``value -> value`` to redact your own way.

What is walked: str, dict (a key that is itself a secret is replaced too), list, tuple, set,
frozenset, and the fields of dataclasses (``slots=True`` too) and pydantic models,
``extra="allow"`` fields included (LangChain messages are pydantic models): a changed one is a
copy (``model_copy``), never the caller's object mutated. A value under a key named like
password / secret / token / api_key (``PGPASSWORD``, ``X-Api-Key``, ``clientSecret``, ``pwd``,
``ssh_key`` too; see :data:`SECRET_KEYS`) is replaced whole, a list or dict as well as a
string; in a model's attribute, every string inside it. Other values (bytes, numbers, other
objects) pass unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from .config import project_table as load_config
from .errors import UsageError
from .secrets_rules import CONTEXT_RULES, Scanner

__all__ = [
    "DEFAULT_PATTERNS",
    "SECRET_KEYS",
    "Redactor",
    "RedactorFn",
    "is_secret_key",
    "load_config",
    "make_redactor",
]

DEFAULT_PATTERNS: dict[str, str] = CONTEXT_RULES
"""Name -> regex of the rules stashpoint keeps itself; detect-secrets' plugins run after them
(see :mod:`stashpoint.secrets_rules`)."""

_SEP = r"[_\-. ]?"
_BOUND = r"(?:^|.*[_\-. ])"
_NOT_SECRET_TOKENS = (
    "next|page|continuation|max|min|num|eos|bos|pad|unk|sep|cls|mask|start|end|total|input|"
    "output|prompt|completion|cached|reasoning|special|stop"
)
_KEY_WORDS = (
    r"password|passwd|passphrase|secrets?|token|credentials?|authorization|cookie|sessionid|"
    rf"(?:api|secret|private|access|ssh|signing|encryption|master|client|account|session){_SEP}key"
)
_SHORT_WORDS = "pass|pwd|pw|auth"


def _key_rx(extra: tuple[str, ...] = ()) -> re.Pattern[str]:
    short = "|".join([_SHORT_WORDS, *(re.escape(_normal_key(k)) for k in extra)])
    return re.compile(
        rf"^(?!.*(?:{_NOT_SECRET_TOKENS}){_SEP}token$)"
        rf"(?:.*(?:{_KEY_WORDS})|{_BOUND}(?:{short}))$"
    )


def _normal_key(key: str) -> str:
    """camelCase split with ``_`` and lower-cased: ``githubToken`` -> ``github_token``,
    ``dbPass`` -> ``db_pass``; ``PGPASSWORD`` stays one word."""
    return _CAMEL.sub("_", key).lower()


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")

SECRET_KEYS = _key_rx()
"""Keys whose values are secrets, whatever they look like, matched on the key in lower case
with camelCase split (``githubToken`` -> ``github_token``): a keyword ends the key after any
prefix (``PGPASSWORD``, ``X-Api-Key``, ``clientSecret``, ``ssh_key``, ``sessionid``), or a
short one (``pass``, ``pwd``, ``pw``, ``auth``) is the key or follows a separator
(``DB_PASS``, ``basicAuth``; not ``bypass``, ``oauth``). So ``tokens``, ``token_count``,
``max_tokens``, ``passwords_checked`` or ``primary_key`` do not match; pagination cursors
(``nextPageToken``) and tokenizer settings (``eos_token``, ``max_token``) are not secrets;
``session_id`` (a conversation's id, which frameworks need back) is not ``sessionid`` (Django's
cookie)."""


def is_secret_key(key: str) -> bool:
    """Whether a value under ``key`` is treated as a secret by default."""
    return SECRET_KEYS.match(_normal_key(key)) is not None


# An assignment in free text: an env dump (PGPASSWORD=...), a .env or YAML line, a header
# (X-Api-Key: ...), a JSON log line ("api_key": "..."), a CLI flag (--password=...).
_ASSIGN = re.compile(
    r"(?<![\w.\-])(?P<key>[A-Za-z_][\w.\-]*)[\"']?\]?[ \t]*(?P<op>:=|=>|=|:)[ \t]*"
    r"(?:\"(?P<dq>[^\"\n]*)\"|'(?P<sq>[^'\n]*)'"
    r"|(?P<v>[^\s\"',;&)}\]<>\[{(`%$][^\s\"',;&)}\]<>`]*))"
)
_GATE_WORDS = (
    "pass", "password", "passwd", "passphrase", "pwd", "pw", "secret", "secrets", "token",
    "key", "credential", "credentials", "authorization", "auth", "cookie", "sessionid",
)  # fmt: skip
"""A secret-named key ends with one of these: an ``=`` or ``:`` after none of them is not an
assignment to look at (one ``endswith`` per operator, instead of a regex over the text)."""
_TRAILING = " \t\"']"
_CODE_LIKE = re.compile(r"[A-Za-z_][A-Za-z_.:]*(?:[(\[].*)?")
"""An identifier, a dotted name or a call: code (``token = os.environ[...]``, ``password:
str``, ``f(api_key=api_key)``), not a value."""
_NOT_A_VALUE = frozenset(
    {"none", "null", "nil", "true", "false", "undefined", "basic", "bearer", "digest", "token"}
)

_MARK = "[REDACTED:field]"
_CLEAN_MAX = 4096
"""Longest string remembered as clean. Messages repeat: each checkpoint of a conversation
holds every earlier message again (the same string objects, whose hash Python keeps), so a
message is scanned once, then looked up."""
_CLEAN_BUDGET = 1 << 21
"""Characters the clean strings may hold together (and at most 10,000 of them); past that
the memory is emptied and fills again with what the agent is using now."""


_LEAVES = frozenset({int, float, bool, type(None), bytes, bytearray, complex})
"""Types that hold no text: returned as they are, without a look inside."""


def _hides(value: Any) -> bool:
    """Whether a value under a secret-named key can hold a secret (not None, a flag or empty).

    Asked only after the key is found secret-named (a cached lookup): a number has no
    ``len`` and the exception it raises costs more than the rest of the field's check."""
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
        self,
        extra: Mapping[str, str] | None = None,
        *,
        defaults: bool = True,
        keys: bool = True,
        extra_keys: Iterable[str] = (),
    ) -> None:
        for name, rx in (extra or {}).items():
            try:
                re.compile(rx)
            except re.error as exc:
                raise UsageError(f"redaction pattern {name!r} is not a valid regex: {exc}") from exc
        self.counts: Counter[str] = Counter()
        """Secrets replaced so far, by rule name (the session reads and resets it)."""
        self.keys = keys
        extra_keys = tuple(extra_keys)
        self._keys_rx = _key_rx(extra_keys) if extra_keys else SECRET_KEYS
        last_words = (re.split(r"[_\-. ]", _normal_key(k))[-1] for k in extra_keys)
        self._gate_words = _GATE_WORDS + tuple(w for w in last_words if w)
        self._gate_ends = frozenset(c for w in self._gate_words for c in (w[-1], w[-1].upper()))
        self._key_cache: dict[str, bool] = {}
        self._clean_keys: set[str] = set()
        self._clean: set[str] = set()
        self._clean_size = 0
        self._scanner = Scanner(
            extra,
            defaults=defaults,
            on_match=self._count,
            assignments=self._assignments if keys else None,
        )

    def _count(self, name: str) -> None:
        self.counts[name] += 1

    @property
    def patterns(self) -> list[tuple[str, re.Pattern[str]]]:
        """(name, regex) of every rule, in the order they run (compiles them on first use)."""
        return [(r.name, r.regex) for r in self._scanner.rules]

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
            out = {**value, **changed} if changed else value
            return self._keys_scrubbed(out)
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
        keys, known = self.keys, self._key_cache
        for k, v in fields.items():
            t = type(v)
            if keys and type(k) is str:  # the key's verdict, cached: key names repeat
                secret = known.get(k)
                if secret is None:
                    secret = self._secret_key(k)
            else:
                secret = False
            if not (secret and _hides(v)):
                if t in _LEAVES:  # what _walk returns unchanged, without the call
                    continue
                conv = self.scrub(v) if t is str else self._walk(v, depth + 1)
            elif t is str:
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
            hit = self._keys_rx.match(_normal_key(key)) is not None
            if len(self._key_cache) < 10_000:  # keys repeat (role, content, ...): remember
                self._key_cache[key] = hit
        return hit

    def _keys_scrubbed(self, d: dict[Any, Any]) -> dict[Any, Any]:
        """``d`` with each string key that holds a secret (``{"ghp_...": "repo"}``) replaced;
        two keys that become one are told apart by a suffix (``#2``)."""
        clean = self._clean_keys
        if clean.issuperset(d):  # every key seen clean before (key names repeat): one C call
            return d
        hits: dict[str, str] = {}
        for k in d:
            if type(k) is str and k not in clean:
                new = self.scrub(k)
                if new is k:
                    if len(clean) < 10_000:  # only clean keys are remembered (no secret kept)
                        clean.add(k)
                else:
                    hits[k] = new
        if not hits:
            return d
        out: dict[Any, Any] = {}
        for k, v in d.items():
            if type(k) is str and k in hits:
                new = base = hits[k]
                n = 2
                while new in out or new in d:
                    new, n = f"{base}#{n}", n + 1
                out[new] = v
            else:
                out[k] = v
        return out

    def _assignments(self, text: str) -> str:
        """Values assigned to secret-named keys in free text (env dumps, .env and YAML lines,
        headers, JSON log lines, CLI flags), replaced; code stays (see :data:`_CODE_LIKE`)."""
        words, ends = self._gate_words, self._gate_ends
        for op in "=:":
            i = text.find(op)
            while i >= 0:
                j = i - 1  # the character a key would end with ("step 0:" ends with no word)
                while j >= 0 and text[j] in _TRAILING:
                    j -= 1
                if (
                    j >= 0
                    and (text[j] in ends or not text[j].isascii())  # lower() may map it
                    and text[max(0, i - 24) : i].rstrip(_TRAILING).lower().endswith(words)
                ):
                    return self._assigned(text)
                i = text.find(op, i + 1)
        return text

    def _assigned(self, text: str) -> str:
        """Each assignment replaced; after one whose key is not secret the search goes on
        from its operator (``tool: PGPASSWORD=...``: the value of ``tool`` holds another)."""
        out: list[str] = []
        pos = done = 0
        while (m := _ASSIGN.search(text, pos)) is not None:
            if not self._secret_key(m.group("key").lstrip("-")):
                pos = m.end("op")
                continue
            out += [text[done : m.start()], self._assignment(m)]
            pos = done = m.end()
        return "".join([*out, text[done:]]) if out else text

    def _assignment(self, m: re.Match[str]) -> str:
        key = m.group("key")
        quoted = m.group("v") is None
        value = m.group("dq") if m.group("dq") is not None else m.group("sq")
        if value is None:
            value = m.group("v")
        low = value.lower()
        if (
            not value
            or value.startswith(("[REDACTED", "$", "%", "{{", "<", "***"))
            or low in _NOT_A_VALUE
            or (not quoted and value.isdigit() and len(value) < 6)
            or (
                not quoted
                and not (key.isupper() and "=" in m.group(0).split()[0])  # an env dump line
                and _CODE_LIKE.fullmatch(value) is not None
            )
            or (key.lower() == "token" and (len(value) < 8 or " " in value))  # an LLM's token
        ):
            return m.group(0)
        name = "dq" if m.group("dq") is not None else "sq" if m.group("sq") is not None else "v"
        s, e = m.span(name)
        self.counts["field"] += 1
        whole = m.group(0)
        return whole[: s - m.start()] + _MARK + whole[e - m.start() :]

    def scrub(self, text: str) -> str:
        """One string with every secret replaced (the same object when none was found).

        Strings found clean are remembered (roles, names, enum-like values, and each
        message, which every later checkpoint of the conversation holds again): looked up
        instead of scanned again. Only clean ones: no secret is kept in memory."""
        n = len(text)
        if n <= _CLEAN_MAX and text in self._clean:
            return text
        out = self._scanner.scrub(text)
        if out == text:
            if n <= _CLEAN_MAX:
                if self._clean_size + n > _CLEAN_BUDGET or len(self._clean) >= 10_000:
                    self._clean.clear()
                    self._clean_size = 0
                self._clean.add(text)
                self._clean_size += n
            return text
        return out


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
    keys = config.get("redact_keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
        raise UsageError("[tool.stashpoint] redact_keys must be a list of key names")
    return Redactor(extra, extra_keys=keys)
