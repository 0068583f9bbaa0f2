"""Walk a whole store and report everything that does not verify (``stashpoint verify``).

Every record is checked against its digest and its parent link, every conversation and
durable-execution journal log against its running hash, every referenced blob against its
content digest. Shared objects are read once, so verifying N checkpoints of one workspace
costs about one read of the workspace, not N.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._fsutil import sweep_temp_files
from ._store import Problem, Store
from .errors import IntegrityError, NotFoundError, StashpointError
from .integrity import EMPTY_CHAIN, message_chain
from .model import Checkpoint
from .stores.base import LogInfo
from .workspace.tree import TreeReader

__all__ = ["VerifyReport", "verify_store"]

LISTED = 100
"""Damaged files named per checkpoint, the rest counted: a store whose objects were lost
would otherwise list every file of every checkpoint."""


@dataclass
class VerifyReport:
    checkpoints: int = 0
    pruned: int = 0
    """Checkpoints pruned by retention: record and chain link checked, contents not (GC may
    have freed them)."""
    blobs: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checkpoints": self.checkpoints,
            "pruned": self.pruned,
            "blobs": self.blobs,
            "bytes": self.bytes,
            "problems": [p.to_dict() for p in self.problems],
        }


class _Verifier:
    def __init__(self, store: Store, progress: Callable[[int, int], None] | None) -> None:
        self.store = store
        self.report = VerifyReport()
        self.progress = progress
        self.reader = TreeReader(store.blobs)
        self.seen_blobs: dict[bytes, str | None] = {}  # digest -> error message or None
        self.seen_trees: dict[bytes, tuple[list[tuple[str, str]], int]] = {}
        self.logs: dict[str, LogInfo] = dict(store.meta.iter_logs())
        self.chains: dict[str, list[str] | str] = {}  # log -> chain hex per own row, or error

    def problem(self, message: str, cp: str | None = None, session: str | None = None) -> None:
        self.report.problems.append(Problem(message, cp, session))

    def run(self) -> VerifyReport:
        sessions = self.store.meta.sessions()
        for session in sessions:
            self.session(session)
        witness = self.store.witness
        if witness is not None:
            for s, b in sorted(witness.heads):
                if s not in sessions:
                    lag = witness.lag(s, b, None, None)
                    if lag is not None:
                        self.problem(lag.message, lag.seen_head, s)
        return self.report

    def session(self, name: str) -> None:
        rows = self.store.meta.list_checkpoints(name)
        by_id = {r.id: r for r in rows}
        pruned = self.store.meta.pruned(name)
        for row in rows:
            self.report.checkpoints += 1
            try:
                cp = self.store.open_row(row)
            except StashpointError as exc:
                self.problem(str(exc), row.id, name)
                continue
            if cp.parent is not None:
                prow = by_id.get(cp.parent) or self.store.meta.get_checkpoint(cp.parent)
                if prow is None:
                    self.problem(
                        f"checkpoint {cp.id} is broken: its parent {cp.parent} is missing",
                        cp.id,
                        name,
                    )
                elif prow.digest != cp.parent_digest:
                    self.problem(
                        f"checkpoint {cp.id} is broken: its parent {cp.parent} was altered",
                        cp.id,
                        name,
                    )
            if cp.id in pruned:
                self.report.pruned += 1
                continue
            before = len(self.report.problems)
            self.contents(cp)
            if len(self.report.problems) > before and cp.id in self.store.meta.pruned(name):
                del self.report.problems[before:]  # pruned (and collected) while we looked
                self.report.pruned += 1
        self.refs(name, by_id)

    def refs(self, name: str, by_id: dict[str, Any]) -> None:
        """Every head and label: its MAC (keyed), its target, and the rollback witness."""
        refs = self.store.refs
        witness = self.store.witness
        heads = refs.inner.head_rows(name)
        for branch, (head, auth) in heads.items():
            try:
                seq = refs.signer.check("head", name, branch, head, auth)
            except IntegrityError as exc:
                self.problem(str(exc), head, name)
                continue
            if head not in by_id:
                self.problem(
                    f"branch {branch!r} of session {name!r} points to missing checkpoint {head}",
                    head,
                    name,
                )
            lag = witness.lag(name, branch, head, seq) if witness is not None else None
            if lag is not None:
                self.problem(lag.message, head, name)
        if witness is not None:
            for s, b in sorted(witness.heads):
                if s == name and b not in heads:
                    lag = witness.lag(s, b, None, None)
                    if lag is not None:
                        self.problem(lag.message, lag.seen_head, name)
        for ident, (label, auth) in refs.inner.label_rows(name).items():
            try:
                refs.signer.check("label", name, label, ident, auth)
            except IntegrityError as exc:
                self.problem(str(exc), ident, name)
                continue
            if ident not in by_id:
                self.problem(f"label {label!r} is on missing checkpoint {ident}", ident, name)

    def contents(self, cp: Checkpoint) -> None:
        for what, ref in (("conversation", cp.state.conversation), ("journal", cp.journal)):
            if ref is not None:
                err = self.conversation(ref.log, ref.length, ref.hash)
                if err:
                    err = err.replace("conversation log", f"{what} log")
                    self.problem(f"checkpoint {cp.id}: {err}", cp.id, cp.session)
        for key, hexd in cp.state.values.items():
            err = self.blob(bytes.fromhex(hexd))
            if err:
                self.problem(f"checkpoint {cp.id}: state value {key!r}: {err}", cp.id, cp.session)
        if cp.workspace is not None:
            damaged, count = self.tree(bytes.fromhex(cp.workspace.tree))
            for path, err in damaged:
                where = f"{path}: " if path else ""
                self.problem(f"checkpoint {cp.id}: workspace: {where}{err}", cp.id, cp.session)
            if count > len(damaged):
                self.problem(
                    f"checkpoint {cp.id}: workspace: {count - len(damaged)} more damaged "
                    f"file(s) (the first {len(damaged)} are named)",
                    cp.id,
                    cp.session,
                )
        for name, art in cp.artifacts.items():
            err = self.blob(bytes.fromhex(art.digest))
            if err:
                self.problem(f"checkpoint {cp.id}: artifact {name!r}: {err}", cp.id, cp.session)

    def blob(self, digest: bytes) -> str | None:
        if digest in self.seen_blobs:
            return self.seen_blobs[digest]
        err = None
        try:
            for part in self.store.blobs.iter_content(digest):
                self.report.bytes += len(part)
            self.report.blobs += 1
        except (IntegrityError, NotFoundError) as exc:
            err = str(exc)
        self.seen_blobs[digest] = err
        if self.progress is not None:
            self.progress(self.report.blobs, self.report.bytes)
        return err

    def tree(self, digest: bytes) -> tuple[list[tuple[str, str]], int]:
        """The damaged entries below a directory: (path, why) for the first ``LISTED`` of them
        (a path of "" is the directory object itself), and how many there are in all."""
        seen = self.seen_trees.get(digest)
        if seen is not None:
            return seen
        damaged: list[tuple[str, str]] = []
        count = 0
        try:
            entries = self.reader.load(digest)
            self.report.blobs += 1
            for e in entries.values():
                name = e.name.decode("utf-8", "replace")
                if e.kind == "d":
                    below, n = self.tree(e.ref)
                    count += n
                    damaged += [(f"{name}/{p}" if p else name, why) for p, why in below]
                elif e.kind == "f":
                    err = self.blob(e.ref)
                    if err is not None:
                        count += 1
                        damaged.append((name, err))
                del damaged[LISTED:]
        except (IntegrityError, NotFoundError) as exc:
            damaged, count = [("", str(exc))], 1
        self.seen_trees[digest] = (damaged, count)
        return damaged, count

    def conversation(self, log: str, length: int, expected: str) -> str | None:
        """None if the first ``length`` messages of ``log`` hash to ``expected``, else why not."""
        try:
            got = self.chain_at(log, length)
        except _Broken as exc:
            return str(exc)
        return None if got == expected else f"conversation log {log} does not match its hash"

    def chain_at(self, log: str, length: int, depth: int = 0) -> str:
        """Running hash after ``length`` messages of ``log``, following fork parents; every
        log's rows are read and checked once."""
        if length == 0:
            return EMPTY_CHAIN
        info = self.logs.get(log)
        if info is None or depth > 10_000:
            raise _Broken(f"conversation log {log} is missing")
        start = info.parent_len if info.parent is not None else 0
        if length <= start:
            assert info.parent is not None
            return self.chain_at(info.parent, length, depth + 1)
        chains = self.chains.get(log)
        if chains is None:
            chains = self.chains[log] = self._own_chains(log, info, start, depth)
        if isinstance(chains, str):
            raise _Broken(chains)
        if length - 1 - start >= len(chains):
            raise _Broken(f"conversation log {log} is missing messages")
        return chains[length - 1 - start]

    def _own_chains(self, log: str, info: LogInfo, start: int, depth: int) -> list[str] | str:
        """The running hash after each of the log's own messages, or what is wrong with them."""
        try:
            chain = self.chain_at(info.parent, start, depth + 1) if info.parent else EMPTY_CHAIN
        except _Broken as exc:
            return str(exc)
        out: list[str] = []
        try:
            rows = self.store.meta.read_messages(log, start, info.length)
        except IntegrityError as exc:  # an encrypted entry that will not decrypt
            return str(exc)
        for i, row in enumerate(rows):
            if row.idx != start + i:
                return f"conversation log {log} has missing messages"
            chain = message_chain(chain, row.data)
            if bytes.fromhex(chain) != row.chain:
                return f"conversation log {log} is corrupt at message {row.idx}"
            out.append(chain)
        return out


class _Broken(Exception):
    """Internal: a conversation log that cannot be verified, with the reason."""


def verify_store(store: Store, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    # A mirrored store is judged on its primary: its fallback reads would hide the damage.
    store = getattr(store, "primary", store)
    if store.home is not None:
        sweep_temp_files(store.home)  # leftovers of writers killed mid-write are not damage
    return _Verifier(store, progress).run()
