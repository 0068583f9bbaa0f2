"""What the pages read from a session, beyond the public Session calls.

Small readers the UI needs and the library does not offer as such: the journal entries a
checkpoint recorded, the effects they fold into, one directory or one file of a snapshot, and
the decisions waiting on each branch. They use only the session, its blob store and its tree
reader, and read nothing the library does not verify.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import NotFoundError

if TYPE_CHECKING:
    from ..durable import Pending
    from ..model import Checkpoint, TreeEntry
    from ..session import Session

__all__ = [
    "FileView",
    "branch_pending",
    "effects_in",
    "journal_entries",
    "list_dir",
    "read_file",
    "search_files",
]

_decoder = msgspec.json.Decoder()
MAX_FILE_BYTES = 8 << 20
"""Files larger than this are summarised, not shown (they would be read whole)."""
LINES_PER_PAGE = 2000


def journal_entries(s: Session, cp: Checkpoint) -> list[dict[str, Any]]:
    """The journal entries recorded in one checkpoint (what ``durable.tasks_at`` reads: the
    library exposes the tasks folded from them, not the entries)."""
    if cp.journal is None:
        return []
    rows = s._message_rows(cp.journal.log, cp.journal.length)
    out: list[dict[str, Any]] = []
    for _chain, data in rows:
        entry = _decoder.decode(data)
        out.append(entry if isinstance(entry, dict) else {"k": "?", "value": entry})
    return out


@dataclass(frozen=True)
class LedgerEntry:
    key: str
    tool: str
    args: Any
    status: str
    result: Any
    position: int


def effects_in(entries: list[dict[str, Any]]) -> list[LedgerEntry]:
    """The side-effect ledger of these entries, each logical call once (as the journal folds
    it for ``Session.effects``, but for any checkpoint, failed calls included)."""
    out: dict[str, LedgerEntry] = {}
    for pos, e in enumerate(entries):
        k = e.get("k")
        if k == "intent":
            key = str(e.get("key"))
            out[key] = LedgerEntry(key, str(e.get("n")), e.get("a"), "in doubt", None, pos)
        elif k == "effect":
            key = str(e.get("key"))
            prev = out.get(key)
            args = prev.args if prev is not None else e.get("a")
            status = "done" if e.get("ok") else "failed"
            out[key] = LedgerEntry(key, str(e.get("n")), args, status, e.get("r"), pos)
        elif k == "resolve":
            out.pop(str(e.get("key")), None)
    return list(out.values())


def branch_pending(s: Session) -> list[tuple[str, Pending]]:
    """(branch, decision) for every branch whose run waits for a human."""
    out = []
    for branch in sorted(s.branches()):
        on = s if branch == s.branch else s.store.session(s.name, branch=branch)
        p = on.pending()
        if p is not None:
            out.append((branch, p))
    return out


def _tree(s: Session, cp: Checkpoint) -> bytes:
    if cp.workspace is None:
        raise NotFoundError(f"checkpoint {cp.id} has no files")
    return bytes.fromhex(cp.workspace.tree)


def _entry(s: Session, cp: Checkpoint, path: str) -> TreeEntry | None:
    """The entry at ``path`` ('/'-separated; '' is the root, None)."""
    from ..workspace.tree import shared_reader

    reader = shared_reader(s.store.blobs)
    digest = _tree(s, cp)
    found: TreeEntry | None = None
    for part in [p for p in path.split("/") if p]:
        if part in (".", ".."):
            raise NotFoundError(f"no file {path!r} in checkpoint {cp.id}")
        if found is not None:
            if found.kind != "d":
                raise NotFoundError(f"no file {path!r} in checkpoint {cp.id}")
            digest = found.ref
        found = reader.load(digest).get(os.fsencode(part))
        if found is None:
            raise NotFoundError(f"no file {path!r} in checkpoint {cp.id}")
    return found


def list_dir(s: Session, cp: Checkpoint, path: str) -> list[tuple[str, TreeEntry]]:
    """(name, entry) of one directory of the snapshot: directories first, then by name."""
    from ..workspace.tree import shared_reader

    found = _entry(s, cp, path)
    if found is not None and found.kind != "d":
        raise NotFoundError(f"{path!r} is not a directory in checkpoint {cp.id}")
    digest = found.ref if found is not None else _tree(s, cp)
    entries = shared_reader(s.store.blobs).load(digest)
    named = [(os.fsdecode(n), x) for n, x in entries.items()]
    return sorted(named, key=lambda p: (p[1].kind != "d", p[0]))


def search_files(s: Session, cp: Checkpoint, text: str, limit: int) -> tuple[list[str], bool]:
    """Paths containing ``text`` (case-insensitive), at most ``limit``; and whether cut."""
    from ..workspace.tree import shared_reader

    needle = text.lower()
    out: list[str] = []
    walk: Iterator[tuple[bytes, TreeEntry]] = shared_reader(s.store.blobs).walk(_tree(s, cp))
    for rel, entry in walk:
        if entry.kind == "d":
            continue
        path = os.fsdecode(rel)
        if needle in path.lower():
            if len(out) == limit:
                return out, True
            out.append(path)
    return out, False


@dataclass(frozen=True)
class FileView:
    path: str
    kind: str
    size: int
    mode: int
    text: str | None
    """The text (of this page), None for a binary or too large file."""
    why: str
    """Why there is no text (binary, too large, link target...)."""
    digest: str
    page: int
    pages: int
    first_line: int


def read_file(s: Session, cp: Checkpoint, path: str, page: int = 1) -> FileView:
    """One file of the snapshot, a page of lines at a time; binaries summarised."""
    entry = _entry(s, cp, path)
    if entry is None or entry.kind == "d":
        raise NotFoundError(f"{path!r} is a directory in checkpoint {cp.id}")
    if entry.kind == "l":
        target = entry.ref.decode("utf-8", "replace")
        return FileView(
            path, "l", entry.size, entry.mode, None, f"symbolic link to {target}", "", 1, 1, 1
        )
    digest = entry.ref.hex()
    if entry.size > MAX_FILE_BYTES:
        why = f"{entry.size:,} bytes: too large to show here"
        return FileView(path, "f", entry.size, entry.mode, None, why, digest, 1, 1, 1)
    data = s.store.blobs.read(entry.ref)
    text: str | None = None
    why = ""
    if b"\0" in data[:8192]:
        why = "binary file"
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            why = "binary file (not UTF-8 text)"
    if text is None:
        sha = hashlib.sha256(data).hexdigest()
        head = data[:64].hex(" ")
        why = f"{why}: {len(data):,} bytes, sha256 {sha}; first bytes {head}"
        return FileView(path, "f", entry.size, entry.mode, None, why, digest, 1, 1, 1)
    lines = text.split("\n")
    pages = max(1, -(-len(lines) // LINES_PER_PAGE))
    page = min(max(page, 1), pages)
    start = (page - 1) * LINES_PER_PAGE
    chunk = "\n".join(lines[start : start + LINES_PER_PAGE])
    return FileView(path, "f", entry.size, entry.mode, chunk, "", digest, page, pages, start + 1)
