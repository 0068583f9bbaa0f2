"""Everything about a bundle that can be checked without the target store: its records and
their chain, its logs, the names in its trees, its references, and what each checkpoint
would restore against the limits.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from ..errors import IntegrityError, UsageError
from ..integrity import EMPTY_CHAIN, ChainHasher, message_chain
from ..model import Checkpoint, LogRef, TreeEntry
from ..workspace.tree import validate_name
from .format import (
    _HEX,
    FORMAT,
    VERSION,
    LogEntry,
    Manifest,
    RecordEntry,
    _damaged,
    _refused,
    _tree_dec,
)
from .limits import Limits

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MAX_LINK = 4096


# Zero-width code points HFS+ ignores in names (git's is_hfs_dotgit list), so ".g\u200cit" is
# ".git" on a Mac.
_IGNORABLE = dict.fromkeys(
    [*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)
_RESERVED = frozenset({".git", ".stashpoint", "git~1"})


def _check_text(what: str, value: str) -> None:
    if not value or len(value) > 1024 or _CONTROL.search(value):
        raise _refused(f"invalid {what} {value[:80]!r}")


def _fold(name: bytes) -> str:
    """The key under which case-insensitive or normalising filesystems see a name."""
    text = unicodedata.normalize("NFC", name.decode("utf-8", "surrogateescape"))
    return unicodedata.normalize("NFC", text.casefold()).translate(_IGNORABLE)


_NAME_MAX = 255
"""Bytes of one name on every common filesystem (ext4, APFS, NTFS, XFS, btrfs)."""


def _tree_count(content: bytes) -> int:
    """Entries a tree object holds, read from its msgpack array header (-1: not an array)."""
    first = content[:1]
    if first and 0x90 <= first[0] <= 0x9F:
        return first[0] & 0x0F
    if first == b"\xdc" and len(content) >= 3:
        return int.from_bytes(content[1:3], "big")
    if first == b"\xdd" and len(content) >= 5:
        return int.from_bytes(content[1:5], "big")
    return -1


def parse_tree(digest: bytes, content: bytes, limit: int | None = None) -> list[TreeEntry]:
    """Decode one tree object and refuse any entry a restore must not be asked to create.

    With ``limit``, a tree of more entries is refused from its header, before a million
    entries are decoded into objects (~200 bytes of memory each)."""
    where = f"tree {digest.hex()[:16]}"
    if limit is not None and _tree_count(content) > limit:
        raise _too_many(limit)
    try:
        entries = _tree_dec.decode(content)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # a kind that is not UTF-8
        raise _damaged(f"{where} is malformed: {exc}") from None
    folded: dict[str, bytes] = {}
    for e in entries:
        if not validate_name(e.name):
            raise _refused(f"{where} has an unsafe name {e.name!r} (empty, '.', '..', or with '/')")
        if len(e.name) > _NAME_MAX:
            raise _refused(
                f"{where} has a name of {len(e.name)} bytes ({e.name[:40]!r}...); "
                f"filesystems hold at most {_NAME_MAX}"
            )
        if e.kind not in ("f", "d", "l"):
            raise _refused(
                f"{where}: {e.name!r} is of kind {e.kind!r}; a bundle holds only files, "
                "directories and symlinks (no device files, hard links or FIFOs)"
            )
        key = _fold(e.name)
        if key.rstrip(". ") in _RESERVED:
            raise _refused(f"{where} has an entry {e.name!r}, which stashpoint never snapshots")
        if key in folded:
            other = folded[key]
            what = "twice" if other == e.name else f"and {other!r}, which collide"
            raise _refused(
                f"{where} has {e.name!r} {what} (case-insensitive or Unicode-normalising "
                "filesystems cannot hold both)"
            )
        folded[key] = e.name
        if not 0 <= e.mode <= 0o7777 or e.size < 0:
            raise _damaged(f"{where}: {e.name!r} has an invalid mode or size")
        if e.kind == "f" and e.mode & 0o6000:
            raise _refused(f"{where}: {e.name!r} is setuid/setgid")
        if e.kind in ("f", "d") and len(e.ref) != 32:
            raise _damaged(f"{where}: {e.name!r} has a malformed reference")
        if e.kind == "l" and (not e.ref or len(e.ref) > _MAX_LINK or b"\0" in e.ref):
            raise _refused(f"{where}: symlink {e.name!r} has an invalid target")
    return entries


def _too_many(limit: int) -> UsageError:
    return _refused(
        f"its trees expand to more than {limit} files, directories and symlinks (one "
        "directory named under many names?); a restore would create them all (limit: "
        "--max-files)"
    )


def log_refs(obj: msgspec.Struct) -> Iterator[LogRef]:
    """Every LogRef in a record (conversation, journal, and any added later), generically."""
    for name in obj.__struct_fields__:
        value = getattr(obj, name)
        if isinstance(value, LogRef):
            yield value
        elif isinstance(value, msgspec.Struct):
            yield from log_refs(value)


@dataclass
class _Contents:
    """What a bundle carries, as export builds it or import reads it."""

    manifest: Manifest | None = None
    records: dict[str, RecordEntry] = field(default_factory=dict)
    logs: dict[str, LogEntry] = field(default_factory=dict)
    trees: dict[bytes, bytes] = field(default_factory=dict)
    blobs: dict[bytes, int] = field(default_factory=dict)
    """Digest -> size of blobs: declared (read) or verified (export). A reader verifies every
    blob's content against its digest only after the cheap checks passed."""
    lists: dict[bytes, bytes] = field(default_factory=dict)


@dataclass
class _Checked:
    records: list[tuple[Checkpoint, RecordEntry]]
    """Parents first."""
    logs: list[str]
    """Parents first."""
    chunks: set[bytes]
    list_sizes: dict[bytes, int]


class _Checker:
    """Everything about a bundle that can be checked without the target store."""

    def __init__(
        self,
        c: _Contents,
        hasher: ChainHasher,
        limits: Limits,
        parsed: dict[bytes, list[TreeEntry]] | None = None,
        file_size: int = 0,
    ) -> None:
        self.c = c
        self.restore_cap = limits.restore_cap(file_size)
        self.parsed = parsed or {}
        """Trees already checked by :func:`parse_tree` (export parses each once)."""
        self.hasher = hasher.plain()  # bundles carry plaintext bodies
        self.limits = limits
        self.used: set[bytes] = set()
        self.chunks: set[bytes] = set()
        self.list_sizes: dict[bytes, int] = {}
        self.tree_stats: dict[bytes, _TreeStats] = {}
        self.chains: dict[str, list[bytes]] = {}
        self.used_logs: set[str] = set()

    def run(self) -> _Checked:
        m = self.c.manifest
        if m is None:
            raise _damaged("no manifest")
        if m.format != FORMAT:
            raise _damaged(f"manifest format is {m.format!r}")
        if m.version != VERSION:
            raise _refused(f"format version {m.version}; this stashpoint reads {VERSION}")
        _check_text("session name", m.session)
        if m.keyed != self.hasher.keyed:
            raise _refused(
                "its records are sealed with an HMAC key and this store has none"
                if m.keyed
                else "this store is keyed (HMAC) and the bundle's records are not; they can "
                "only be imported into a store without a key"
            )
        records = self._records(m)
        logs = self._logs(m)
        for cp, _rec in records:
            if cp.id not in m.pruned:
                self._contents(cp)
        unused = [k for k in (*self.c.trees, *self.c.blobs, *self.c.lists) if k not in self.used]
        if unused:
            raise _refused(f"it carries {len(unused)} object(s) no checkpoint refers to")
        if set(logs) - self.used_logs:
            raise _refused("it carries logs no checkpoint refers to")
        return _Checked(records, logs, self.chunks, self.list_sizes)

    def _records(self, m: Manifest) -> list[tuple[Checkpoint, RecordEntry]]:
        opened: dict[str, Checkpoint] = {}
        for ident, rec in self.c.records.items():
            try:
                cp = self.hasher.open(ident, rec.body, rec.digest)
            except UnicodeDecodeError as exc:  # its digest matches; a string in it is not UTF-8
                raise _damaged(f"checkpoint {ident} is malformed: {exc}") from None
            except IntegrityError as exc:  # (a newer record format: SchemaVersionError, exit 1)
                if self.hasher.keyed:
                    raise _damaged(
                        f"checkpoint {ident} does not verify under this store's key (the bundle "
                        "was sealed with another key, or altered)"
                    ) from None
                raise _damaged(str(exc)) from None
            if cp.session != m.session:
                raise _refused(f"checkpoint {ident} belongs to session {cp.session!r}")
            _check_text("branch name", cp.branch)
            opened[ident] = cp
        for cp in opened.values():
            if cp.parent is None:
                continue
            parent = opened.get(cp.parent)
            if parent is None:
                raise _damaged(f"checkpoint {cp.id}'s parent {cp.parent} is not in the bundle")
            if parent.digest != cp.parent_digest:
                raise _damaged(f"checkpoint {cp.id}'s parent {cp.parent} was altered")
        if not m.checkpoints or any(i not in opened for i in m.checkpoints):
            raise _damaged("the manifest names checkpoints the bundle does not carry")
        for branch, head in m.heads.items():
            _check_text("branch name", branch)
            if head not in opened:
                raise _damaged(f"branch {branch!r} points to a checkpoint not in the bundle")
        for ident, label in m.labels.items():
            _check_text("label", label)
            if ident not in opened:
                raise _damaged(f"label {label!r} names a checkpoint not in the bundle")
        for ident, when in m.pruned.items():
            _check_text("prune time", when)
            if ident not in opened or ident in m.checkpoints or ident in m.heads.values():
                raise _damaged(f"pruned checkpoint {ident} is missing, exported or a head")
        reachable: set[str] = set()
        for start in (*m.checkpoints, *m.heads.values()):
            node: str | None = start
            while node is not None and node not in reachable:
                reachable.add(node)
                node = opened[node].parent
        if len(reachable) != len(opened):
            raise _refused("it carries records that no exported checkpoint descends to")
        # Parents first (ids sort by time, but a record's order must not depend on clocks).
        order: list[tuple[Checkpoint, RecordEntry]] = []
        done: set[str] = set()
        for ident in sorted(opened):
            path: list[str] = []
            node = ident
            while node is not None and node not in done:
                path.append(node)
                node = opened[node].parent
            for x in reversed(path):
                done.add(x)
                order.append((opened[x], self.c.records[x]))
        return order

    def _logs(self, m: Manifest) -> list[str]:
        logs = self.c.logs
        order: list[str] = []
        state: dict[str, int] = {}  # 1 visiting, 2 done
        for name, entry in logs.items():
            _check_text("log session", entry.session)
            if entry.session != m.session:
                raise _refused(f"log {name} belongs to session {entry.session!r}")
            if (entry.parent is None and entry.parent_len != 0) or entry.parent_len < 0:
                raise _damaged(f"log {name} has an invalid fork point")
            if entry.parent is not None and entry.parent not in logs:
                raise _damaged(f"log {name}'s parent log {entry.parent} is not in the bundle")
            path: list[str] = []
            node: str | None = name
            while node is not None and state.get(node) != 2:
                if state.get(node) == 1:
                    raise _damaged(f"log {node} is its own ancestor")
                state[node] = 1
                path.append(node)
                node = logs[node].parent
            for x in reversed(path):
                state[x] = 2
                order.append(x)
        for name in order:
            entry = logs[name]
            chain = self.chain_at(entry.parent, entry.parent_len) if entry.parent else EMPTY_CHAIN
            own: list[bytes] = []
            for i, (stored, data) in enumerate(entry.rows):
                chain = message_chain(chain, data)
                if bytes.fromhex(chain) != stored:
                    raise _damaged(
                        f"log {name} does not match its running hash at {entry.start + i}"
                    )
                own.append(stored)
            self.chains[name] = own
        return order

    def chain_at(self, log: str | None, n: int) -> str:
        """Running hash after ``n`` entries of ``log``, following fork points."""
        while log is not None and n > 0:
            entry = self.c.logs[log]
            self.used_logs.add(log)
            if n > entry.start:
                own = self.chains.get(log)
                if own is None or n - entry.start > len(own):
                    raise _damaged(f"log {log} is shorter than a checkpoint says")
                return own[n - 1 - entry.start].hex()
            log = entry.parent
        if log is not None:
            self.used_logs.add(log)
        return EMPTY_CHAIN

    def _contents(self, cp: Checkpoint) -> None:
        restored = 0
        for ref in log_refs(cp):
            if ref.log not in self.c.logs or ref.length < 0:
                raise _damaged(f"checkpoint {cp.id} refers to log {ref.log}, not in the bundle")
            if self.chain_at(ref.log, ref.length) != ref.hash:
                raise _damaged(f"checkpoint {cp.id}: log {ref.log} does not match its hash")
        for key, hexd in cp.state.values.items():
            if not _HEX.fullmatch(hexd):
                raise _damaged(f"checkpoint {cp.id}: state value {key!r} has a bad digest")
            restored += self._content_size(
                bytes.fromhex(hexd), f"checkpoint {cp.id}: state value {key!r}"
            )
        ws = cp.workspace
        if ws is not None:
            if not _HEX.fullmatch(ws.tree):
                raise _damaged(f"checkpoint {cp.id} has a bad tree digest")
            stats = self._tree(bytes.fromhex(ws.tree), 0)
            files, nbytes = stats.files, stats.bytes
            if (files, nbytes) != (ws.files, ws.bytes):
                raise _damaged(
                    f"checkpoint {cp.id} declares {ws.files} files / {ws.bytes} bytes, its tree "
                    f"holds {files} / {nbytes}"
                )
            if stats.longest > self.limits.max_path:
                raise _refused(
                    f"checkpoint {cp.id} has a path of {stats.longest} bytes (limit "
                    f"{self.limits.max_path}: --max-path); most tools, and a restore, fail on "
                    "paths that long"
                )
            restored += nbytes
        for name, art in cp.artifacts.items():
            # The name and path are checked like tree names: a rewind writes to that path.
            what = f"checkpoint {cp.id}: artifact {name!r}"
            _check_text("artifact name", name)
            _check_text("artifact path", art.path)
            if not _HEX.fullmatch(art.digest):
                raise _damaged(f"{what} has a bad digest")
            if not os.path.isabs(art.path) or ".." in Path(art.path).parts:
                raise _refused(f"{what} names an unsafe path {art.path!r}")
            if not 0 <= art.mode <= 0o7777:
                raise _damaged(f"{what} has an invalid mode")
            if art.mode & 0o6000:  # the rule for tree files: a rewind would create it so
                raise _refused(f"{what} is setuid/setgid")
            if self._content_size(bytes.fromhex(art.digest), what) != art.size:
                raise _damaged(f"{what} declares {art.size} bytes, its content differs")
            restored += art.size
        if restored > self.restore_cap:
            raise _refused(
                f"checkpoint {cp.id}'s files and values would expand to {restored} bytes, more "
                f"than {self.restore_cap} ({self._cap_rule()}): a decompression bomb?"
            )

    def _cap_rule(self) -> str:
        lim = self.limits
        if lim.max_ratio and self.restore_cap < lim.max_restore:
            return f"{lim.max_ratio}x the bundle's size; --max-size SIZE if you trust it"
        return "--max-size"

    def _content_size(self, digest: bytes, what: str) -> int:
        c = self.c
        self.used.add(digest)
        if digest in c.blobs:
            return c.blobs[digest]
        if digest in c.trees:
            return len(c.trees[digest])
        if digest in self.list_sizes:
            return self.list_sizes[digest]
        chunk_list = c.lists.get(digest)
        if chunk_list is None:
            raise _damaged(f"{what}: content {digest.hex()[:16]} is not in the bundle")
        if not chunk_list or len(chunk_list) % 32:
            raise _damaged(f"chunk list {digest.hex()[:16]} is malformed")
        total = 0
        for i in range(0, len(chunk_list), 32):
            chunk = chunk_list[i : i + 32]
            size = c.blobs.get(chunk)
            if size is None:
                raise _damaged(f"chunk {chunk.hex()[:16]} of {digest.hex()[:16]} is missing")
            self.used.add(chunk)
            self.chunks.add(chunk)
            total += size
            if total > self.restore_cap:  # stop counting: a list can name 8 M chunks
                raise _refused(
                    f"{what} would expand to more than {self.restore_cap} bytes "
                    f"({self._cap_rule()}): a decompression bomb?"
                )
        self.list_sizes[digest] = total
        return total

    def _tree(self, digest: bytes, depth: int) -> _TreeStats:
        """What a tree expands to. Memoised per digest, so a subtree named many times is checked
        once; its height and entry count keep the depth and entry limits true for every name
        it is reached by."""
        lim = self.limits
        known = self.tree_stats.get(digest)
        if known is None:
            if depth > lim.max_depth:
                raise _refused(f"directories nest deeper than {lim.max_depth} (--max-depth)")
            known = self._expand(digest, depth)
            self.tree_stats[digest] = known
        if depth + known.height > lim.max_depth:
            raise _refused(f"directories nest deeper than {lim.max_depth} (--max-depth)")
        return known

    def _expand(self, digest: bytes, depth: int) -> _TreeStats:
        content = self.c.trees.get(digest)
        if content is None:
            raise _damaged(f"tree {digest.hex()[:16]} is not in the bundle")
        self.used.add(digest)
        limit = self.limits.max_restore_entries
        files = nbytes = count = height = longest = 0
        entries = self.parsed.get(digest)
        for e in parse_tree(digest, content, limit) if entries is None else entries:
            count += 1
            longest = max(longest, len(e.name))
            if e.kind == "d":
                sub = self._tree(e.ref, depth + 1)
                files, nbytes = files + sub.files, nbytes + sub.bytes
                count += sub.entries
                height = max(height, sub.height + 1)
                if sub.longest:
                    longest = max(longest, len(e.name) + 1 + sub.longest)
            elif e.kind == "f":
                size = self._content_size(e.ref, f"file {e.name!r}")
                if size != e.size:
                    raise _damaged(f"file {e.name!r} declares {e.size} bytes, its content {size}")
                files, nbytes = files + 1, nbytes + size
            else:
                if e.size != len(e.ref):
                    raise _damaged(f"symlink {e.name!r} declares a wrong size")
                files += 1
            if count > limit:
                raise _too_many(limit)
        return _TreeStats(files, nbytes, count, height, longest)


@dataclass(frozen=True)
class _TreeStats:
    files: int
    """Files and symlinks (what a workspace record counts)."""
    bytes: int
    entries: int
    """Files, directories and symlinks below the tree."""
    height: int
    """Directory levels below the tree."""
    longest: int
    """Bytes of the longest path below the tree (``a/b/c``)."""
