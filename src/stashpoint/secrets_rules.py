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

import bisect
import functools
import hashlib
import importlib
import importlib.util
import json
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "CONTEXT_RULES",
    "Rule",
    "Scanner",
    "compile_rule",
    "default_rules",
    "load_rules",
]

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
    "cookie": r"(?im)^[ \t]*(?:set-)?cookie:[ \t]*(?P<secret>(?!\[REDACTED)\S[^\r\n]*)",
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


class Rule(NamedTuple):
    """One rule and what must hold in a text for it to possibly match."""

    name: str
    pattern: str
    flags: int
    triggers: tuple[str, ...]
    """One of these must occur in the text (empty: no literal is required)."""
    fold: bool
    """The triggers are lower-cased: test them against the lower-cased text."""
    run: int
    """A run of at least this many non-blank characters must occur."""
    width: int
    """The shortest text the pattern can match."""
    plugin: str | None = None
    """``module:Class`` of the detect-secrets plugin whose ``analyze_string`` gives a second
    opinion on a match (the JWT plugin decodes the token); imported on the first match."""

    @property
    def regex(self) -> re.Pattern[str]:
        """Compiled on first use: most rules never see a text holding their triggers."""
        return _compile(self.pattern, self.flags)


_compile = functools.lru_cache(maxsize=None)(re.compile)


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


_MAX_SET = 64
"""Largest set of alternative literals kept as a trigger (``gh[pousr]_`` is 5)."""
_ZERO_WIDTH = tuple(getattr(_C, n) for n in ("AT", "ASSERT", "ASSERT_NOT") if hasattr(_C, n))


def _product(a: set[str], b: set[str]) -> set[str] | None:
    if len(a) * len(b) > _MAX_SET:
        return None
    return {x + y for x in a for y in b}


def _class_chars(items: Any) -> set[str] | None:
    """The characters of a small class (``[pousr]``, ``[0-9]``, ``\\d``), else None."""
    out: set[str] = set()
    for op, av in items:
        if op is _C.LITERAL:
            out.add(chr(av))
        elif op is _C.RANGE and av[1] - av[0] < 16:
            out.update(chr(c) for c in range(av[0], av[1] + 1))
        elif op is _C.CATEGORY and av is getattr(_C, "CATEGORY_DIGIT", None):
            out.update("0123456789")
        else:
            return None
    return out if len(out) <= 16 else None


def _finite(sub: Any) -> set[str] | None:
    """Every string a parsed sequence can match, when they are few; else None."""
    cur: set[str] | None = {""}
    for op, av in sub:
        if cur is None:
            return None
        if op is _C.LITERAL:
            cur = {x + chr(av) for x in cur}
        elif op is _C.IN:
            chars = _class_chars(av)
            cur = _product(cur, chars) if chars is not None else None
        elif op is _C.SUBPATTERN:
            inner = _finite(av[3])
            cur = _product(cur, inner) if inner is not None else None
        elif op is _C.BRANCH:
            alts = [_finite(b) for b in av[1]]
            if any(a is None for a in alts):
                return None
            cur = _product(cur, set().union(*(a for a in alts if a is not None)))
        elif op in _REPEATS and av[0] == 0 and av[1] == 1:
            inner = _finite(av[2])
            cur = _product(cur, inner | {""}) if inner is not None else None
        elif op in _ZERO_WIDTH:
            continue
        else:
            return None
    return cur


def _leading(sub: Any) -> set[str]:
    """Literals one of which every match of a parsed sequence starts with ({""}: none); at
    most 16 of them (a longer product stops growing: ``xoxa-``, not ``xoxa-0``...)."""
    cur: set[str] = {""}
    for op, av in sub:
        if op in _ZERO_WIDTH:
            continue
        item = _finite([(op, av)])
        if item is None:
            if op in _REPEATS and av[0] >= 1:
                nxt = _product(cur, _leading(av[2]))
                return nxt if nxt is not None and len(nxt) <= 16 else cur
            if op is _C.SUBPATTERN:
                nxt = _product(cur, _leading(av[3]))
                return nxt if nxt is not None and len(nxt) <= 16 else cur
            if op is _C.BRANCH:
                alts = [_leading(b) for b in av[1]]
                if all("" not in a for a in alts):
                    nxt = _product(cur, set().union(*alts))
                    return nxt if nxt is not None and len(nxt) <= 16 else cur
            return cur
        nxt = _product(cur, item)
        if nxt is None or len(nxt) > 16:
            return cur
        cur = nxt
    return cur


def _requirements(sub: Any, fold: bool) -> tuple[set[str] | None, int]:
    """(literals of which one must occur, longest run of non-blank characters that must
    occur) for a parsed sequence; the literals are lower-cased where matching folds case.

    Literals are followed through small alternatives (``gh[pousr]_``, ``xox(?:a|b)-``) so a
    trigger is as long, hence as rare in ordinary text, as the pattern allows."""
    options: list[set[str]] = []
    run = 0
    for i, (op, av) in enumerate(sub):
        lead = _leading(sub[i:])
        if "" not in lead:
            options.append(lead)
        if op in _REPEATS and av[0] >= 1 and i + 1 < len(sub):
            last = _finite(av[2])  # the last repetition's character, then what follows
            after = _leading(sub[i + 1 :])
            tail = _product(last, after) if last is not None and "" not in after else None
            if tail is not None and "" not in tail:
                options.append(tail)
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
    if fold:
        options = [{o.lower() for o in opt} for opt in options]
    options = [_minimal(o) for o in options if "" not in o]
    if not options:
        return None, run
    return max(options, key=lambda o: (len(o) <= 16, min(min(map(len, o)), 5), -len(o))), run


def _minimal(lits: set[str]) -> set[str]:
    """``lits`` less those that contain another (``sk_`` occurs wherever ``sk_live_`` does)."""
    return {t for t in lits if not any(u != t and u in t for u in lits)}


_SCOPED_I = re.compile(r"\(\?[a-zA-Z]*i")


def compile_rule(name: str, regex: re.Pattern[str], plugin: str | None = None) -> Rule:
    """A :class:`Rule` with the requirements of ``regex`` derived from its parse."""
    # A scoped (?i:...) folds case too: then every trigger is tested case-folded (weaker,
    # still a condition every match meets).
    fold = bool(regex.flags & re.I) or _SCOPED_I.search(regex.pattern) is not None
    try:
        parsed = _P.parse(regex.pattern, regex.flags)
        lits, run = _requirements(parsed, fold)
        width = int(parsed.getwidth()[0])
    except Exception:  # a parser we do not know (another Python): run the rule always
        lits, run, width = None, 0, 0
    if lits is not None and any(not t.isascii() for t in lits):
        lits = None  # lower() of non-ASCII may not match what IGNORECASE matches
    triggers = tuple(sorted(lits or ()))
    return Rule(name, regex.pattern, regex.flags, triggers, fold and bool(lits), run, width, plugin)


# -- detect-secrets --------------------------------------------------------------------------


def _slug(secret_type: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", secret_type.lower()).strip("_")


def load_rules() -> list[Rule]:
    """The context rules, then a rule for each regex of each value plugin detect-secrets
    ships.

    Importing detect-secrets costs ~0.2 s (it imports ``requests``) and deriving the rules
    ~0.1 s, too much for each CLI command that writes a checkpoint: the rules derived from
    the detect-secrets release this stashpoint was built against ship in the package
    (``secret_rules.json``, written by ``tools/secret_rules.py`` and checked by the tests).
    With another release installed they are derived again in memory, once per process;
    nothing is written anywhere. detect-secrets itself is imported only when one of its
    rules matches (for the plugin's second opinion)."""
    installed = _detect_secrets_version()
    shipped = shipped_rules()
    if shipped is not None and shipped[1] == _context_digest():
        own = [r for r in shipped[2] if r.plugin is None]
    else:  # the context rules changed since the file was written: derive them (~0.15 s)
        own = [compile_rule(n, re.compile(rx)) for n, rx in CONTEXT_RULES.items()]
    if installed is None:
        warnings.warn(
            "detect-secrets is not installed: secrets are redacted with stashpoint's own rules "
            "only; `pip install detect-secrets` restores the full rule set",
            stacklevel=2,
        )
        return own
    if shipped is not None and shipped[0] == installed:
        return own + [r for r in shipped[2] if r.plugin is not None]
    return own + _derive_detect_secrets_rules()


def _context_digest() -> str:
    """Identifies the context rules a shipped file was derived from."""
    return hashlib.sha256(json.dumps(CONTEXT_RULES, sort_keys=True).encode()).hexdigest()[:16]


def _detect_secrets_version() -> str | None:
    """The installed detect-secrets' version, read from its ``__version__.py`` without
    importing it or ``importlib.metadata`` (together ~0.25 s: a CLI command's budget)."""
    spec = importlib.util.find_spec("detect_secrets")
    if spec is None or not spec.submodule_search_locations:
        return None
    where = Path(next(iter(spec.submodule_search_locations))) / "__version__.py"
    try:
        found = re.search(r"VERSION\s*=\s*['\"]([^'\"]+)", where.read_text(encoding="utf-8"))
    except OSError:
        return None
    return found.group(1) if found else "unknown"


SHIPPED = Path(__file__).with_name("secret_rules.json")
"""The default rules as derived at build time (deriving them from their regexes costs ~0.3 s):
``{"detect_secrets": version, "context": digest of the context rules, "rules": [...]}``."""


def shipped_rules() -> tuple[str, str, list[Rule]] | None:
    """(detect-secrets version, context digest, rules) from :data:`SHIPPED`, if readable."""
    try:
        doc = json.loads(SHIPPED.read_text(encoding="utf-8"))
        rules = [Rule(**{**row, "triggers": tuple(row["triggers"])}) for row in doc["rules"]]
        return str(doc["detect_secrets"]), str(doc["context"]), rules
    except (OSError, ValueError, TypeError, KeyError):
        return None


def derived_rules_document() -> str:
    """What :data:`SHIPPED` should hold for these context rules and the installed
    detect-secrets."""
    own = [compile_rule(n, re.compile(rx)) for n, rx in CONTEXT_RULES.items()]
    rows = [r._asdict() for r in own + _derive_detect_secrets_rules()]
    doc = {"detect_secrets": _detect_secrets_version(), "context": _context_digest()}
    return json.dumps({**doc, "rules": rows}, indent=1) + "\n"


def _derive_detect_secrets_rules() -> list[Rule]:
    try:
        plugins = importlib.import_module("detect_secrets.plugins")
        base = importlib.import_module("detect_secrets.plugins.base")
    except Exception as exc:
        warnings.warn(
            f"detect-secrets is not importable ({exc}): secrets are redacted with stashpoint's "
            "own rules only",
            stacklevel=3,
        )
        return []
    import pkgutil  # here: only a rules derivation lists detect-secrets' plugins (CLI start-up)

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
            ref = f"{module.__name__}:{cls.__name__}"
            for regex in plugin.denylist:
                out.append(compile_rule(_slug(plugin.secret_type), regex, ref))
    return out


@functools.cache
def _plugin(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)()


def _confirmed(ref: str, text: str) -> bool:
    """The plugin's own verdict on a match (a plugin that fails: redact rather than leak)."""
    try:
        return any(True for _ in _plugin(ref).analyze_string(text))
    except Exception:
        return True


@functools.lru_cache(maxsize=1)
def default_rules() -> tuple[Rule, ...]:
    """The context rules, then detect-secrets' (once per process: every session's redactor
    shares them)."""
    return tuple(load_rules())


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
        gated: bool = True,
    ) -> None:
        self._extra = dict(extra or {})
        self._gated = gated
        """False: every rule runs on every text, no requirement checked (what the gated scan
        must equal: the tests compare them)."""
        self._defaults = defaults
        self._on_match = on_match or (lambda _name: None)
        self._assignments = assignments
        self._rules: list[Rule] | None = None
        self._runs: list[int] = []
        self._probes: list[tuple[int, bytes]] = []
        self._indexes: list[_Index] = []
        self._ungated: frozenset[int] = frozenset()
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
            rules += default_rules()
        rules += [compile_rule(n, re.compile(rx)) for n, rx in self._extra.items()]
        # Each trigger is filed under its rarest character, then under the rarest pair of
        # characters around it: a text is tested for those few characters (``c in text``, C
        # speed), then for the pairs filed under the ones it holds, then for the triggers
        # filed under the pairs it holds. Ordinary prose holds few of them (no "_", "-",
        # capitals...), so a string costs a few dozen C-speed tests, not one per rule.
        self._runs, self._indexes, self._ungated, self._min_len = _plan(tuple(rules))
        self._probes = [(n, b"x" * n) for n in self._runs if n >= _SHORT_RUN]
        self._rules = rules

    def scrub(self, text: str) -> str:
        """``text`` with every secret replaced."""
        rules = self._rules if self._rules is not None else self.rules
        if not self._gated:
            for rule in rules:
                text = rule.regex.sub(self._replacer(rule), text)
        elif len(text) >= self._min_len:
            text = self._scan(text, rules)
        return self._assignments(text) if self._assignments else text

    def _scan(self, text: str, rules: list[Rule]) -> str:
        longest = self._longest_run(text)
        k = bisect.bisect_right(self._runs, longest) - 1
        low = text.lower()
        index = self._indexes[k]
        cased = low != text  # no capital letter: the buckets of capitals cannot hit
        active = set(self._ungated)
        for c, fold, upper, pairs in index:
            if upper and not cased:
                continue
            hay = low if fold else text
            if c in hay:
                for pair, triggers in pairs:
                    if pair in hay:
                        for t, i in triggers:
                            if t in hay:
                                active.add(i)
        if not active:
            return text
        for i in sorted(active):
            rule = rules[i]
            if rule.run > longest:  # (an ungated rule; or the text changed and shrank)
                continue
            if rule.regex.search(text) is None:
                continue
            new = rule.regex.sub(self._replacer(rule), text)
            if new != text:
                text = new
        return text

    def _longest_run(self, text: str) -> int:
        """The longest run of non-blank characters in ``text``, as far as the rules' run
        lengths tell them apart: for an ASCII text, ``_SHORT_RUN - 1`` when it has no run that
        long, else the longest rule run length it holds. One C-speed substring search over a
        translated copy, then a bisection of the run lengths with a few more, instead of
        splitting the text into word objects. The scan compares this only with rule run
        lengths, which it decides the same as the true length."""
        if not text.isascii():
            return max(map(len, text.split()), default=0)
        tb = text.encode("ascii").translate(_NON_BLANK)
        if _SHORT_PROBE_END not in tb + b" ":
            return _SHORT_RUN - 1
        probes = self._probes
        lo, hi = 0, len(probes)  # probes[:lo] occur (lo == 0: none checked yet), probes[hi:] not
        while lo < hi:
            mid = (lo + hi) // 2
            if probes[mid][1] in tb:
                lo = mid + 1
            else:
                hi = mid
        return probes[lo - 1][0] if lo else _SHORT_RUN

    def _replacer(self, rule: Rule) -> Callable[[re.Match[str]], str]:
        marker = f"[REDACTED:{rule.name}]"
        groups = rule.regex.groupindex
        named = [g for g in ("secret", "bare") if g in groups]

        def sub(m: re.Match[str]) -> str:
            whole = m.group(0)
            if whole.startswith("[REDACTED:"):
                return whole
            s, e = _secret_span(m, named)
            if rule.plugin is not None and not _confirmed(rule.plugin, whole):
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


_SHORT_RUN = 16
"""Ordinary prose has no run of non-blank characters this long, and most rules need one."""
_NON_BLANK = bytes((32 if chr(b).isspace() else 120) if b < 128 else 120 for b in range(256))
"""ASCII whitespace (what ``str.split`` splits on) to a space, anything else to ``x``."""
_SHORT_PROBE = b"x" * _SHORT_RUN
_SHORT_PROBE_END = _SHORT_PROBE + b" "
"""A run that long, then the blank that ends it (the text is searched with a blank after
it): found where ``_SHORT_PROBE`` is, but searched faster, its last byte being the rarer."""


_COMMON = " etaoinsrhldcumfpgwybvkxjqz0123456789\n:,.()'\"=-_/"
"""Characters by how common they are in agent text, most common first (lower-case letters by
English frequency); anything else (capitals, rarer punctuation) ranks as rarest."""


def _rarity(c: str) -> int:
    i = _COMMON.find(c)
    return -1 if i < 0 else len(_COMMON) - i


_Index = list[tuple[str, bool, bool, list[tuple[str, list[tuple[str, int]]]]]]


@functools.lru_cache(maxsize=16)
def _plan(rules: tuple[Rule, ...]) -> tuple[list[int], list[_Index], frozenset[int], int]:
    """(run lengths, an index per run length, rules without trigger, shortest match) of a
    rule list; cached: every session's redactor with the same rules shares it.

    One index per run length: a text whose longest run of non-blank characters is L consults
    the index of the rules that need no more than L (most need 20+; most ordinary text has no
    word that long), so the rules it cannot match cost nothing."""
    runs = sorted({r.run for r in rules})
    indexes = [_index([(i, r) for i, r in enumerate(rules) if r.run <= n]) for n in runs]
    ungated = frozenset(i for i, r in enumerate(rules) if not r.triggers)
    return runs, indexes, ungated, min((r.width for r in rules), default=0)


def _index(rules: list[tuple[int, Rule]]) -> _Index:
    """(character, folded, is a capital, [(pair, [(trigger, rule number)])]) of ``rules``:
    each trigger filed under its rarest character, then under the rarest pair holding it."""
    index: dict[tuple[str, bool], dict[str, list[tuple[str, int]]]] = {}
    for i, rule in rules:
        for t in rule.triggers:
            c, pair = _bucket(t)
            index.setdefault((c, rule.fold), {}).setdefault(pair, []).append((t, i))
    return [
        (c, fold, c.isupper(), sorted(pairs.items())) for (c, fold), pairs in sorted(index.items())
    ]


@functools.lru_cache(maxsize=4096)  # each trigger is filed once per run length
def _bucket(trigger: str) -> tuple[str, str]:
    """The rarest character of a trigger and the rarest pair of characters holding it."""
    p = min(range(len(trigger)), key=lambda i: _rarity(trigger[i]))
    pairs = [trigger[max(p - 1, 0) : p + 1], trigger[p : p + 2]]
    return trigger[p], min(pairs, key=lambda x: (len(x) < 2, sum(map(_rarity, x))))


def names(rules: Iterable[Rule]) -> list[str]:
    """The distinct rule names, in order (what ``[REDACTED:<name>]`` can say)."""
    return list(dict.fromkeys(r.name for r in rules))
