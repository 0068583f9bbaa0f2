"""The live journal of a branch: reading it (chain-verified, typed once), appending to it, and
what it says - open decisions, the side-effect ledger, task statuses, the run's status."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from msgspec import UNSET

from .._ids import new_id
from .._runs import record_applies
from ..errors import ConflictError, IntegrityError, LeaseHeld, LeaseLost, UsageError
from ..integrity import EMPTY_CHAIN, message_chain
from ..metakeys import compensation_key, run_key
from ..model import LogRef, utc_now_iso
from ..redact import Redactor
from ..stores.base import LogAppend, LogInfo
from .entries import (
    CancelEntry,
    DecisionEntry,
    DoneEntry,
    EffectEntry,
    Entry,
    IntentEntry,
    JournalEntry,
    PlanEntry,
    RequestEntry,
    ResolveEntry,
    TaskEntry,
    decode,
    decode_rows,
    encode,
    encode_tree,
    to_tree,
)
from .results import Effect, Pending, Task

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["Journal", "common_prefix", "end_run", "fold_tasks"]


def compensation_pending(item: Mapping[str, Any]) -> Pending:
    """The in-doubt decision for a compensation that was running when the process died; its
    id is the compensated effect's idempotency key."""
    tool = f"compensation of {item['tool']}"
    return Pending("in_doubt", str(item["key"]), tool, item.get("args"), "compensation")


class Journal:
    """The live journal of one branch: the head checkpoint's entries plus a run's tail."""

    def __init__(self, session: Session, *, fresh: bool = False) -> None:
        self.session = session
        meta = session.store.meta
        head = session.head
        self.key = run_key(session.name, session.branch)
        raw = meta.get_meta(self.key)
        record: dict[str, Any] | None = json.loads(raw) if raw else None
        self.last_command: dict[str, Any] = {
            k: record[k] for k in ("argv", "cwd") if record is not None and k in record
        }
        if record is not None and not fresh and record_applies(record, head):
            self.record: dict[str, Any] | None = record
            log = str(record["log"])
            info = meta.log_info(log)
            if info is None:  # the run started but appended nothing yet
                self.new: LogInfo | None = LogInfo(
                    session.name, record["parent"], int(record["parent_len"]), 0
                )
                rows = self._rows(record["parent"], int(record["parent_len"]))
            else:
                self.new = None
                rows = self._rows(log, info.length)
            self.log: str | None = log
        else:
            self.record, self.log, self.new = None, None, None
            ref = head.journal if head is not None and not fresh else None
            rows = self._rows(ref.log, ref.length) if ref is not None else []
            if ref is not None and rows and rows[-1][0] != ref.hash:
                raise IntegrityError(f"journal log {ref.log} does not match checkpoint {head}")
        self.lock = threading.RLock()  # appends vs. a timer thread's checkpoint reading ref()
        self.after_append: Callable[[Entry], None] | None = None
        self.chains = [c for c, _ in rows]
        self.entries: list[JournalEntry] = decode_rows(rows, f"journal of {session.name!r}")
        self.fresh = fresh
        self.by_slot: dict[int, list[int]] = {}
        for i, e in enumerate(self.entries):
            self.by_slot.setdefault(e.slot, []).append(i)
        comp = meta.get_meta(compensation_key(session.name, session.branch))
        self.compensation: dict[str, Any] | None = json.loads(comp) if comp else None

    def _rows(self, log: str | None, length: int) -> list[tuple[str, bytes]]:
        """(chain hex, data) of the first ``length`` entries, chain-verified."""
        if log is None or length == 0:
            return []
        out = []
        chain = EMPTY_CHAIN
        for stored, data in self.session._message_rows(log, length):
            chain = message_chain(chain, data)
            if bytes.fromhex(chain) != stored:
                raise IntegrityError(f"journal log {log} is corrupt")
            out.append((chain, data))
        return out

    @property
    def live(self) -> bool:
        return self.record is not None

    def start(self, *, argv: list[str] | None = None, cwd: str | None = None) -> None:
        """Become the run that appends: a new log continuing the head's journal. Refused
        before anything runs while another worker holds the session's lease (a resumed run
        too: its steps and side effects need the lease as much as a new one's)."""
        self.session.check_may_write()
        if self.record is not None:
            return
        head = self.session.head
        ref = head.journal if head is not None and not self.fresh else None
        self.log = new_id()
        parent, parent_len = (ref.log, ref.length) if ref is not None else (None, 0)
        self.new = LogInfo(self.session.name, parent, parent_len, parent_len)
        self.record = {
            "log": self.log,
            "base": head.id if head is not None else None,
            "parent": parent,
            "parent_len": parent_len,
            "argv": argv if argv is not None else list(getattr(sys, "orig_argv", sys.argv)),
            "cwd": cwd if cwd is not None else os.getcwd(),
            "started": utc_now_iso(),
        }
        self.session.store.meta.set_meta(self.key, json.dumps(self.record))

    def ref(self) -> LogRef | None:
        """What a checkpoint taken now records as its journal."""
        with self.lock:
            return self._ref()

    def _ref(self) -> LogRef | None:
        if not self.entries:
            return None
        if self.new is not None:  # nothing appended to our own log: point at the parent's
            assert self.new.parent is not None
            return LogRef(self.new.parent, len(self.entries), self.chains[-1])
        assert self.log is not None
        return LogRef(self.log, len(self.entries), self.chains[-1])

    def append(self, entry: JournalEntry) -> int:
        """Durably append one entry; its index. ConflictError if another process appended."""
        with self.lock:
            return self._append(entry)

    def _append(self, entry: JournalEntry) -> int:
        if self.record is None:
            self.start()
        assert self.log is not None
        redactor = self.session.redactor
        if redactor is None:
            data = encode(entry)
        else:  # step results and arguments may hold secrets: the redactor sees the JSON object
            tree = to_tree(entry)
            scrubbed = redactor(tree)
            data = encode_tree(scrubbed)
            # What is kept in memory is what is stored: ours returns a copy when it changes
            # anything; a user's callable may have changed the object in place.
            if scrubbed is not tree or type(redactor) is not Redactor:
                try:
                    entry = decode(data, where="the redacted entry")
                except IntegrityError as exc:  # refused before it is journaled unreadable
                    raise UsageError(
                        f"the session's redactor broke a journal entry: {exc}"
                    ) from None
        prev = self.chains[-1] if self.chains else EMPTY_CHAIN
        chain = message_chain(prev, data)
        start = len(self.entries)
        try:
            self.session.store.meta.append_log(
                LogAppend(
                    self.log,
                    start,
                    [(bytes.fromhex(chain), data)],
                    self.new,
                    fence=self.session.fence,
                    session=self.session.name,
                )
            )
        except LeaseHeld:
            raise
        except LeaseLost as exc:
            if self.session.lease is not None:  # no later step body runs
                self.session.lease.mark_lost(str(exc))
            raise
        except ConflictError:
            raise ConflictError(
                f"session {self.session.name!r} branch {self.session.branch!r} is being run by "
                "another process (its journal moved); stop one of them"
            ) from None
        self.new = None
        self.entries.append(entry)
        self.chains.append(chain)
        self.by_slot.setdefault(entry.slot, []).append(start)
        if self.after_append is not None:
            self.after_append(entry)
        return start

    def slot(self, s: int) -> list[JournalEntry]:
        """The slot's entries since its last ``cancel`` (an operator's edit withdrew a pending
        approval request: the call asks again, with whatever arguments it now has)."""
        entries = [self.entries[i] for i in self.by_slot.get(s, ())]
        for i in range(len(entries) - 1, -1, -1):
            if type(entries[i]) is CancelEntry:
                return entries[i + 1 :]
        return entries

    def cancel_pending(
        self, why: str, *, command: Mapping[str, Any] | None = None
    ) -> list[Pending]:
        """Withdraw every unanswered approval request (their arguments may be stale now): each
        such call asks again, with whatever arguments it then has. A journal that no run is
        appending to (a new branch, a run a rewind ended) gets a run record first, carrying
        ``command`` (default: the branch's last recorded command)."""
        open_requests = [
            (s, p) for s, p in self.open_decisions() if s is not None and p.kind == "approval"
        ]
        if not open_requests:
            return []
        if not self.live:
            cmd = self.last_command if command is None else command
            self.start(argv=list(cmd.get("argv") or []), cwd=cmd.get("cwd"))
        for s, pending in open_requests:
            self.append(CancelEntry(slot=s, id=pending.id, why=why))
        return [p for _, p in open_requests]

    # -- derived views ----------------------------------------------------------------------
    def tasks(self, upto: int | None = None) -> list[Task]:
        return fold_tasks(self.entries[:upto])

    def pending(self) -> Pending | None:
        """The first decision the run is waiting for (see :meth:`open_decisions`), or None."""
        found = self.open_decisions()
        return found[0][1] if found else None

    def all_pending(self) -> list[Pending]:
        """Every decision the run is waiting for, in call order."""
        return [p for _, p in self.open_decisions()]

    def open_decisions(self) -> list[tuple[int | None, Pending]]:
        """(slot, decision) for each decision the run waits for: an unanswered approval
        request, or an effect whose outcome is unknown (the process died between intent and
        outcome) - at any slot, since concurrent async calls journal in any order. A
        compensation that was running when the process died comes first (slot None): it
        blocks the run before its first call."""
        out: list[tuple[int | None, Pending]] = []
        comp = self.compensation_in_doubt()
        if comp is not None:
            out.append((None, comp))
        if not self.entries or type(self.entries[-1]) is DoneEntry:
            return out
        for s in sorted(self.by_slot):
            entries = self.slot(s)
            if s < 0 or not entries:
                continue
            first, last = entries[0], entries[-1]
            if type(first) is RequestEntry:
                if not any(type(e) is DecisionEntry for e in entries[1:]):
                    p = Pending("approval", first.id, first.name, first.args, first.fingerprint)
                    out.append((s, p))
            elif type(first) is IntentEntry and type(last) is IntentEntry:
                p = Pending("in_doubt", last.key, last.name, last.args, last.fingerprint)
                out.append((s, p))
        return out

    def compensation_in_doubt(self) -> Pending | None:
        """A compensation whose intent is recorded but not its outcome, and no human decided."""
        plan = self.compensation
        running = plan.get("running") if plan is not None else None
        if not running or running.get("resolution") is not None:
            return None
        return compensation_pending(running)

    def effects(self, start: int = 0) -> list[Effect]:
        """The ledger from log position ``start``: each logical irreversible call once."""
        out: dict[str, Effect] = {}
        for pos in range(start, len(self.entries)):
            e = self.entries[pos]
            if type(e) is IntentEntry:
                out[e.key] = Effect(e.key, e.name, e.args, "in_doubt", None, pos)
            elif type(e) is EffectEntry:
                prev = out.get(e.key)
                status: Literal["done", "failed"] = "done" if e.ok else "failed"
                args = prev.args if prev is not None else None
                result = None if e.result is UNSET else e.result
                out[e.key] = Effect(e.key, e.name, args, status, result, pos)
            elif type(e) is ResolveEntry:
                out.pop(e.key, None)  # "it did not happen": retried under a new intent
        return [x for x in out.values() if x.status != "failed"]

    def status(self) -> str:
        if self.entries and type(self.entries[-1]) is DoneEntry:
            return "completed"
        p = self.pending()
        if p is not None:
            return "awaiting_approval" if p.kind == "approval" else "in_doubt"
        return "running" if self.live else ("idle" if not self.entries else "stopped")


def fold_tasks(entries: list[JournalEntry]) -> list[Task]:
    """Task statuses after these journal entries: the plan, then every status change."""
    tasks: dict[str, Task] = {}
    for e in entries:
        if type(e) is PlanEntry:
            for tid, title in e.tasks:
                tasks.setdefault(tid, Task(tid, title))
        elif type(e) is TaskEntry:
            t = tasks.setdefault(e.id, Task(e.id, e.id))
            t.status, t.note = e.status, e.note
    return list(tasks.values())


def end_run(session: Session) -> None:
    """The branch's run is over (a rewind moved its execution position): the next run starts
    a new journal from the head. The command that ran it is kept, for ``stashpoint resume``."""
    meta, key = session.store.meta, run_key(session.name, session.branch)
    raw = meta.get_meta(key)
    if raw is None:
        return
    record = json.loads(raw)
    if "log" in record:
        meta.set_meta(key, json.dumps({k: record[k] for k in ("argv", "cwd") if k in record}))


def common_prefix(a: Journal, ref: LogRef | None, session: Session) -> int:
    """How many leading entries journal ``a`` shares with the journal ``ref`` points at."""
    if ref is None:
        return 0
    n = min(ref.length, len(a.chains))
    if n == ref.length and n and a.chains[n - 1] == ref.hash:
        return n
    rows = session._message_rows(ref.log, ref.length)
    chain, k = EMPTY_CHAIN, 0
    for k in range(min(len(rows), len(a.chains))):
        chain = message_chain(chain, rows[k][1])
        if a.chains[k] != chain:
            return k
    return min(len(rows), len(a.chains))
