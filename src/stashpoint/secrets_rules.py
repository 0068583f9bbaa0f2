"""The rules that find secrets in text, and the scanner that runs them fast.

Three sources, in this order (an earlier rule's replacement is what a later one sees):

1. **Context rules** kept here: what no value pattern can know, because the secret has no
   format of its own: the password of a URL (``postgres://user:PASS@host``), the value of an
   ``Authorization`` header, of a ``curl -u user:PASS``, of an assignment whose name says
   secret (``PGPASSWORD=...`` in an env dump, ``"api_key": "..."`` in a JSON log line); PEM
   private-key blocks, whole; and the formats the maintained set below does not know yet
   (Anthropic, Hugging Face, Google, DigitalOcean, Heroku, Mailgun, npm, current OpenAI and
   Stripe lengths, Slack app tokens, Azure shared access keys).
2. **detect-secrets' value plugins** (PyPI ``detect-secrets``, Yelp's scanner used by
   pre-commit hooks across the industry): every regex plugin it ships (AWS, GitHub, GitLab,
   Slack, Stripe, Twilio, SendGrid, Mailchimp, Discord, Telegram, npm, PyPI, JWTs, Azure
   storage keys, Artifactory, IBM, SoftLayer, Square, Cloudant, basic-auth URLs...) is read
   from the installed package, so an upgrade brings its new rules without a change here. A
   plugin's own ``analyze_string`` confirms each match (the JWT plugin decodes the token).
   Left out: its keyword and high-entropy plugins (they flag git hashes, digests and ordinary
   identifiers; the context rules above cover named values) and its private-key plugin (it
   sees the armour line only; the PEM rule takes the whole block).
3. The user's patterns.

Speed: a rule runs only when its *requirements* hold, derived from the regex itself by
Python's regex parser, never kept by hand: a literal of which one must occur (``ghp_`` ...,
tested with C-speed substring search, case-folded for case-insensitive rules) and a run of
non-blank characters as long as the rule's longest fixed-width part. One combined search of
every literal gates a string first; most strings (ordinary messages) fail it and cost one
pass. detect-secrets costs ~120 ms to import (it imports ``requests``), so it is imported on
the first string actually scanned, never at CLI start-up.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CONTEXT_RULES", "Rule", "Scanner", "compile_rule", "detect_secrets_rules"]

try:  # the regex parser: how requirements are derived from any rule
    from re import _constants as _C  # type: ignore[attr-defined]
    from re import _parser as _P  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _C
    import sre_parse as _P

CONTEXT_RULES: dict[str, str] = {
    # Order matters: the more specific first (sk-ant- is also sk-; a URL's password before
    # any token rule sees "user:PASS@").
    "private_key": (
        r"-----BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"(?:-----END[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----|\Z)"
    ),
    "url_password": (
        r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@\"'<>\[\]]*:"
        r"(?P<secret>(?!\[REDACTED|\*+@)[^\s/?#@\"'<>]+)@"
    ),
    "bearer": r"\b[Bb]earer\s+(?P<secret>(?!\[REDACTED)[A-Za-z0-9\-._~+/]{16,}=*)",
    "authorization": (
        r"(?i)\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?"
        r"(?:(?:basic|bearer|token|digest|negotiate|ntlm|apikey|api-key|sso-key)\s+"
        r"(?P<secret>(?!\[REDACTED|[$<{%])[^\s\"',;]{4,})"
        r"|(?P<bare>(?!\[REDACTED)[A-Za-z0-9._~+/=\-]{12,}))"
    ),
    "cookie": r"(?im)^[ \t]*(?:set-)?cookie:[ \t]*(?P<secret>(?!\[REDACTED)[^\r\n]+)",
    "curl_user": r"(?:^|\s)(?:-u|--user)\s+[\"']?[^\s:\"']+:(?P<secret>(?!\[REDACTED)[^\s\"']+)",
    "anthropic": r"\bsk-ant-[A-Za-z0-9_\-]{20,}",
    "openai": r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}",
    "stripe": r"\b(?:sk|rk|whsec)_(?:live_|test_)?[A-Za-z0-9]{24,}",
    "aws": r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ABIA|ACCA)[0-9A-Z]{16}\b",
    "aws_secret": r"(?i:aws_?secret_?access_?key)\W{0,3}(?P<secret>[A-Za-z0-9/+=]{40})\b",
    "github": r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
    "slack": r"\bx(?:ox[abposre]|app)-[A-Za-z0-9\-]{10,}",
    "google": r"\bAIza[0-9A-Za-z_\-]{35}",
    "huggingface": r"\bhf_[A-Za-z0-9]{30,}",
    "digitalocean": r"\bdo[opr]_v1_[a-f0-9]{64}\b",
    "heroku": r"\bHRKU-[A-Za-z0-9_\-]{30,}",
    "mailgun": r"\bkey-[0-9a-f]{32}\b|\b[0-9a-f]{32}-[0-9a-f]{8}-[0-9a-f]{8}\b",
    "npm": r"\bnpm_[A-Za-z0-9]{36}\b",
    "shopify": r"\bshp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}\b",
    "pypi": r"\bpypi-[A-Za-z0-9_\-]{50,}",
    "azure": r"(?i:\b(?:AccountKey|SharedAccessKey))=(?P<secret>[A-Za-z0-9+/=]{20,})",
    "jwt": r"\beyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{10,}",
}
"""Name -> regex of the rules kept here (see the module docstring for why each is here)."""

_SKIPPED_PLUGINS = frozenset(
    {
        "KeywordDetector",  # any value near "key", "pass"...: the named-value rules do that
        "Base64HighEntropyString",  # git hashes, digests, base64 images
        "HexHighEntropyString",
        "IPPublicDetector",  # an address is not a credential
        "PrivateKeyDetector",  # the armour line only; CONTEXT_RULES takes the whole block
    }
)


@dataclass(frozen=True)
class Rule:
    """One compiled rule and what must hold in a text for it to possibly match."""

    name: str
    regex: re.Pattern[str]
    triggers: tuple[str, ...]
    """One of these must occur in the text (empty: no literal is required)."""
    fold: bool
    """The triggers are lower-cased: test them against the lower-cased text."""
    run: int
    """A run of at least this many non-blank characters must occur."""
    confirm: Callable[[str], bool] | None = None
    """A second opinion on a match's text (the detect-secrets plugin's own)."""


# -- requirements derived from a regex -------------------------------------------------------

_REPEATS = tuple(
    getattr(_C, n) for n in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") if hasattr(_C, n)
)
_NON_BLANK_CATEGORIES = frozenset(
    getattr(_C, n) for n in ("CATEGORY_DIGIT", "CATEGORY_WORD", "CATEGORY_NOT_SPACE")
)


def _non_blank_class(items: Any) -> bool:
    """Whether a character class ``[...]`` (parsed) holds no whitespace: then a repeat of it is
    a run of non-blank characters."""
    for op, av in items:
        if op is _C.LITERAL:
            if chr(av).isspace():
                return False
        elif op is _C.RANGE:
            lo, hi = av
            if any(chr(c).isspace() for c in range(lo, min(hi, 0x3000) + 1)):
                return False
        elif op is _C.CATEGORY:
            if av not in _NON_BLANK_CATEGORIES:
                return False
        else:  # NEGATE and anything else: could be whitespace
            return False
    return True


def _requirements(sub: Any, fold: bool) -> tuple[set[str] | None, int]:
    """(literals of which one must occur, longest run of non-blank characters that must
    occur) for a parsed sequence; the literals are lower-cased where matching folds case."""
    options: list[set[str]] = []
    run = 0
    literal = ""

    def flush() -> None:
        nonlocal literal
        if literal:
            options.append({literal.lower() if fold else literal})
        literal = ""

    for op, av in sub:
        if op is _C.LITERAL:
            literal += chr(av)
            continue
        flush()
        if op is _C.SUBPATTERN:
            _group, add, delete, inner = av
            lits, r = _requirements(inner, (fold or bool(add & re.I)) and not delete & re.I)
            if lits:
                options.append(lits)
            run = max(run, r)
        elif op is _C.BRANCH:
            each = [_requirements(b, fold) for b in av[1]]
            if all(lits for lits, _ in each):
                options.append(set().union(*(lits for lits, _ in each if lits)))
            run = max(run, min(r for _, r in each))
        elif op in _REPEATS:
            lo, _hi, inner = av
            if lo >= 1:
                lits, r = _requirements(inner, fold)
                if lits:
                    options.append(lits)
                run = max(run, r)
                if len(inner) == 1 and inner[0][0] is _C.IN and _non_blank_class(inner[0][1]):
                    run = max(run, lo)
    flush()
    options = [o for o in options if "" not in o]
    if not options:
        return None, run
    return max(options, key=lambda o: (min(map(len, o)), -len(o))), run


def compile_rule(
    name: str, regex: re.Pattern[str], confirm: Callable[[str], bool] | None = None
) -> Rule:
    """A :class:`Rule` with the requirements of ``regex`` derived from its parse."""
    fold = bool(regex.flags & re.I)
    try:
        lits, run = _requirements(_P.parse(regex.pattern, regex.flags), fold)
    except Exception:  # a parser we do not know (another Python): run the rule always
        lits, run = None, 0
    if lits is not None and any(not t.isascii() for t in lits):
        lits = None  # lower() of non-ASCII may not match what IGNORECASE matches
    return Rule(name, regex, tuple(sorted(lits or ())), fold and bool(lits), run, confirm)


# -- detect-secrets --------------------------------------------------------------------------


def _slug(secret_type: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", secret_type.lower()).strip("_")


def detect_secrets_rules() -> list[Rule]:
    """A rule for each regex of each value plugin detect-secrets ships (imported here)."""
    try:
        plugins = importlib.import_module("detect_secrets.plugins")
        base = importlib.import_module("detect_secrets.plugins.base")
    except ImportError as exc:
        warnings.warn(
            f"detect-secrets is not importable ({exc}): secrets are redacted with stashpoint's "
            "own rules only; `pip install detect-secrets` restores the full rule set",
            stacklevel=2,
        )
        return []
    detector: type = base.RegexBasedDetector
    out: list[Rule] = []
    for info in sorted(pkgutil.iter_modules(plugins.__path__), key=lambda m: m.name):
        if info.name == "base":
            continue
        try:
            module = importlib.import_module(f"{plugins.__name__}.{info.name}")
        except Exception:  # a plugin with a missing optional dependency
            continue
        for cls in vars(module).values():
            if not (
                isinstance(cls, type)
                and issubclass(cls, detector)
                and cls.__module__ == module.__name__
                and cls.__name__ not in _SKIPPED_PLUGINS
                and not getattr(cls, "__abstractmethods__", None)
            ):
                continue
            try:
                plugin: Any = cls()
            except Exception:
                continue
            confirm = _confirmer(plugin)
            for regex in plugin.denylist:
                out.append(compile_rule(_slug(plugin.secret_type), regex, confirm))
    return out


def _confirmer(plugin: Any) -> Callable[[str], bool]:
    def confirm(text: str) -> bool:
        try:
            return any(True for _ in plugin.analyze_string(text))
        except Exception:
            return True  # a plugin that fails on a match: redact rather than leak

    return confirm


# -- the scanner -----------------------------------------------------------------------------


class Scanner:
    """Runs rules over texts: ``[REDACTED:<name>]`` for each match (or for its ``secret``
    group: the part that is secret, the rest kept as context)."""

    def __init__(
        self,
        extra: Mapping[str, str] | None = None,
        *,
        defaults: bool = True,
        on_match: Callable[[str], None] | None = None,
        assignments: Callable[[str], str] | None = None,
    ) -> None:
        self._extra = dict(extra or {})
        self._defaults = defaults
        self._on_match = on_match or (lambda _name: None)
        self._assignments = assignments
        self._rules: list[Rule] | None = None
        self._gate: re.Pattern[str] | None = None
        self._ungated: list[Rule] = []
        self._min_len = 0
        for rx in self._extra.values():  # refuse a bad pattern at construction
            re.compile(rx)

    @property
    def rules(self) -> list[Rule]:
        """Every rule in order; compiled (detect-secrets imported) on first use."""
        if self._rules is None:
            self._load()
        assert self._rules is not None
        return self._rules

    def _load(self) -> None:
        rules: list[Rule] = []
        if self._defaults:
            rules += [compile_rule(n, re.compile(rx)) for n, rx in CONTEXT_RULES.items()]
            rules += detect_secrets_rules()
        rules += [compile_rule(n, re.compile(rx)) for n, rx in self._extra.items()]
        gated = [r for r in rules if r.triggers]
        self._ungated = [r for r in rules if not r.triggers]
        lits = sorted({t for r in gated for t in r.triggers}, key=len, reverse=True)
        # (?i) for all: a superset gate; each rule then tests its own triggers exactly.
        self._gate = re.compile("(?i:" + "|".join(map(re.escape, lits)) + ")") if lits else None
        widths = [r.regex.pattern for r in rules]
        self._min_len = min((_min_width(p) for p in widths), default=0)
        self._rules = rules

    def scrub(self, text: str) -> str:
        """``text`` with every secret replaced."""
        rules = self._rules if self._rules is not None else self.rules
        if len(text) < self._min_len:
            return self._assignments(text) if self._assignments else text
        gate = self._gate
        if (gate is None or gate.search(text) is None) and not self._ungated:
            return self._assignments(text) if self._assignments else text
        low: str | None = None
        longest = -1
        for rule in rules:
            if rule.triggers:
                if rule.fold:
                    if low is None:
                        low = text.lower()
                    hay = low
                else:
                    hay = text
                for t in rule.triggers:  # a plain loop: faster than any() over a generator
                    if t in hay:
                        break
                else:
                    continue
            if rule.run:
                if longest < 0:
                    longest = max(map(len, text.split()), default=0)
                if longest < rule.run:
                    continue
            if rule.regex.search(text) is None:
                continue
            new = rule.regex.sub(self._replacer(rule), text)
            if new != text:
                text, low, longest = new, None, -1
        return self._assignments(text) if self._assignments else text

    def _replacer(self, rule: Rule) -> Callable[[re.Match[str]], str]:
        marker = f"[REDACTED:{rule.name}]"
        groups = rule.regex.groupindex
        named = [g for g in ("secret", "bare") if g in groups]

        def sub(m: re.Match[str]) -> str:
            whole = m.group(0)
            if whole.startswith("[REDACTED:"):
                return whole
            s, e = _secret_span(m, named)
            if rule.confirm is not None and not rule.confirm(whole):
                return whole
            part = whole[s - m.start() : e - m.start()]
            if not part or part.startswith("[REDACTED:"):
                return whole
            self._on_match(rule.name)
            return whole[: s - m.start()] + marker + whole[e - m.start() :]

        return sub


_DELIMS = " \t\r\n\"'=:`"


def _secret_span(m: re.Match[str], named: list[str]) -> tuple[int, int]:
    """The part of a match to replace: a ``secret`` (or ``bare``) group when the rule names
    one; else a capture group that holds most of the match (detect-secrets' convention for
    "key = (value)" rules); else the whole match less delimiters it consumed as context."""
    for g in named:
        if m.group(g) is not None:
            return m.span(g)
    s, e = m.span()
    spans = [m.span(i) for i in range(1, (m.re.groups or 0) + 1) if m.group(i)]
    if spans:
        gs, ge = min(a for a, _ in spans), max(b for _, b in spans)
        if gs > s and (ge - gs) * 2 >= e - s:
            return gs, ge
    text = m.string
    while s < e and text[s] in _DELIMS:
        s += 1
    while e > s and text[e - 1] in _DELIMS:
        e -= 1
    return s, e


def _min_width(pattern: str) -> int:
    try:
        lo, _hi = _P.parse(pattern).getwidth()
        return int(lo)
    except Exception:
        return 0


def names(rules: Iterable[Rule]) -> list[str]:
    """The distinct rule names, in order (what ``[REDACTED:<name>]`` can say)."""
    return list(dict.fromkeys(r.name for r in rules))
