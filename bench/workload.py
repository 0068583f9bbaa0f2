"""Deterministic workloads for the benchmarks: a workspace and an agent conversation.

Everything is derived from a seeded ``random.Random``, so two runs (and stashpoint and its peers
within one run) see byte-identical files and messages. The workspace mimics a real project:
source-like text of 1-20 KB in ~3 levels of directories (20-50 files each), a few 1-10 MB
binaries of incompressible bytes, and a gitignored ``node_modules/`` full of small files that
neither stashpoint nor git may read.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Workspace",
    "conversation",
    "create_files",
    "delete_files",
    "fingerprint",
    "make_workspace",
    "modify_files",
    "mutate_for_rewind",
]

_WORD_TEXT = (
    "self def return import from class if else elif for while in not and or None True False "
    "value result config path name data items key index count buffer stream request response "
    "client server handler session store blob tree digest cache update append extend yield "
    "async await with as try except finally raise assert lambda print len range dict list"
)
_WORDS = _WORD_TEXT.split()
_KEEP_OUT = ("node_modules", ".git", ".stashpoint")


def _line(rng: random.Random) -> str:
    indent = "    " * rng.randint(0, 3)
    kind = rng.random()
    words = " ".join(rng.choices(_WORDS, k=rng.randint(2, 9)))
    if kind < 0.15:
        return f"{indent}# {words}"
    if kind < 0.3:
        name = "_".join(rng.choices(_WORDS, k=2))
        return f"{indent}def {name}({', '.join(rng.choices(_WORDS, k=rng.randint(0, 3)))}):"
    if kind < 0.6:
        return f"{indent}{rng.choice(_WORDS)}_{rng.randint(0, 99)} = {words}"
    return f"{indent}{words}({rng.randint(0, 9999)})"


class _Text:
    """A pool of synthetic source lines; files are random line picks (fast, still distinct)."""

    def __init__(self, rng: random.Random, pool: int = 4000) -> None:
        self.rng = rng
        self.lines = [_line(rng) + "\n" for _ in range(pool)]

    def make(self, size: int, header: str) -> bytes:
        out = [f"# {header}\n"]
        total = len(out[0])
        while total < size:
            batch = self.rng.choices(self.lines, k=32)
            out.extend(batch)
            total += sum(len(s) for s in batch)
        return "".join(out).encode()[:size]


@dataclass
class Workspace:
    """A generated workspace and what is in it (relative paths, POSIX style)."""

    root: Path
    seed: int
    text_files: list[str] = field(default_factory=list)
    binaries: list[str] = field(default_factory=list)
    ignored_files: int = 0
    total_bytes: int = 0

    @property
    def files(self) -> int:
        return len(self.text_files) + len(self.binaries)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _text_size(rng: random.Random) -> int:
    # 1-20 KB, skewed small (mean ~7.5 KB) so 10k files plus binaries come to ~100 MB.
    return 1024 + int(19 * 1024 * rng.random() ** 2)


def make_workspace(root: Path, n_files: int = 10_000, *, seed: int = 1) -> Workspace:
    """Write ``n_files`` tracked files (text + ~1 binary per 2,500) under ``root``."""
    rng = random.Random(seed)
    text = _Text(rng)
    ws = Workspace(root, seed)
    root.mkdir(parents=True, exist_ok=True)
    _write(root / ".gitignore", b"node_modules/\n*.pyc\n")
    ws.text_files.append(".gitignore")
    n_bin = max(1, round(n_files / 2500))
    n_text = n_files - n_bin - 1
    fan = 2
    while fan**3 * 20 < n_text:
        fan += 1
    dirs = [
        f"pkg{a:02d}/mod{b:02d}/sub{c:02d}"
        for a in range(fan)
        for b in range(fan)
        for c in range(fan)
    ]
    i = 0
    for d in dirs:
        if i >= n_text:
            break
        for _ in range(min(rng.randint(20, 50), n_text - i)):
            rel = f"{d}/file_{i:06d}.py"
            data = text.make(_text_size(rng), rel)
            _write(root / rel, data)
            ws.text_files.append(rel)
            ws.total_bytes += len(data)
            i += 1
    for b in range(n_bin):
        rel = f"assets/blob_{b:03d}.bin"
        data = rng.randbytes(rng.randint(1 << 20, 10 << 20))
        _write(root / rel, data)
        ws.binaries.append(rel)
        ws.total_bytes += len(data)
    n_ignored = max(300, n_files * 3 // 10)
    for j in range(n_ignored):
        rel = f"node_modules/dep{j // 40:03d}/lib/m{j:05d}.js"
        _write(root / rel, text.make(rng.randint(100, 2000), rel))
    ws.ignored_files = n_ignored
    return ws


def _pick(ws: Workspace, rng: random.Random, k: int) -> list[str]:
    candidates = [p for p in ws.text_files if p != ".gitignore"]
    return rng.sample(candidates, k)


def _append_edits(ws: Workspace, paths: list[str], rng: random.Random, tag: str) -> None:
    text = _Text(rng, pool=64)
    for rel in paths:
        with open(ws.root / rel, "ab") as f:
            f.write(text.make(rng.randint(40, 400), f"edit {tag}"))


def modify_files(ws: Workspace, k: int, *, seed: int) -> list[str]:
    """Append a few lines to ``k`` text files (an edit, as an agent's tool would make)."""
    rng = random.Random(seed)
    chosen = _pick(ws, rng, k)
    _append_edits(ws, chosen, rng, str(seed))
    return chosen


def create_files(ws: Workspace, k: int, *, seed: int) -> list[str]:
    """Create ``k`` new files: most next to existing ones, every third in a new directory."""
    rng = random.Random(seed)
    text = _Text(rng, pool=64)
    made = []
    for j in range(k):
        if j % 3 == 2:
            rel = f"newdir_{seed}/nested/new_{j:04d}.py"
        else:
            base = rng.choice(ws.text_files[1:])
            rel = f"{base.rsplit('/', 1)[0]}/new_{seed}_{j:04d}.py"
        _write(ws.root / rel, text.make(rng.randint(1024, 8192), rel))
        made.append(rel)
    ws.text_files.extend(made)
    return made


def delete_files(ws: Workspace, k: int, *, seed: int) -> list[str]:
    rng = random.Random(seed)
    chosen = _pick(ws, rng, k)
    _unlink(ws, chosen)
    return chosen


def _unlink(ws: Workspace, paths: list[str]) -> None:
    for rel in paths:
        (ws.root / rel).unlink()
    gone = set(paths)
    ws.text_files = [p for p in ws.text_files if p not in gone]


def mutate_for_rewind(
    ws: Workspace, *, seed: int, modified: int = 100, created: int = 10, deleted: int = 10
) -> dict[str, list[str]]:
    """The rewind workload: 100 modified + 10 created + 10 deleted files.

    ``ws`` itself is left as it was (a copy of its file lists is changed), so the same call
    after a restore reproduces exactly the same tree, byte for byte.
    """
    shadow = Workspace(ws.root, ws.seed, list(ws.text_files), list(ws.binaries))
    rng = random.Random(seed)
    chosen = _pick(shadow, rng, modified + deleted)
    mod, dele = chosen[:modified], chosen[modified:]
    _append_edits(shadow, mod, rng, str(seed))
    _unlink(shadow, dele)
    new = create_files(shadow, created, seed=seed + 1)
    return {"modified": mod, "deleted": dele, "created": new}


def fingerprint(root: Path) -> str:
    """SHA-256 over every path, type, mode and content outside node_modules/.git/.stashpoint.

    Used to check that a restore really produced the snapshot's tree (never timed).
    """
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames if d not in _KEEP_OUT)
        h.update(f"D {rel_dir}\n".encode())
        for name in sorted(filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            h.update(f"F {rel_dir}/{name} {stat.S_IMODE(st.st_mode):o}\n".encode())
            with open(p, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def count_files(root: Path) -> int:
    return sum(len(files) for _d, _s, files in os.walk(root))


def conversation(steps: int, *, seed: int = 7, size: int = 500) -> list[list[dict[str, Any]]]:
    """Per step, one user and one assistant message of ~``size`` bytes (as JSON) each."""
    rng = random.Random(seed)
    vocab = [*_WORDS] + [f"tok{i}" for i in range(200)]
    out = []
    for step in range(steps):
        pair = []
        for role in ("user", "assistant"):
            words: list[str] = [f"step {step}:"]
            n = len(words[0])
            budget = size - len(json.dumps({"role": role, "content": ""}, separators=(",", ":")))
            while n < budget:
                w = rng.choice(vocab)
                words.append(w)
                n += len(w) + 1
            pair.append({"role": role, "content": " ".join(words)[:budget]})
        out.append(pair)
    return out


def message_bytes(msgs: list[dict[str, Any]]) -> int:
    """Raw size of messages: their compact JSON encoding, summed."""
    return sum(len(json.dumps(m, separators=(",", ":"), ensure_ascii=False)) for m in msgs)
