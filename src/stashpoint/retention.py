"""Retention as data: which checkpoints to keep, which to prune, and why.

:func:`plan` is a pure function of a session's records, labels and branch heads and a
:class:`Policy`; it decides nothing on its own clock (``now`` is an argument) and writes
nothing, so a plan can be printed, tested and reviewed before :func:`apply` carries it out.

Pruning never deletes a record. Every checkpoint's digest covers its parent's digest, so
removing a record would break the chain of every kept descendant. Instead a *pruned mark* is
stored beside the record (``MetadataStore.mark_pruned``): the record, its id, parent link and
metadata stay and still verify, while its *contents* (state values, workspace tree,
conversation and journal logs) stop counting as references, so :mod:`stashpoint.gc` frees
whatever only pruned records used. That is what lets a 24 h or last-N policy free space on a
purely linear history. Reading a pruned checkpoint's state or files raises
:class:`PrunedError` (see :func:`check_not_pruned`).

Whatever something still needs is always kept: every branch head, the checkpoint a live
durable run started from, and both ends of a rewind a crash interrupted.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import metakeys
from ._store import check_not_pruned
from .errors import IntegrityError, PrunedError, UsageError
from .model import Checkpoint, utc_now_iso

if TYPE_CHECKING:
    from ._store import Store

__all__ = [
    "DEFAULT_POLICY",
    "Plan",
    "Policy",
    "PrunedError",
    "apply",
    "check_not_pruned",
    "is_pruned",
    "parse_duration",
    "plan",
    "plan_session",
    "protected_checkpoints",
]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> dt.timedelta:
    """``90s``, ``30m``, ``24h``, ``7d``, ``2w`` or a sum such as ``1d12h``."""
    cleaned = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(cleaned)
    if not cleaned or "".join(n + u for n, u in parts) != cleaned:
        raise UsageError(f"bad duration {text!r}: use e.g. 90s, 30m, 24h, 7d, 2w or 1d12h")
    return dt.timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


@dataclass(frozen=True)
class Policy:
    """What to keep; a checkpoint is kept when any rule keeps it (rules combine by OR).

    Heads, live runs' starting points and interrupted rewinds are always kept.
    """

    keep_within: dt.timedelta | None = None
    """Keep checkpoints created less than this long ago."""
    keep_last: int | None = None
    """Keep the newest N checkpoints recorded on each branch."""
    keep_labelled: bool = True
    """Keep labelled (named) checkpoints and milestones."""

    def __post_init__(self) -> None:
        if self.keep_last is not None and self.keep_last < 0:
            raise UsageError("keep_last must be 0 or more")
        if self.keep_within is not None and self.keep_within < dt.timedelta(0):
            raise UsageError("keep_within must not be negative")

    @classmethod
    def of(
        cls,
        keep_within: str | dt.timedelta | None = None,
        keep_last: int | None = None,
        keep_labelled: bool = True,
    ) -> Policy:
        within = parse_duration(keep_within) if isinstance(keep_within, str) else keep_within
        return cls(within, keep_last, keep_labelled)

    def to_dict(self) -> dict[str, Any]:
        return {
            "keep_within": _format_duration(self.keep_within) if self.keep_within else None,
            "keep_last": self.keep_last,
            "keep_labelled": self.keep_labelled,
        }


DEFAULT_POLICY = Policy(keep_within=dt.timedelta(days=7), keep_last=100)
"""A week of history and the last 100 checkpoints of each branch, plus every labelled one and
milestone: what ``stashpoint prune`` applies when given no rule."""


@dataclass
class Plan:
    """The outcome of a policy for one session: kept ids with their reasons, and the rest."""

    session: str
    policy: Policy
    keep: dict[str, list[str]] = field(default_factory=dict)
    """Checkpoint id -> the rules that keep it (``head``, ``within``, ``last``,
    ``labelled``, ``milestone``, ``run``, ``restore``); newest first."""
    remove: list[str] = field(default_factory=list)
    """Ids to prune, newest first."""
    already: list[str] = field(default_factory=list)
    """Ids pruned before (a prune is not undone: GC may have freed their contents)."""
    records: dict[str, Checkpoint] = field(default_factory=dict, repr=False)

    def to_dict(self, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
        labels = labels or {}

        def item(ident: str) -> dict[str, Any]:
            cp = self.records.get(ident)
            out: dict[str, Any] = {"id": ident}
            if cp is not None:
                out.update(
                    branch=cp.branch,
                    step=cp.step,
                    kind=cp.kind,
                    label=labels.get(ident),
                    created_at=cp.created_at,
                )
            return out

        return {
            "session": self.session,
            "policy": self.policy.to_dict(),
            "keep": [{**item(i), "reasons": r} for i, r in self.keep.items()],
            "remove": [item(i) for i in self.remove],
            "already_pruned": len(self.already),
        }


def plan(
    records: Iterable[Checkpoint],
    policy: Policy,
    *,
    now: dt.datetime,
    heads: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    pruned: Collection[str] = (),
    protected: Mapping[str, str] | None = None,
    session: str = "",
) -> Plan:
    """Decide, for one session's records, what ``policy`` keeps and what it prunes.

    ``heads`` maps branch -> head id, ``labels`` id -> current label, ``pruned`` the ids
    pruned already and ``protected`` id -> reason for checkpoints something else still needs.
    """
    heads = heads or {}
    labels = labels or {}
    protected = protected or {}
    cps = sorted(records, key=lambda c: c.id, reverse=True)
    out = Plan(session, policy, records={c.id: c for c in cps})
    head_ids = set(heads.values())
    last: set[str] = set()
    if policy.keep_last:
        per_branch: dict[str, int] = {}
        for cp in cps:
            n = per_branch.get(cp.branch, 0)
            if n < policy.keep_last:
                last.add(cp.id)
            per_branch[cp.branch] = n + 1
    since = now - policy.keep_within if policy.keep_within is not None else None
    for cp in cps:
        if cp.id in pruned:
            out.already.append(cp.id)
            continue
        reasons = []
        if cp.id in head_ids:
            reasons.append("head")
        if cp.id in protected:
            reasons.append(protected[cp.id])
        if since is not None and cp.created >= since:
            reasons.append("within")
        if cp.id in last:
            reasons.append("last")
        if policy.keep_labelled and labels.get(cp.id):
            reasons.append("labelled")
        if policy.keep_labelled and cp.kind == "milestone":
            reasons.append("milestone")
        if reasons:
            out.keep[cp.id] = reasons
        else:
            out.remove.append(cp.id)
    return out


def protected_checkpoints(store: Store, session: str) -> dict[str, str]:
    """Checkpoints of ``session`` that something outside the history still needs: the start
    of a live durable run (``run``) and both ends of an interrupted rewind (``restore``)."""
    out: dict[str, str] = {}
    for _key, raw in store.meta.iter_meta(metakeys.run_key(session, "")):  # all branches
        rec = _json(raw)
        if isinstance(rec.get("base"), str):
            out[rec["base"]] = "run"
    for _key, raw in store.meta.iter_meta(metakeys.RESTORE_JOURNAL):
        rec = _json(raw)
        if rec.get("session") == session:
            for k in ("target", "safety"):
                if isinstance(rec.get(k), str):
                    out[rec[k]] = "restore"
    return out


def plan_session(
    store: Store, session: str, policy: Policy, *, now: dt.datetime | None = None
) -> Plan:
    """Read a session's records from the store (each verified) and plan them.

    A record that does not verify is kept (reason ``damaged``): pruning must not be the step
    that makes damage harder to investigate. ``stashpoint verify`` names it.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    records = []
    damaged: dict[str, str] = {}
    for row in store.meta.list_checkpoints(session):
        try:
            records.append(store.open_row(row))
        except IntegrityError:
            damaged[row.id] = "damaged"
    result = plan(
        records,
        policy,
        now=now,
        heads=store.meta.branches(session),
        labels=store.meta.labels(session),
        pruned=set(store.meta.pruned(session)),
        protected=protected_checkpoints(store, session),
        session=session,
    )
    for ident, reason in damaged.items():
        result.keep[ident] = [reason]
    return result


def apply(store: Store, p: Plan) -> list[str]:
    """Mark the plan's removals pruned; returns those marked. A checkpoint that became a
    branch head since the plan was made is skipped (atomically, by the store)."""
    return store.meta.mark_pruned(p.session, p.remove, utc_now_iso()) if p.remove else []


def is_pruned(store: Store, ident: str, session: str) -> bool:
    return ident in store.meta.pruned(session)


def _json(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _format_duration(d: dt.timedelta) -> str:
    seconds = int(d.total_seconds())
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
