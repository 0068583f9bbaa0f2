"""Retention: plans as data (each rule, their combinations), marks beside the records, and the
`prune` command as a user types it."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

import stashpoint
import stashpoint.verify
from stashpoint import retention
from stashpoint.errors import NotFoundError, UsageError
from stashpoint.model import Checkpoint
from stashpoint.retention import Policy, parse_duration, plan

from .conftest import snapshot_tree

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.timezone.utc)


def _cp(
    n: int, *, hours_ago: float, branch: str = "main", kind: str = "auto", parent: int | None = None
) -> Checkpoint:
    created = (NOW - dt.timedelta(hours=hours_ago)).replace(tzinfo=None).isoformat() + "Z"
    return Checkpoint(
        id=f"01A{n:023d}",
        session="s",
        branch=branch,
        parent=None if parent is None else f"01A{parent:023d}",
        parent_digest=None,
        step=n,
        kind=kind,
        created_at=created,
    )


def _id(n: int) -> str:
    return f"01A{n:023d}"


@pytest.fixture
def history() -> list[Checkpoint]:
    """main: 1..8, one per 10 hours (8 is newest); branch 'b' forks at 4: 9, 10."""
    cps = [_cp(i, hours_ago=(9 - i) * 10, parent=i - 1 if i > 1 else None) for i in range(1, 9)]
    cps.append(_cp(9, hours_ago=5, branch="b", parent=4))
    cps.append(_cp(10, hours_ago=1, branch="b", parent=9))
    return cps


HEADS = {"main": _id(8), "b": _id(10)}


def test_parse_duration() -> None:
    assert parse_duration("24h") == dt.timedelta(hours=24)
    assert parse_duration("7d") == dt.timedelta(days=7)
    assert parse_duration("1d12h") == dt.timedelta(hours=36)
    assert parse_duration(" 90s ") == dt.timedelta(seconds=90)
    assert parse_duration("2w") == dt.timedelta(weeks=2)
    for bad in ("", "24", "h", "3x", "-1d", "1d 2"):
        with pytest.raises(UsageError):
            parse_duration(bad)


def test_no_rule_keeps_only_heads(history: list[Checkpoint]) -> None:
    p = plan(history, Policy(), now=NOW, heads=HEADS)
    assert p.keep == {_id(10): ["head"], _id(8): ["head"]}
    assert sorted(p.remove) == [*sorted(_id(i) for i in range(1, 8)), _id(9)]
    assert p.remove == sorted(p.remove, reverse=True), "newest first"


def test_keep_within(history: list[Checkpoint]) -> None:
    p = plan(history, Policy.of(keep_within="24h"), now=NOW, heads=HEADS)
    # main 7 (20 h ago) and 8 (10 h), b 9 (5 h) and 10 (1 h); 6 is 30 h old
    assert set(p.keep) == {_id(7), _id(8), _id(9), _id(10)}
    assert p.keep[_id(7)] == ["within"]
    assert p.keep[_id(8)] == ["head", "within"]


def test_keep_last_is_per_branch(history: list[Checkpoint]) -> None:
    p = plan(history, Policy(keep_last=2), now=NOW, heads=HEADS)
    assert set(p.keep) == {_id(7), _id(8), _id(9), _id(10)}
    assert p.keep[_id(9)] == ["last"]
    p0 = plan(history, Policy(keep_last=0), now=NOW, heads=HEADS)
    assert set(p0.keep) == {_id(8), _id(10)}


def test_labels_and_milestones(history: list[Checkpoint]) -> None:
    history[1] = _cp(2, hours_ago=70, kind="milestone", parent=1)
    labels = {_id(3): "before-migration"}
    p = plan(history, Policy(), now=NOW, heads=HEADS, labels=labels)
    assert p.keep[_id(2)] == ["milestone"]
    assert p.keep[_id(3)] == ["labelled"]
    off = plan(history, Policy(keep_labelled=False), now=NOW, heads=HEADS, labels=labels)
    assert _id(2) in off.remove and _id(3) in off.remove


def test_rules_combine_by_or_with_every_reason(history: list[Checkpoint]) -> None:
    labels = {_id(8): "green", _id(1): "first"}
    p = plan(
        history,
        Policy.of(keep_within="15h", keep_last=3),
        now=NOW,
        heads=HEADS,
        labels=labels,
        protected={_id(4): "run"},
    )
    assert p.keep[_id(8)] == ["head", "within", "last", "labelled"]
    assert p.keep[_id(6)] == ["last"]
    assert p.keep[_id(4)] == ["run"]
    assert p.keep[_id(1)] == ["labelled"]
    assert set(p.remove) == {_id(2), _id(3), _id(5)}
    assert not set(p.keep) & set(p.remove)
    assert len(p.keep) + len(p.remove) == len(history)


def test_already_pruned_stay_pruned(history: list[Checkpoint]) -> None:
    p = plan(history, Policy(keep_last=100), now=NOW, heads=HEADS, pruned={_id(1), _id(2)})
    assert p.already == [_id(2), _id(1)]
    assert _id(1) not in p.keep and _id(1) not in p.remove


def test_plan_to_dict_is_json(history: list[Checkpoint]) -> None:
    p = plan(history, Policy.of("1d", 1), now=NOW, heads=HEADS, session="s")
    d = json.loads(json.dumps(p.to_dict({_id(8): "x"})))
    assert d["policy"] == {"keep_within": "1d", "keep_last": 1, "keep_labelled": True}
    assert d["keep"][0]["id"] == _id(10)
    assert {"id", "branch", "step", "kind", "label", "created_at", "reasons"} <= d["keep"][0].keys()
    assert [r["id"] for r in d["remove"]] == p.remove


# -- against a real store -------------------------------------------------------------------
def _linear(store: stashpoint.Store, ws: Path, n: int) -> list[Checkpoint]:
    run = store.session("s", workspace=ws)
    out = []
    for i in range(n):
        (ws / "f.txt").write_text(f"version {i}\n" * 50)
        out.append(run.checkpoint({"i": i, "messages": [{"n": k} for k in range(i + 1)]}))
    return out


def test_marks_are_beside_records_and_skip_heads(store: stashpoint.Store, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    cps = _linear(store, ws, 6)
    store.session("s").label(cps[1].id, "keep-me")
    p = retention.plan_session(store, "s", Policy(keep_last=2))
    assert set(p.keep) == {cps[5].id, cps[4].id, cps[1].id}
    assert p.keep[cps[1].id] == ["labelled"]
    bodies = {r.id: r.body for r in store.meta.list_checkpoints("s")}
    # a head that appears after planning is skipped when the plan is applied
    store.meta.set_head("s", "late", cps[0].id, None)
    done = retention.apply(store, p)
    assert set(done) == {cps[3].id, cps[2].id}
    assert set(store.meta.pruned("s")) == set(done)
    assert {r.id: r.body for r in store.meta.list_checkpoints("s")} == bodies, "records unchanged"
    history = store.session("s").history()  # every record and chain link still verifies
    assert [c.id for c in history] == [c.id for c in reversed(cps)]
    with pytest.raises(retention.PrunedError, match="pruned by retention"):
        retention.check_not_pruned(store, history[2])
    retention.check_not_pruned(store, history[0])
    assert issubclass(retention.PrunedError, NotFoundError)


def test_live_run_start_and_interrupted_rewind_are_protected(
    store: stashpoint.Store, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    cps = _linear(store, ws, 5)
    store.meta.set_meta("run:s:main", json.dumps({"log": "L", "base": cps[1].id, "parent": None}))
    store.meta.set_meta(
        f"restore-journal:{ws}",
        json.dumps({"session": "s", "branch": "main", "target": cps[0].id, "safety": cps[2].id}),
    )
    p = retention.plan_session(store, "s", Policy())
    assert p.keep == {
        cps[4].id: ["head"],
        cps[2].id: ["restore"],
        cps[1].id: ["run"],
        cps[0].id: ["restore"],
    }
    assert p.remove == [cps[3].id]


# -- the command --------------------------------------------------------------------------
def _snaps(sp: Any, ws: Path, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        (ws / "a.txt").write_text(f"step {i}\n")
        (ws / f"only-{i}.bin").write_bytes(bytes([i]) * 3000)
        kind = ["--kind", "milestone"] if i == 1 else []
        out.append(json.loads(sp("snap", "-m", f"s{i}", "--json", *kind, cwd=ws).out))
        (ws / f"only-{i}.bin").unlink()
    return out


def test_prune_command_plans_applies_and_gc_frees(sp: Any, tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    cps = _snaps(sp, ws, 6)
    sp("label", cps[2]["id"], "named", cwd=ws)
    dry = json.loads(sp("prune", "--keep-last", "2", "--dry-run", "--json", cwd=ws).out)
    assert dry["dry_run"] is True
    (s,) = dry["sessions"]
    assert [k["id"] for k in s["keep"]] == [cps[5]["id"], cps[4]["id"], cps[2]["id"], cps[1]["id"]]
    assert [k["reasons"] for k in s["keep"]] == [
        ["head", "last"],
        ["last"],
        ["labelled"],
        ["milestone"],
    ]
    assert [r["id"] for r in s["remove"]] == [cps[3]["id"], cps[0]["id"]]
    assert s["pruned"] == []
    again = json.loads(sp("prune", "--keep-last", "2", "--dry-run", "--json", cwd=ws).out)
    assert again["sessions"][0]["remove"] == s["remove"], "a dry run changes nothing"

    human = sp("prune", "--keep-last", "2", cwd=ws).out
    assert "pruned 2 checkpoint(s)" in human and "[head, last]" in human
    gc = json.loads(sp("gc", "--json", cwd=ws).out)
    assert gc["exclusive"] is True, "no other process had the store open"
    assert gc["pruned"] == 2
    assert gc["freed_blobs"] >= 2  # the two files only the pruned checkpoints had, and trees
    assert gc["pending_blobs"] == 0
    # the kept ones still load and rewind byte-identical; the pruned ones say so
    for cp in (cps[1], cps[2], cps[4]):
        sp("rewind", cp["id"], cwd=ws)
        assert (ws / "a.txt").read_text() == cp["message"].replace("s", "step ") + "\n"
        assert (ws / f"only-{cp['step'] - 1}.bin").read_bytes() == bytes([cp["step"] - 1]) * 3000
    sp("rewind", cps[5]["id"], cwd=ws)
    assert (ws / "a.txt").read_text() == "step 5\n"
    log = json.loads(sp("log", "--json", cwd=ws).out)
    assert {c["id"] for c in cps} <= {c["id"] for c in log}, "pruned records stay in the log"


def test_prune_all_sessions_and_default_policy(sp: Any, tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    _snaps(sp, ws, 3)
    sp("--session", "other", "snap", "-m", "x", cwd=ws)
    out = json.loads(sp("prune", "--all", "--json", cwd=ws).out)
    assert [s["session"] for s in out["sessions"]] == ["main", "other"]
    assert out["sessions"][0]["policy"] == {
        "keep_within": "1w",
        "keep_last": 100,
        "keep_labelled": True,
    }
    assert all(not s["remove"] for s in out["sessions"]), "everything is recent"
    assert sp("prune", "--all", "--session", "x", cwd=ws, check=False).code == 1
    assert sp("prune", "--keep-within", "soon", cwd=ws, check=False).code == 1


def test_kept_checkpoints_load_and_rewind_after_prune_and_gc(
    store: stashpoint.Store, tmp_path: Path
) -> None:
    """After prune + gc, kept checkpoints load and rewind byte-identical."""
    from stashpoint.gc import collect

    ws = tmp_path / "ws"
    ws.mkdir()
    cps = _linear(store, ws, 5)
    run = store.session("s", workspace=ws)
    run.label(cps[1].id, "keep")
    expected = {}
    for cp in cps:
        run.rewind(cp.id)
        expected[cp.id] = (snapshot_tree(ws), run.state())
    retention.apply(store, retention.plan_session(store, "s", Policy(keep_last=1)))
    report = collect(store, grace=0)
    assert report.freed_blobs > 0
    # rewinds took safety checkpoints: the kept set is the head, the label, and the last one
    kept = [c for c in run.history() if c.id not in store.meta.pruned("s")]
    assert cps[1].id in {c.id for c in kept}
    for cp in kept:
        if cp.id in expected:
            run.rewind(cp.id)
            assert (snapshot_tree(ws), run.state()) == expected[cp.id]


@pytest.mark.xfail(
    "pruned" not in stashpoint.verify.VerifyReport.__dataclass_fields__,
    reason="needs session.py to call retention.check_not_pruned (see the retention docstring)",
    strict=True,
)
def test_engine_refuses_pruned_contents_clearly(store: stashpoint.Store, tmp_path: Path) -> None:
    from stashpoint.gc import collect

    ws = tmp_path / "ws"
    ws.mkdir()
    cps = _linear(store, ws, 3)
    retention.apply(store, retention.plan_session(store, "s", Policy()))
    collect(store, grace=0)
    run = store.session("s", workspace=ws)
    before = snapshot_tree(ws)
    for call in (
        lambda: run.state(cps[0].id),
        lambda: run.rewind(cps[0].id),
        lambda: run.diff(cps[0].id, cps[2].id),
        lambda: run.fork(cps[1].id, "b", into=tmp_path / "b"),
    ):
        with pytest.raises(retention.PrunedError, match="pruned by retention"):
            call()
    assert snapshot_tree(ws) == before
    assert run.state(cps[2].id)["i"] == 2
