"""Redaction measured on a corpus: recall on secrets of many providers, false positives on
ordinary agent text, and the secrets' absence from the store's bytes end to end.

``tests/data/secrets/generate.py`` makes fake but well-formed secrets (``generate.py`` there
makes them) each in the context an agent meets it in; ``ordinary*.txt`` holds code, logs,
diffs, JSON with ``max_tokens`` and ``nextPageToken``, hashes, digests, UUIDs, base64 images
and URLs without credentials, which must come out unchanged.
"""

from __future__ import annotations

import importlib.util
import sqlite3
from pathlib import Path
from typing import Any

import stashpoint
from stashpoint.redact import Redactor

DATA = Path(__file__).parent / "data" / "secrets"


def _generated() -> tuple[list[dict[str, str]], list[str]]:
    spec = importlib.util.spec_from_file_location("secret_corpus", DATA / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.corpus()  # type: ignore[no-any-return]


def _samples() -> list[dict[str, str]]:
    return _generated()[0]


def _ordinary() -> list[str]:
    return (DATA / "ordinary.txt").read_text().splitlines() + _generated()[1]


def test_recall_on_the_corpus_and_no_false_positive_on_ordinary_text() -> None:
    samples, ordinary = _samples(), _ordinary()
    providers = {s["provider"] for s in samples}
    assert len(samples) >= 60 and len(providers) >= 20 and len(ordinary) >= 200
    r = Redactor()
    missed = [s for s in samples if s["secret"] in r(s["text"])]
    touched = [(line, r(line)) for line in ordinary if r(line) != line]
    recall = 1 - len(missed) / len(samples)
    print(
        f"\nredaction recall {recall:.1%} ({len(samples) - len(missed)}/{len(samples)} samples, "
        f"{len(providers)} providers); false positives {len(touched)}/{len(ordinary)} lines"
    )
    for s in missed:
        print(f"  missed {s['provider']}: {s['text'][:100]!r}")
    for line, out in touched:
        print(f"  changed {line[:80]!r} -> {out[:80]!r}")
    assert recall >= 0.98, [s["provider"] for s in missed]
    assert touched == []
    again = [s["provider"] for s in samples if r(r(s["text"])) != r(s["text"])]
    assert again == [], "a second pass changes nothing"


def _store_bytes(home: Path) -> bytes:
    """Every byte the store wrote: its files (the database, its WAL) and each SQLite value
    read back as stored (a page may hold a value split across overflow pages)."""
    raw = b"".join(p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file())
    for db in home.rglob("*.db"):
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            query = "SELECT name FROM sqlite_master WHERE type='table'"
            tables = [t for (t,) in con.execute(query)]
            for t in tables:
                for row in con.execute(f'SELECT * FROM "{t}"'):
                    raw += b"".join(
                        v if isinstance(v, bytes) else str(v).encode() for v in row if v is not None
                    )
        finally:
            con.close()
    return raw


def test_corpus_secrets_never_reach_the_store_bytes(tmp_path: Path) -> None:
    """One sample per provider goes through each way into a checkpoint: a state value, a
    conversation message, the checkpoint message, its label and a dict key."""
    by_provider: dict[str, dict[str, str]] = {}
    for s in _samples():
        by_provider.setdefault(s["provider"], s)
    picked = list(by_provider.values())
    canary = "plain-canary-7f3a9c stored as given"
    home = tmp_path / "st"
    r = Redactor()
    with stashpoint.open(home) as store:
        run = store.session("main")
        for i, s in enumerate(picked):
            secret = s["secret"]
            # A password alone is a word like any other: where only its context tells, the
            # label and the key carry the context (``PGPASSWORD=...``).
            named = secret if r(secret) != secret else s["text"]
            state: dict[str, Any] = {
                "messages": [
                    {"role": "user", "content": canary},
                    {"role": "tool", "content": s["text"]},
                ],
                "tool_output": s["text"],
                "seen": {named: "a secret used as a key", "note": canary},
            }
            cp = run.checkpoint(state, message=f"ran the tool: {s['text']}", label=f"{named} #{i}")
            assert secret not in (cp.label or "") and secret not in (cp.message or "")
        labels = run.labels()
        assert len(labels) == len(picked)  # each label kept apart (the index suffix)
    raw = _store_bytes(home)
    assert canary.encode() in raw, "the store holds values readable as bytes"
    leaked = [s["provider"] for s in picked if s["secret"].encode() in raw]
    assert leaked == []


def _long_runs_and_unicode(seed: int = 7) -> list[str]:
    """Texts around the run-length boundaries of the rules (a word of exactly n characters
    for every n up to 100), non-ASCII text, and messages of 50 to 500 bytes."""
    import random

    rnd = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:="
    out = []
    for n in range(1, 101):
        word = "".join(rnd.choice(alphabet) for _ in range(n))
        out += [f"the value is {word} here", word, f"«{word}» données\tet {word[: n // 2]}"]
    words = [line for line in _ordinary() if line.strip()]
    for size in (50, 120, 250, 500):
        for _ in range(20):
            text = " ".join(rnd.choice(words) for _ in range(12))[:size]
            out.append(text)
    return out


def test_the_gated_scan_equals_every_rule_run_on_every_text() -> None:
    """The fast path (requirements checked before a rule runs: triggers, run lengths, the
    clean-string memory) must redact exactly what running every rule on every text does:
    a requirement derived wrong, or a pre-filter that drops a rule's match, fails here."""
    from stashpoint.secrets_rules import Scanner

    texts = [s["text"] for s in _samples()] + _ordinary() + _long_runs_and_unicode()
    texts += [s["secret"] for s in _samples()]
    fast = Redactor()
    full = Redactor()
    full_scanner = Scanner(on_match=full._count, assignments=full._assigned, gated=False)
    differ = []
    for text in texts * 2:  # twice: the second time through the clean-string memory
        got, want = fast.scrub(text), full_scanner.scrub(text)
        if got != want:
            differ.append((text[:80], got[:80], want[:80]))
    assert differ == []
    assert sum(fast.counts.values()) == sum(full.counts.values()) > 0


def test_the_run_length_bound_decides_as_the_true_longest_run() -> None:
    """The scan compares the longest run of non-blank characters only with rule run
    lengths: the bisected bound must let through every rule the true length does (and, for
    a run of 16 or more, no other)."""
    r = Redactor()
    r.scrub("load the rules")
    scanner = r._scanner
    runs = scanner._runs
    assert runs
    for text in _long_runs_and_unicode() + _ordinary():
        true = max(map(len, text.split()), default=0)
        bound = scanner._longest_run(text)
        allowed, needed = {n for n in runs if n <= bound}, {n for n in runs if n <= true}
        assert allowed >= needed, text  # below 16 a bound: more rules run, none is skipped
        if true >= 16:
            assert allowed == needed, text
