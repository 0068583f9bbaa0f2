"""The journal's entries: one msgspec Struct per kind, a tagged union on the wire key ``k``.

The wire keys are short (``s``, ``n``, ``fp``, ...) because a journal holds an entry per
durable call and every one is stored, hashed and shipped in bundles; the attribute names say
what they are. The JSON a Struct encodes to is, byte for byte, what the untyped entries of
earlier versions were: the same keys in the same order, a key that was written only
sometimes left out (``UNSET``) exactly when it was, and a ``null`` kept where it was
written. Stores written before and after this module read back alike, in both directions.

Entries (``k`` is the kind, ``s`` the slot)::

    step      n, fp, [sub], ok, r | e              a step's result or error
    intent    n, fp, key, a, t                     an irreversible tool is about to run
    effect    n, key, [by], t, [sub], ok, r | e, [x]
                                                   what it did (or a human's "it happened" /
                                                   "reject"); ``x``: its result was not
                                                   recordable
    resolve   key, outcome=retry, by, why, t       a human said an in-doubt effect did not
                                                   happen: run again
    request   n, fp, id, a                         an approval-gated tool asks for a decision
    decision  id, fp, approved, why, by, t         the decision (``approve`` / ``reject``)
    cancel    [id], why                            the slot's earlier entries are withdrawn:
                                                   the call asks again
    plan      n=plan, fp, tasks                    the task list
    task      n=task, fp, id, status, note, [auto] a task changed status
    done      ok, r                                the run's return value

``sub`` lists the slots a step's or tool's body took (nested durable calls), so a replay
that skips the body skips them too.
"""

from __future__ import annotations

import builtins
import hashlib
from collections.abc import Mapping
from typing import Any, ClassVar, TypeAlias, cast

import msgspec
from msgspec import UNSET, UnsetType, field

from .. import serde
from ..errors import IntegrityError, StashpointError, StepFailed, ToolRejected

__all__ = [
    "Call",
    "CancelEntry",
    "DecisionEntry",
    "DoneEntry",
    "EffectEntry",
    "Entry",
    "ErrorInfo",
    "IntentEntry",
    "JournalEntry",
    "PlanEntry",
    "RequestEntry",
    "ResolveEntry",
    "StepEntry",
    "TaskEntry",
    "decode",
    "decode_rows",
    "encode",
    "encode_tree",
    "to_tree",
]

TOOL_REJECTED = "stashpoint.durable.ToolRejected"
"""The type name a rejection is recorded under (it predates ``errors.py``; kept so that
journals written before and after read the same)."""


class ErrorInfo(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """An exception as recorded: its qualified type name and message (a rejection: the tool
    and the reason too). Replays rebuild it without importing anything named here."""

    type: str = ""
    message: str = ""
    tool: str | UnsetType = UNSET
    reason: str | UnsetType | None = UNSET

    @classmethod
    def of(cls, exc: BaseException) -> ErrorInfo:
        t = type(exc)
        return cls(type=f"{t.__module__}.{t.__qualname__}", message=str(exc))

    def rebuild(self) -> BaseException:
        """The recorded error again: builtin exception types by name, a rejection as
        :class:`ToolRejected`, anything else as :class:`StepFailed` (never importing or
        instantiating a class named by stored data)."""
        module, _, name = self.type.rpartition(".")
        if module == "builtins" and name in _BUILTIN_ERRORS:
            return _BUILTIN_ERRORS[name](self.message)
        if self.type == TOOL_REJECTED:
            tool = self.tool if isinstance(self.tool, str) else ""
            reason = self.reason if not isinstance(self.reason, UnsetType) else None
            return ToolRejected(self.message, tool=tool, reason=reason)
        return StepFailed(f"{self.type}: {self.message}", type_name=self.type)


_BUILTIN_ERRORS = {
    name: obj
    for name, obj in vars(builtins).items()
    if isinstance(obj, type) and issubclass(obj, Exception)
}


class Entry(msgspec.Struct, tag_field="k", kw_only=True, frozen=True, gc=False):
    """What every entry has: the slot (call number) it belongs to."""

    kind: ClassVar[str]
    slot: int = field(name="s")

    @property
    def subject(self) -> str:
        """What a divergence message names: the call's name or the decision's id."""
        return ""


class Call(Entry, kw_only=True, frozen=True, gc=False):
    """The first entry of a durable call's slot: which call it was and with what arguments
    (their fingerprint), so that a replay can tell the program now makes another call."""

    name: str = field(name="n")
    fingerprint: str = field(name="fp")

    @property
    def subject(self) -> str:
        return self.name


class StepEntry(Call, tag="step", kw_only=True, frozen=True, gc=False):
    """A step's (or a reversible tool's) result or error."""

    kind: ClassVar[str] = "step"
    nested: list[int] | UnsetType = field(default=UNSET, name="sub")
    ok: bool
    result: Any = field(default=UNSET, name="r")
    error: ErrorInfo | UnsetType = field(default=UNSET, name="e")


class RequestEntry(Call, tag="request", kw_only=True, frozen=True, gc=False):
    """An approval-gated tool asks for a decision on these arguments."""

    kind: ClassVar[str] = "request"
    id: str
    args: Any = field(name="a")


class IntentEntry(Call, tag="intent", kw_only=True, frozen=True, gc=False):
    """An irreversible tool is about to run: the ledger's "in doubt" until its outcome."""

    kind: ClassVar[str] = "intent"
    key: str
    """The idempotency key, the same across retries of one logical call."""
    args: Any = field(name="a")
    at: str | UnsetType = field(default=UNSET, name="t")


class EffectEntry(Entry, tag="effect", kw_only=True, frozen=True, gc=False):
    """What an irreversible tool did, or what a human said it did (``by``)."""

    kind: ClassVar[str] = "effect"
    name: str = field(name="n")
    key: str
    by: str | UnsetType = UNSET
    at: str | UnsetType = field(default=UNSET, name="t")
    nested: list[int] | UnsetType = field(default=UNSET, name="sub")
    ok: bool
    result: Any = field(default=UNSET, name="r")
    error: ErrorInfo | UnsetType = field(default=UNSET, name="e")
    unrecorded: str | UnsetType = field(default=UNSET, name="x")
    """Why its result could not be recorded (it happened; a replay fails with this)."""

    @property
    def subject(self) -> str:
        return self.name


class ResolveEntry(Entry, tag="resolve", kw_only=True, frozen=True, gc=False):
    """A human said an in-doubt effect did not happen: it runs again, under the same key."""

    kind: ClassVar[str] = "resolve"
    key: str
    outcome: str = "retry"
    by: str | None = None
    why: str | None = None
    at: str | UnsetType = field(default=UNSET, name="t")


class DecisionEntry(Entry, tag="decision", kw_only=True, frozen=True, gc=False):
    """A human's decision on an approval request, bound to the arguments it was asked for."""

    kind: ClassVar[str] = "decision"
    id: str
    fingerprint: str = field(name="fp")
    approved: bool
    why: str | None = None
    by: str | None = None
    at: str | UnsetType = field(default=UNSET, name="t")

    @property
    def subject(self) -> str:
        return self.id


class CancelEntry(Entry, tag="cancel", kw_only=True, frozen=True, gc=False):
    """The slot's earlier entries are withdrawn: the call is made afresh."""

    kind: ClassVar[str] = "cancel"
    id: str | UnsetType = UNSET
    why: str | None = None

    @property
    def subject(self) -> str:
        return self.id if isinstance(self.id, str) else ""


class PlanEntry(Call, tag="plan", kw_only=True, frozen=True, gc=False):
    """The task list, as (id, title) pairs."""

    kind: ClassVar[str] = "plan"
    tasks: list[tuple[str, str]] = field(default_factory=list)


class TaskEntry(Call, tag="task", kw_only=True, frozen=True, gc=False):
    """A task changed status; ``auto``: written on the way out of a failing program."""

    kind: ClassVar[str] = "task"
    id: str
    status: str
    note: str | None = None
    auto: bool | UnsetType = UNSET


class DoneEntry(Entry, tag="done", kw_only=True, frozen=True, gc=False):
    """The run's return value (None if it was not encodable)."""

    kind: ClassVar[str] = "done"
    ok: bool = True
    result: Any = field(default=None, name="r")


JournalEntry: TypeAlias = (
    StepEntry
    | RequestEntry
    | IntentEntry
    | EffectEntry
    | ResolveEntry
    | DecisionEntry
    | CancelEntry
    | PlanEntry
    | TaskEntry
    | DoneEntry
)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(JournalEntry)


def encode(entry: Entry) -> bytes:
    return _encoder.encode(entry)


def decode(data: bytes, *, where: str = "journal") -> JournalEntry:
    """One stored entry, typed. IntegrityError if it is not an entry this version knows."""
    try:
        return cast(JournalEntry, _decoder.decode(data))
    except msgspec.DecodeError as exc:  # ValidationError too
        raise IntegrityError(f"{where}: not a journal entry: {exc}") from None


def decode_rows(rows: list[tuple[Any, bytes]], where: str) -> list[JournalEntry]:
    """The entries of (chain, data) rows, typed; decoded once, where the journal is read."""
    dec = _decoder.decode
    try:
        return [dec(d) for _, d in rows]
    except msgspec.DecodeError:
        return [decode(d, where=f"{where} entry {i}") for i, (_, d) in enumerate(rows)]


def to_tree(entry: Entry) -> dict[str, Any]:
    """The entry as the JSON object it is stored as (wire keys, in order): what a redactor
    sees."""
    return msgspec.to_builtins(entry)  # type: ignore[no-any-return]


def encode_tree(tree: Any) -> bytes:
    """A (redacted) entry's JSON object, encoded as the entry itself would be."""
    return _encoder.encode(tree)


# -- arguments and errors as recorded ---------------------------------------------------------
def fingerprint(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """A digest of a call's arguments; arguments stashpoint cannot encode count by type only."""
    try:
        tree = [serde.to_tree(list(args)), serde.to_tree(dict(kwargs))]
    except StashpointError:
        tree = [[loose(a) for a in args], {k: loose(v) for k, v in sorted(kwargs.items())}]
    data = msgspec.json.encode([name, tree], order="sorted")
    return hashlib.sha256(data).hexdigest()[:32]


def loose(value: Any) -> Any:
    """``value`` as a tree, or (not encodable) a placeholder naming its type."""
    try:
        return serde.to_tree(value)
    except StashpointError:
        t = type(value)
        return {"~type": f"{t.__module__}.{t.__qualname__}"}
