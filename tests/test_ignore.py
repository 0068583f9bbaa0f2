"""Ignore rules: the literal prefilter decides exactly as the patterns' regexes do."""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

import pytest

from stashpoint.workspace import ignore
from stashpoint.workspace.ignore import IgnoreContext
from stashpoint.workspace.tree import TreeReader

_PLAIN = b"*.log\nbuild/\n/root-only\na/**/b\n**/deep\ndoc/*.md\nx?y\n*.PYC\n\xc3\xbcnicode\n"
_MIXED = _PLAIN + b"foo[ab]\n\\#hash\ntrailing   \nname with space\n"
_SUB = b"!keep.log\n!build/\n"
_NAMES = [
    "build", "keep.log", "drop.log", "a", "b", "deep", "doc", "x.md", "xzy", "fooa", "#hash",
    "trailing", "name with space", "\xfcnicode", "root-only", "app.py", "X.PYC", "x.pyc", "sub",
]  # fmt: skip


def _paths() -> list[bytes]:
    names = [n.encode() for n in _NAMES]
    out = [b"/".join(p) for depth in (1, 2) for p in itertools.product(names, repeat=depth)]
    out += [b"/".join(p) for p in itertools.product(names[::3], repeat=3)]
    return out


def _decisions(rules: bytes) -> list[bool]:
    """Every path, as a file and as a directory, under the root's rules and under sub/'s."""
    ignore._spec_cache.clear()
    root = IgnoreContext.root().child(b"", [rules])
    sub = root.child(b"sub", [_SUB])
    return [c.ignored(p, d) for c in (root, sub) for p in _paths() for d in (False, True)]


@pytest.mark.parametrize("rules", [_PLAIN, _MIXED], ids=["plain", "mixed"])
def test_paths_without_a_rules_literal_are_decided_as_the_regexes_decide(
    rules: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _decisions(rules)
    monkeypatch.setattr(ignore, "_literal", lambda _pattern: None)  # every path to the regexes
    slow = _decisions(rules)
    ignore._spec_cache.clear()
    assert fast == slow
    assert 300 < sum(fast) < len(fast) - 300  # many paths ignored, many not


def test_the_literals_of_a_rules_file() -> None:
    ignore._spec_cache.clear()
    literals = [b".log", b"build", b"root-only", b"a", b"deep", b"doc", b"x", b".PYC"]
    assert ignore._compile(_PLAIN)[2] == (*literals, "\xfcnicode".encode())
    assert ignore._compile(_SUB)[2] == (b"keep.log", b"build")
    # Brackets, escapes and normalised text (trailing spaces): the regexes decide every path.
    for rules in (b"foo[ab]\n", b"\\#hash\n", b"trailing   \n", b"*\n", _MIXED):
        assert ignore._compile(rules)[2] is None
    ignore._spec_cache.clear()


def test_stashpointignore_decides_after_gitignore_whatever_the_listing_order(
    tmp_path: Path,
) -> None:
    """A directory's .stashpointignore is applied after its .gitignore, so its patterns win
    (a negation there keeps a file git ignores) however the file system lists the two:
    tmpfs lists the newest name first, so both creation orders are tried."""
    import shutil

    import stashpoint

    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm (tmpfs) here")
    for first, second in ((".gitignore", ".stashpointignore"), (".stashpointignore", ".gitignore")):
        ws = Path(tempfile.mkdtemp(dir=shm))
        try:
            texts = {".gitignore": "*.log\n", ".stashpointignore": "!keep.log\n"}
            for name in (first, second):
                (ws / name).write_text(texts[name])
            (ws / "keep.log").write_text("kept\n")
            (ws / "other.log").write_text("ignored\n")
            with stashpoint.open(tmp_path / f"store-{first}") as store:
                cp = store.session("s", workspace=ws).checkpoint()
                assert cp.workspace is not None
                reader = TreeReader(store.blobs)
                names = {os.fsdecode(p) for p, _e in reader.walk(bytes.fromhex(cp.workspace.tree))}
            assert "keep.log" in names and "other.log" not in names, (first, names)
        finally:
            shutil.rmtree(ws)
