"""Compensations: undoing recorded side effects, newest first, each recorded before it runs.

The plan lives in store meta (``compensate:<session>:<branch>``), not in the journal: a rewind
asks for it, and the program that registered the tools' compensations carries it out, in
this process or a later one.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec

from .. import serde
from ..metakeys import compensation_key
from ..model import utc_now_iso
from .entries import ErrorInfo, loose
from .journal import compensation_pending
from .results import Effect

if TYPE_CHECKING:
    from .engine import Durable

__all__ = ["request", "run_pending"]


def request(engine: Durable, effects: list[Effect]) -> None:
    """Record that these effects are to be undone (the plan a rewind with ``--compensate``
    leaves in store meta, for the program that registered their compensations)."""
    meta = engine.session.store.meta
    key = compensation_key(engine.session.name, engine.session.branch)
    todo = [e.to_dict() for e in reversed(effects)]  # newest first: a saga unwinds
    plan: dict[str, Any] = {"todo": todo, "done": []}
    raw = meta.get_meta(key)
    running = json.loads(raw).get("running") if raw else None
    if running is not None:  # a compensation in doubt stays first, to be decided
        item = {k: v for k, v in running.items() if k not in ("t", "resolution")}
        plan["todo"] = [item, *(t for t in todo if t["key"] != item["key"])]
        plan["running"] = running
    meta.set_meta(key, json.dumps(plan))


def run_pending(engine: Durable, *, in_run: bool = False) -> list[dict[str, Any]]:
    """Run requested compensations whose functions this process registered, newest
    effect first, each recorded; the rest stay requested (for the program that has them).

    Each compensation is an external action too: its intent is recorded before it runs.
    One that was running when the process died is in doubt - it is never run again on a
    guess: a run (``in_run``) pauses until a human says whether it happened (``approve
    --done``), should run again (``approve``) or be given up (``reject``)."""
    meta = engine.session.store.meta
    key = compensation_key(engine.session.name, engine.session.branch)
    raw = meta.get_meta(key)
    if raw is None:
        return []
    plan = json.loads(raw)
    done: list[dict[str, Any]] = plan["done"]
    for item in list(plan["todo"]):
        spec = engine.tools.get(item["tool"])
        if spec is None:
            return done  # later: when the program that registers the tool runs
        record: dict[str, Any] = {"key": item["key"], "tool": item["tool"]}
        running = plan.get("running")
        decided = None
        if running is not None and running.get("key") == item["key"]:
            decided = running.get("resolution")
            if decided is None:  # an intent with no outcome: the process died in it
                if not in_run:
                    return done
                pending = compensation_pending(running)
                cp = engine.session.head
                if cp is None or cp.status != "in_doubt":
                    cp = engine._paused_checkpoint(pending)
                engine._pause(pending, cp)
        if decided is not None and decided.get("outcome") != "retry":
            by = {"by": decided.get("by"), "reason": decided.get("why")}
            if decided.get("outcome") == "done":
                record.update(ok=True, result=decided.get("result"), **by)
            else:
                record.update(ok=None, skipped="rejected", **by)
        elif spec.compensate is None:
            record.update(ok=None, skipped="the tool has no compensation")
        else:
            plan["running"] = {**item, "t": utc_now_iso()}  # the intent, first
            meta.set_meta(key, json.dumps(plan))
            args, kwargs = serde.from_tree(item["args"]) if item["args"] else ([], {})
            try:
                out = spec.compensate(serde.from_tree(item["result"]), *args, **kwargs)
                record.update(ok=True, result=loose(out))
            except Exception as exc:
                record.update(ok=False, error=msgspec.to_builtins(ErrorInfo.of(exc)))
        done.append(record)
        plan["todo"].remove(item)
        plan.pop("running", None)
        meta.set_meta(key, json.dumps(plan))
    engine.session.checkpoint(
        kind="auto",
        message=f"compensated {len(done)} effect(s)",
        meta={"compensations": done},
        files=False,
    )
    meta.set_meta(key, None)
    return done
