"""The journal's typed entries keep the wire format of the untyped ones, byte for byte.

Journal entries used to be plain dicts with one-letter keys, written as JSON in the order the
writer built them. The ``OLD_*`` helpers below build those dicts exactly as that writer did
(key order, keys left out, nulls kept); each case checks that the typed entry encodes to the
same bytes and that those bytes decode to the typed entry. The end-to-end tests put such a
journal in a real store and run it with the current engine, and check every row the current
engine writes against the old form.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stashpoint
from stashpoint.durable import Journal, fingerprint, run_status
from stashpoint.durable.entries import (
    CancelEntry,
    DecisionEntry,
    DoneEntry,
    EffectEntry,
    ErrorInfo,
    IntentEntry,
    PlanEntry,
    RequestEntry,
    ResolveEntry,
    StepEntry,
    TaskEntry,
    decode,
    encode,
)
from stashpoint.errors import IntegrityError
from stashpoint.integrity import EMPTY_CHAIN, message_chain
from stashpoint.stores.base import LogAppend

T = "2026-11-26T10:00:00.000000+00:00"
ERR = {"type": "builtins.ValueError", "message": "no"}
REJECTED = {
    "type": "stashpoint.durable.ToolRejected",
    "message": "deploy was rejected: not today",
    "tool": "deploy",
    "reason": "not today",
}


# -- the old writer's dicts, built as it built them ---------------------------------------
def old_step(s: int, n: str, fp: str, sub: list[int], *, r: Any = None, e: Any = None) -> Any:
    entry: dict[str, Any] = {"k": "step", "s": s, "n": n, "fp": fp}
    if sub:
        entry["sub"] = sorted(sub)
    if e is None:
        entry["ok"], entry["r"] = True, r
    else:
        entry["ok"], entry["e"] = False, e
    return entry


def old_effect(
    s: int, n: str, key: str, sub: list[int], *, r: Any = None, e: Any = None, x: Any = None
) -> Any:
    entry: dict[str, Any] = {"k": "effect", "s": s, "n": n, "key": key}
    entry["t"] = T
    if sub:
        entry["sub"] = sorted(sub)
    if e is not None:
        entry["ok"], entry["e"] = False, e
    elif x is not None:
        entry["ok"], entry["r"], entry["x"] = True, r, x
    else:
        entry["ok"], entry["r"] = True, r
    return entry


def old_decided_effect(s: int, n: str, key: str, by: str, *, r: Any = None, e: Any = None) -> Any:
    entry: dict[str, Any] = {"k": "effect", "s": s, "n": n, "key": key, "by": by}
    entry["t"] = T
    if e is None:
        entry["ok"], entry["r"] = True, r
    else:
        entry["ok"] = False
        entry["e"] = e
    return entry


def old_intent(s: int, n: str, fp: str, key: str, a: Any, t: str = T) -> Any:
    intent = {"k": "intent", "s": s, "n": n, "fp": fp, "key": key, "a": a}
    intent["t"] = t
    return intent


def old_request(s: int, n: str, fp: str, ident: str, a: Any) -> Any:
    req: dict[str, Any] = {"k": "request", "s": s, "n": n, "fp": fp}
    req["id"] = ident
    req["a"] = a
    return req


def old_decision(s: int, ident: str, fp: str, approved: bool, why: Any, by: str, t: str) -> Any:
    entry = {"k": "decision", "s": s, "id": ident, "fp": fp}
    entry.update({"approved": approved, "why": why, "by": by, "t": t})
    return entry


def old_resolve(s: int, key: str, by: str, why: Any) -> Any:
    entry = {"k": "resolve", "s": s, "key": key, "outcome": "retry", "by": by}
    entry.update({"why": why, "t": T})
    return entry


def old_plan(s: int, items: list[tuple[str, str]]) -> Any:
    fp = hashlib.sha256(msgspec.json.encode(items)).hexdigest()[:32]
    return {"k": "plan", "s": s, "n": "plan", "fp": fp, "tasks": [list(x) for x in items]}


def old_task(s: int, tid: str, status: str, note: Any = None, auto: bool = False) -> Any:
    return {
        "k": "task",
        "s": s,
        "n": "task",
        "fp": f"{tid}:{status}",
        "id": tid,
        "status": status,
        "note": note,
        **({"auto": True} if auto else {}),
    }


PLAN = [("a", "think"), ("b", "ship")]
PLAN_FP = old_plan(0, PLAN)["fp"]
CASES: list[tuple[str, Any, Any]] = [
    ("step", old_step(2, "think", "f1", [], r="thought"), None),
    ("step None", old_step(2, "think", "f1", [], r=None), None),
    ("step nested", old_step(4, "outer", "f2", [6, 5], r={"x": [1, 2.5, None]}), None),
    ("step error", old_step(3, "boom", "f3", [], e=ERR), None),
    ("effect", old_effect(6, "send", "K1", [], r={"sent": "hi"}), None),
    ("effect nested", old_effect(6, "send", "K1", [7], r=[1]), None),
    ("effect error", old_effect(6, "send", "K1", [], e=ERR), None),
    ("effect unrecorded", old_effect(6, "send", "K1", [], r={"~type": "a.B"}, x="why"), None),
    ("effect done by", old_decided_effect(6, "send", "K1", "ann", r={"ok": 1}), None),
    ("effect rejected", old_decided_effect(6, "deploy", "K1", "ann", e=REJECTED), None),
    ("intent", old_intent(6, "send", "f4", "K1", [["hi"], {"to": "x"}]), None),
    ("request", old_request(7, "deploy", "f5", "R1", [["prod"], {}]), None),
    ("decision", old_decision(7, "R1", "f5", True, None, "ann", T), None),
    ("decision why", old_decision(7, "R1", "f5", False, "not today", "ann", T), None),
    ("resolve", old_resolve(6, "K1", "ann", None), None),
    ("cancel", {"k": "cancel", "s": 7, "id": "R1", "why": "superseded"}, None),
    ("cancel auto", {"k": "cancel", "s": 4, "why": "the run went on past a failure"}, None),
    ("plan", old_plan(0, PLAN), None),
    ("task", old_task(1, "a", "in_progress"), None),
    ("task auto", old_task(4, "a", "failed", "ValueError: no", auto=True), None),
    ("done", {"k": "done", "s": 10, "ok": True, "r": ["x", {"sent": "hi"}]}, None),
    ("done None", {"k": "done", "s": 10, "ok": True, "r": None}, None),
]
TYPED = {
    "step": StepEntry(slot=2, name="think", fingerprint="f1", ok=True, result="thought"),
    "step None": StepEntry(slot=2, name="think", fingerprint="f1", ok=True, result=None),
    "step nested": StepEntry(
        slot=4, name="outer", fingerprint="f2", nested=[5, 6], ok=True, result={"x": [1, 2.5, None]}
    ),
    "step error": StepEntry(
        slot=3, name="boom", fingerprint="f3", ok=False, error=ErrorInfo(**ERR)
    ),
    "effect": EffectEntry(slot=6, name="send", key="K1", at=T, ok=True, result={"sent": "hi"}),
    "effect nested": EffectEntry(
        slot=6, name="send", key="K1", at=T, nested=[7], ok=True, result=[1]
    ),
    "effect error": EffectEntry(
        slot=6, name="send", key="K1", at=T, ok=False, error=ErrorInfo(**ERR)
    ),
    "effect unrecorded": EffectEntry(
        slot=6, name="send", key="K1", at=T, ok=True, result={"~type": "a.B"}, unrecorded="why"
    ),
    "effect done by": EffectEntry(
        slot=6, name="send", key="K1", by="ann", at=T, ok=True, result={"ok": 1}
    ),
    "effect rejected": EffectEntry(
        slot=6, name="deploy", key="K1", by="ann", at=T, ok=False, error=ErrorInfo(**REJECTED)
    ),
    "intent": IntentEntry(
        slot=6, name="send", fingerprint="f4", key="K1", args=[["hi"], {"to": "x"}], at=T
    ),
    "request": RequestEntry(slot=7, name="deploy", fingerprint="f5", id="R1", args=[["prod"], {}]),
    "decision": DecisionEntry(
        slot=7, id="R1", fingerprint="f5", approved=True, why=None, by="ann", at=T
    ),
    "decision why": DecisionEntry(
        slot=7, id="R1", fingerprint="f5", approved=False, why="not today", by="ann", at=T
    ),
    "resolve": ResolveEntry(slot=6, key="K1", outcome="retry", by="ann", why=None, at=T),
    "cancel": CancelEntry(slot=7, id="R1", why="superseded"),
    "cancel auto": CancelEntry(slot=4, why="the run went on past a failure"),
    "plan": PlanEntry(slot=0, name="plan", fingerprint=PLAN_FP, tasks=PLAN),
    "task": TaskEntry(
        slot=1, name="task", fingerprint="a:in_progress", id="a", status="in_progress"
    ),
    "task auto": TaskEntry(
        slot=4,
        name="task",
        fingerprint="a:failed",
        id="a",
        status="failed",
        note="ValueError: no",
        auto=True,
    ),
    "done": DoneEntry(slot=10, result=["x", {"sent": "hi"}]),
    "done None": DoneEntry(slot=10, result=None),
}


@pytest.mark.parametrize(("case", "old"), [(c, o) for c, o, _ in CASES], ids=[c for c, *_ in CASES])
def test_every_entry_kind_has_the_old_bytes_both_ways(case: str, old: Any) -> None:
    old_bytes = msgspec.json.encode(old)
    typed = TYPED[case]
    assert encode(typed) == old_bytes  # what this version writes, the old reader reads
    assert decode(old_bytes) == typed  # what the old writer wrote, this version reads
    assert encode(decode(old_bytes)) == old_bytes
    assert list(msgspec.json.decode(encode(typed))) == list(old)  # same keys, same order


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(
    slot=st.integers(0, 10**6),
    name=st.text(max_size=12),
    sub=st.lists(st.integers(0, 10**6), max_size=3, unique=True),
    result=JSON,
    args=JSON,
)
def test_any_recorded_value_keeps_the_old_bytes(
    slot: int, name: str, sub: list[int], result: Any, args: Any
) -> None:
    pairs = [
        (
            old_step(slot, name, "fp", sub, r=result),
            StepEntry(
                slot=slot,
                name=name,
                fingerprint="fp",
                nested=sorted(sub) if sub else msgspec.UNSET,
                ok=True,
                result=result,
            ),
        ),
        (
            old_effect(slot, name, "K", sub, r=result),
            EffectEntry(
                slot=slot,
                name=name,
                key="K",
                at=T,
                nested=sorted(sub) if sub else msgspec.UNSET,
                ok=True,
                result=result,
            ),
        ),
        (
            old_intent(slot, name, "fp", "K", args),
            IntentEntry(slot=slot, name=name, fingerprint="fp", key="K", args=args, at=T),
        ),
        ({"k": "done", "s": slot, "ok": True, "r": result}, DoneEntry(slot=slot, result=result)),
    ]
    for old, typed in pairs:
        data = msgspec.json.encode(old)
        assert encode(typed) == data
        assert encode(decode(data)) == data


def test_an_entry_this_version_does_not_know_is_refused_as_corrupt() -> None:
    with pytest.raises(IntegrityError, match="not a journal entry"):
        decode(b'{"k":"teleport","s":1}')
    with pytest.raises(IntegrityError, match="not a journal entry"):
        decode(b'{"k":"step","s":"one","n":"x","fp":"f","ok":true}')


# -- end to end: an old journal in a real store, run by this engine -----------------------
def program(run: stashpoint.Session, calls: list[str]) -> Any:
    @run.step(name="think")
    def think(i: int) -> str:
        calls.append("think")
        return f"thought {i}"

    @run.step(name="boom")
    def boom() -> None:
        calls.append("boom")
        raise ValueError("no")

    @run.tool(irreversible=True, name="send")
    def send(text: str) -> dict[str, str]:
        calls.append("send")
        return {"sent": text}

    @run.tool(approval=True, name="deploy")
    def deploy(env: str) -> str:
        calls.append("deploy")
        return f"deployed {env}"

    def main() -> list[Any]:
        run.plan(PLAN)
        with run.task("a"):
            t = think(1)
            try:
                boom()
            except ValueError:
                pass
        with run.task("b"):
            return [t, send(t), deploy("prod")]

    return main


def write_old_journal(run: stashpoint.Session, entries: list[dict[str, Any]]) -> None:
    """Append these dicts as the old engine did: JSON-encoded as built, hash-chained."""
    j = Journal(run)
    j.start()
    assert j.log is not None
    chain, new = EMPTY_CHAIN, j.new
    for i, entry in enumerate(entries):
        data = msgspec.json.encode(entry)
        chain = message_chain(chain, data)
        run.store.meta.append_log(
            LogAppend(j.log, i, [(bytes.fromhex(chain), data)], new, session=run.name)
        )
        new = None


def stored_rows(run: stashpoint.Session) -> list[bytes]:
    head = run.head
    assert head is not None and head.journal is not None
    return [d for _, d in run._message_rows(head.journal.log, head.journal.length)]


def test_a_journal_the_old_engine_wrote_replays_and_what_follows_is_in_the_old_form(
    store: stashpoint.Store,
) -> None:
    fp_send = fingerprint("send", ("thought 1",), {})
    fp_deploy = fingerprint("deploy", ("prod",), {})
    old = [
        old_plan(0, PLAN),
        old_task(1, "a", "in_progress"),
        old_step(2, "think", fingerprint("think", (1,), {}), [], r="thought 1"),
        old_step(3, "boom", fingerprint("boom", (), {}), [], e=ERR),
        old_task(4, "a", "completed"),
        old_task(5, "b", "in_progress"),
        old_intent(6, "send", fp_send, "K1", [["thought 1"], {}]),
        old_effect(6, "send", "K1", [], r={"sent": "thought 1"}),
        old_request(7, "deploy", fp_deploy, "R1", [["prod"], {}]),
    ]
    run = store.session("old")
    write_old_journal(run, old)

    status = run_status(store.session("old"))
    assert status["status"] == "awaiting_approval"
    assert status["pending"]["id"] == "R1"
    assert status["pending"]["args"] == [["prod"], {}]
    assert [(t["id"], t["status"]) for t in status["tasks"]] == [
        ("a", "completed"),
        ("b", "in_progress"),
    ]
    assert [(e["key"], e["status"], e["result"]) for e in status["effects"]] == [
        ("K1", "done", {"sent": "thought 1"})
    ]
    assert status["steps"] == 2

    run = store.session("old")
    run.approve("R1", by="ann")
    calls: list[str] = []
    result = run.run(program(run, calls))
    assert result.status == "completed"
    assert result.value == ["thought 1", {"sent": "thought 1"}, "deployed prod"]
    assert calls == ["deploy"]  # everything the old journal holds replayed

    rows = stored_rows(run)
    assert rows[: len(old)] == [msgspec.json.encode(e) for e in old]
    written = [msgspec.json.decode(d) for d in rows[len(old) :]]
    decision_by, decision_t = written[0]["by"], written[0]["t"]
    assert [msgspec.json.encode(e) for e in written] == [
        msgspec.json.encode(e)
        for e in [
            old_decision(7, "R1", fp_deploy, True, None, decision_by, decision_t),
            old_step(8, "deploy", fp_deploy, [], r="deployed prod"),
            old_task(9, "b", "completed"),
            {"k": "done", "s": 10, "ok": True, "r": result.value},
        ]
    ]
    assert rows[len(old) :] == [msgspec.json.encode(e) for e in written]


def test_a_fresh_run_writes_every_entry_in_the_old_form(store: stashpoint.Store) -> None:
    run = store.session("new")
    calls: list[str] = []
    assert run.run(program(run, calls)).status == "awaiting_approval"
    run.reject(None, reason="not today", by="ann")
    run = store.session("new")
    with pytest.raises(stashpoint.ToolRejected):
        run.run(program(run, calls))
    rows = stored_rows(run)
    got = [msgspec.json.decode(d) for d in rows]
    key, rid = got[6]["key"], got[8]["id"]
    fp_send = fingerprint("send", ("thought 1",), {})
    fp_deploy = fingerprint("deploy", ("prod",), {})
    expected = [
        old_plan(0, PLAN),
        old_task(1, "a", "in_progress"),
        old_step(2, "think", fingerprint("think", (1,), {}), [], r="thought 1"),
        old_step(3, "boom", fingerprint("boom", (), {}), [], e=ERR),
        old_task(4, "a", "completed"),
        old_task(5, "b", "in_progress"),
        old_intent(6, "send", fp_send, key, [["thought 1"], {}], t=got[6]["t"]),
        {**old_effect(6, "send", key, [], r={"sent": "thought 1"}), "t": got[7]["t"]},
        old_request(7, "deploy", fp_deploy, rid, [["prod"], {}]),
        old_decision(7, rid, fp_deploy, False, "not today", "ann", got[9]["t"]),
        old_task(8, "b", "skipped", "deploy was rejected: not today"),
    ]
    assert rows == [msgspec.json.encode(e) for e in expected]
    assert calls == ["think", "boom", "send"]


def test_a_redacted_entry_is_stored_and_kept_as_the_old_engine_stored_it(
    store: stashpoint.Store,
) -> None:
    """The redactor sees the entry as the JSON object it is stored as (wire keys), and the
    journal in memory holds what was stored."""
    run = store.session("redacted")

    @run.step(name="login")
    def login() -> dict[str, str]:
        return {"user": "ann", "api_key": "hunter2"}

    assert run.run(lambda: login()).value == {"user": "ann", "api_key": "hunter2"}
    redacted = {"user": "ann", "api_key": "[REDACTED:field]"}
    rows = stored_rows(run)
    assert rows[0] == msgspec.json.encode(
        old_step(0, "login", fingerprint("login", (), {}), [], r=redacted)
    )
    assert Journal(run).entries[0] == decode(rows[0])

    def in_place(tree: Any) -> Any:  # a user's redactor that changes its argument
        if isinstance(tree, dict) and tree.get("k") == "step":
            tree["r"] = "gone"
        return tree

    mine = store.session("in-place", redact=in_place)

    @mine.step(name="login")
    def login2() -> str:
        return "secret"

    def main() -> list[Any]:
        login2()
        j = mine.durable.journal
        assert j is not None and isinstance(j.entries[0], StepEntry)
        return [len(j.entries), j.entries[0].result]

    assert mine.run(main).value == [1, "gone"]
    assert stored_rows(mine)[0] == msgspec.json.encode(
        old_step(0, "login", fingerprint("login", (), {}), [], r="gone")
    )
