"""Automatic upkeep: retention on by default, with a size budget.

Shadow-git checkpoint stores grow without bound until a user finds 100 GB in a hidden
directory. A stashpoint store keeps itself in check instead: once a day (by default), when a
store that wrote checkpoints is closed, every session is pruned by the store's retention
policy (default: keep a week, the last 100 checkpoints of each branch, every labelled one and
milestone, every branch head) and garbage is collected. If what the kept checkpoints
reference is still over the size budget (default 10 GiB), the policy is tightened round by
round - the time window is dropped, then the per-branch count halved - until the store fits or
only heads, labelled checkpoints and milestones are left, which are never pruned
automatically (a warning then says so).

The policy lives in the store (``stashpoint prune --save …``; ``--save --off`` turns upkeep
off), so every process and the CLI share it. Upkeep never fails what triggered it: a failure
is logged and retried at the next close.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import metakeys
from .errors import GcBusy, LeaseHeld, StashpointError, UsageError
from .retention import DEFAULT_POLICY, Policy, apply, parse_duration, plan_session

if TYPE_CHECKING:
    import logging

    from ._store import Store
    from .gc import GcReport

__all__ = [
    "DEFAULT_BUDGET",
    "Upkeep",
    "UpkeepReport",
    "due",
    "load",
    "parse_size",
    "run",
    "save",
    "tightened",
]

UPKEEP_META = metakeys.UPKEEP
"""Store meta key holding the policy (JSON)."""
LAST_META = metakeys.UPKEEP_LAST
"""Store meta key: when upkeep last ran (seconds since the epoch), or was first scheduled."""
DEFAULT_BUDGET = 10 << 30
DEFAULT_EVERY = dt.timedelta(days=1)


def _log() -> logging.Logger:
    """The ``stashpoint`` logger, imported when there is something to say: ``logging`` costs
    every CLI run ~5 ms (store.close() loads this module to see whether upkeep is due)."""
    import logging

    return logging.getLogger("stashpoint")


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)", re.IGNORECASE)
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``500M``, ``10GiB``, ``2g``, ``1.5T`` or plain bytes (binary units)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"bad size {text!r}: use e.g. 500M, 10GiB or 2T")
    return int(float(match.group(1)) * _SCALE[match.group(2).lower()])


def format_size(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class Upkeep:
    """A store's automatic upkeep: what to keep, how big it may grow, how often to check."""

    policy: Policy = DEFAULT_POLICY
    max_bytes: int | None = DEFAULT_BUDGET
    """Budget for what kept checkpoints reference (stored, compressed bytes); None: none."""
    every: dt.timedelta = DEFAULT_EVERY
    enabled: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.policy.to_dict(),
            "max_bytes": self.max_bytes,
            "every": int(self.every.total_seconds()),
            "enabled": self.enabled,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Upkeep:
        within = data.get("keep_within")
        policy = Policy.of(
            within if isinstance(within, str) else None,
            data.get("keep_last") if isinstance(data.get("keep_last"), int) else None,
            bool(data.get("keep_labelled", True)),
        )
        budget = data.get("max_bytes")
        every = data.get("every")
        return cls(
            policy,
            budget if isinstance(budget, int) and budget > 0 else None,
            dt.timedelta(seconds=every)
            if isinstance(every, int | float) and every > 0
            else DEFAULT_EVERY,
            bool(data.get("enabled", True)),
        )

    def describe(self) -> str:
        if not self.enabled:
            return "off"
        p = self.policy.to_dict()
        rules = [f"keep {p['keep_within']}" if p["keep_within"] else None]
        rules.append(f"last {p['keep_last']} per branch" if p["keep_last"] else None)
        rules.append("labelled and milestones" if p["keep_labelled"] else None)
        budget = format_size(self.max_bytes) if self.max_bytes else "no size budget"
        every = _duration(self.every)
        return f"{', '.join(r for r in rules if r)}; {budget}; checked every {every}"


def load(store: Store) -> Upkeep:
    raw = store.meta.get_meta(UPKEEP_META)
    if raw is None:
        return Upkeep()
    try:
        data = json.loads(raw)
    except ValueError:
        return Upkeep()
    return Upkeep.from_dict(data) if isinstance(data, dict) else Upkeep()


def save(store: Store, upkeep: Upkeep) -> None:
    store.meta.set_meta(UPKEEP_META, json.dumps(upkeep.to_dict(), sort_keys=True))


def due(store: Store, upkeep: Upkeep | None = None, now: float | None = None) -> bool:
    """Whether automatic upkeep should run now. A store's first check only schedules the
    next one, a period later: a new store has nothing to prune."""
    upkeep = upkeep or load(store)
    if not upkeep.enabled:
        return False
    now = time.time() if now is None else now
    raw = store.meta.get_meta(LAST_META)
    try:
        last = float(raw) if raw is not None else None
    except ValueError:
        last = None
    if last is None:
        store.meta.set_meta(LAST_META, repr(now))
        return False
    return now - last >= upkeep.every.total_seconds()


def claim_due(store: Store, upkeep: Upkeep | None = None) -> bool:
    """Whether upkeep is due, marking it as run if so: the caller hands it to a background
    process, and the commands that follow meanwhile must not start another."""
    if not due(store, upkeep):
        return False
    store.meta.set_meta(LAST_META, repr(time.time()))
    return True


def tightened(policy: Policy) -> Iterator[Policy]:
    """Ever tighter versions of ``policy`` for a store over budget: without its time window,
    then with half as many per branch each round, down to one (the head). Labelled
    checkpoints and milestones stay kept: only a person prunes those."""
    last = policy.keep_last or 64
    while True:
        last = max(1, last // 2) if last > 1 else 1
        yield Policy(None, last, policy.keep_labelled)
        if last == 1:
            return


@dataclass
class UpkeepReport:
    pruned: dict[str, int] = field(default_factory=dict)
    """Session -> checkpoints pruned by this run."""
    rounds: int = 0
    """Budget rounds needed beyond the store's policy."""
    kept_bytes: int = 0
    """What kept checkpoints reference after the run."""
    max_bytes: int | None = None
    freed_bytes: int = 0
    pending_bytes: int = 0
    """Condemned, freed by a later run once other processes are done (GC's grace period)."""
    over_budget: bool = False
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _prune_all(store: Store, policy: Policy, dry_run: bool, report: UpkeepReport) -> int:
    total = 0
    for name in store.sessions():
        p = plan_session(store, name, policy)
        try:
            done = p.remove if dry_run else apply(store, p)
        except LeaseHeld:  # a worker owns it now: its turn comes at the next upkeep
            continue
        if done:
            report.pruned[name] = report.pruned.get(name, 0) + len(done)
            total += len(done)
    return total


def run(store: Store, upkeep: Upkeep | None = None, *, dry_run: bool = False) -> UpkeepReport:
    """Prune every session by the policy, collect garbage, and tighten until within budget.

    With ``dry_run`` only the policy's own plan is reported (what the budget would prune
    depends on what GC frees, which a dry run does not know)."""
    from .gc import collect

    upkeep = upkeep or load(store)
    report = UpkeepReport(max_bytes=upkeep.max_bytes, dry_run=dry_run)
    _prune_all(store, upkeep.policy, dry_run, report)
    if dry_run:
        return report
    # Rescheduled before the slow part, so that stores closing meanwhile do not start it
    # again; put back if it fails, so that the next close retries instead of a period later.
    previous = store.meta.get_meta(LAST_META)
    store.meta.set_meta(LAST_META, repr(time.time()))
    try:
        gc = collect(store)
        _account(report, gc)
        if upkeep.max_bytes is not None:
            for policy in tightened(upkeep.policy):
                if report.kept_bytes <= upkeep.max_bytes:
                    break
                report.rounds += 1
                if _prune_all(store, policy, False, report):
                    gc = collect(store)
                    _account(report, gc)
            report.over_budget = report.kept_bytes > upkeep.max_bytes
            if report.over_budget:
                _log().warning(
                    "stashpoint store %s: kept checkpoints reference %s, over its %s budget, with "
                    "only branch heads, labelled checkpoints and milestones left; raise the budget "
                    "(stashpoint prune --save --max-size SIZE) or remove labels",
                    store.url,
                    format_size(report.kept_bytes),
                    format_size(upkeep.max_bytes),
                )
    except BaseException:
        try:
            store.meta.set_meta(LAST_META, previous)
        except StashpointError:
            pass  # a store that failed under us: it stays rescheduled
        raise
    return report


def _account(report: UpkeepReport, gc: GcReport) -> None:
    report.kept_bytes = gc.live_bytes
    report.freed_bytes += gc.freed_bytes
    report.pending_bytes = gc.pending_bytes


def run_if_due(store: Store) -> UpkeepReport | None:
    """What ``Store.close`` calls: upkeep when due; never raises (logs instead)."""
    try:
        upkeep = load(store)
        if not due(store, upkeep):
            return None
        return run(store, upkeep)
    except Exception as exc:
        if isinstance(exc, GcBusy):  # two stores closing at once: not a failure to report
            _log().info("stashpoint upkeep of %s: %s; retried at the next close", store.url, exc)
            return None
        _log().warning("stashpoint upkeep of %s failed; retried later", store.url, exc_info=True)
        return None


def _duration(d: dt.timedelta) -> str:
    from .retention import _format_duration

    return _format_duration(d)


def parse_every(text: str) -> dt.timedelta:
    every = parse_duration(text)
    if every.total_seconds() <= 0:
        raise UsageError("the upkeep period must be positive")
    return every
