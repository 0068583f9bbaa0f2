"""Operator edits: change a checkpoint's state, validated, saved as a child of kind
``edit``; then resume from it - through the API and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import stashpoint
from stashpoint.edit import ValidationError, apply_patch


def test_edit_sets_patches_and_records_who_and_why(store: stashpoint.Store) -> None:
    run = store.session("e")
    base = run.checkpoint({"plan": {"budget": 500, "steps": ["a", "b"]}, "messages": ["hi"]})
    cp = run.edit(
        assign={"plan.budget": 100, "/plan/steps/-": "c"},
        patch=[{"op": "remove", "path": "/plan/steps/0"}],
        reason="over budget",
        by="ops",
    )
    assert cp.kind == "edit" and cp.parent == base.id
    assert cp.meta["edit"]["by"] == "ops" and cp.meta["edit"]["reason"] == "over budget"
    assert cp.meta["edit"]["of"] == base.id
    assert run.state() == {"plan": {"budget": 100, "steps": ["b", "c"]}, "messages": ["hi"]}
    assert run.state(base)["plan"]["budget"] == 500  # the original is untouched
    d = run.diff(base.id, cp.id)
    assert [(k, status) for k, status, _old, _new in d.values] == [("plan", "changed")]


def test_validators_refuse_a_bad_edit_and_nothing_is_saved(store: stashpoint.Store) -> None:
    run = store.session("v")
    run.checkpoint({"budget": 10})

    @run.validator
    def budget_is_positive(state: dict[str, Any]) -> str | None:
        return None if state["budget"] > 0 else "budget must be positive"

    head = run.head
    with pytest.raises(ValidationError, match=r"budget_is_positive.*budget must be positive"):
        run.edit(assign={"budget": -5})
    assert run.head == head and len(run.history()) == 1


def test_editing_an_older_checkpoint_needs_a_branch(store: stashpoint.Store) -> None:
    run = store.session("o")
    old = run.checkpoint({"n": 1})
    run.checkpoint({"n": 2})
    with pytest.raises(stashpoint.UsageError, match="--branch"):
        run.edit(old.id, assign={"n": 10})
    cp = run.edit(old.id, assign={"n": 10}, branch="fixed")
    assert cp.branch == "fixed" and cp.parent == old.id
    assert run.state()["n"] == 2  # this branch goes on as it was
    assert store.session("o", branch="fixed").state()["n"] == 10


@pytest.mark.parametrize(
    ("patch", "error"),
    [
        ([{"op": "replace", "path": "/missing", "value": 1}], "no key 'missing'"),
        ([{"op": "test", "path": "/a", "value": 1}], "test failed"),
        ([{"op": "add", "path": "/l/9", "value": 1}], "out of range"),
        ([{"op": "jump", "path": "/a"}], "unknown op"),
        ({"op": "add"}, "JSON array"),
    ],
)
def test_bad_patches_are_refused_whole(patch: Any, error: str) -> None:
    doc = {"a": 1, "l": [1]}
    first = [{"op": "replace", "path": "/a", "value": 5}]  # valid, but the patch is all or nothing
    with pytest.raises(stashpoint.UsageError, match=error):
        apply_patch(doc, first + patch if isinstance(patch, list) else patch)
    assert doc == {"a": 1, "l": [1]}


def _spending_program(spent: list[int]) -> Any:
    """An agent that spends its state's budget through an approval-gated irreversible tool."""

    def program(run: stashpoint.Session) -> Any:
        @run.tool(name="spend", irreversible=True, approval=True)
        def spend(amount: int) -> str:
            spent.append(amount)
            return f"spent {amount}"

        def main() -> str:
            state = run.state() or {"budget": 500}
            if not run.head:
                run.checkpoint(state)
            return str(spend(state["budget"]))

        return main

    return program


def test_editing_a_run_paused_for_approval_withdraws_the_stale_request(
    store: stashpoint.Store,
) -> None:
    spent: list[int] = []
    program = _spending_program(spent)

    run = store.session("pay")
    assert run.run(program(run)).status == "awaiting_approval"
    edited = store.session("pay").edit(assign={"budget": 100}, reason="too much")
    assert edited.meta["edit"]["withdrew"]["args"] == [[500], {}]
    run2 = store.session("pay")
    res = run2.run(program(run2))
    assert res.status == "awaiting_approval" and res.pending is not None
    assert res.pending.args == [[100], {}]  # asks again, for the edited amount
    store.session("pay").approve()
    run3 = store.session("pay")
    assert run3.run(program(run3)).value == "spent 100" and spent == [100]


def test_editing_a_paused_run_onto_a_new_branch_withdraws_the_request_there(
    store: stashpoint.Store,
) -> None:
    spent: list[int] = []
    program = _spending_program(spent)

    run = store.session("pay")
    assert run.run(program(run)).status == "awaiting_approval"
    edited = store.session("pay").edit(assign={"budget": 100}, reason="too much", branch="fix")
    assert edited.branch == "fix" and edited.meta["edit"]["withdrew"]["args"] == [[500], {}]
    assert store.session("pay").pending() is not None  # main still asks for 500
    fix = store.session("pay", branch="fix")
    res = fix.run(program(fix))
    assert res.status == "awaiting_approval" and res.pending is not None
    assert res.pending.args == [[100], {}]  # asks again on the branch, for the edited amount
    store.session("pay", branch="fix").approve()
    fix = store.session("pay", branch="fix")
    assert fix.run(program(fix)).value == "spent 100" and spent == [100]


@pytest.mark.parametrize("index", ["\u00b2", "01", "00", "-1", " 1", "1e0"])
def test_list_indexes_are_ascii_digits_without_leading_zeros(index: str) -> None:
    from stashpoint.edit import set_path, split_path

    doc: dict[str, Any] = {"l": [1, 2]}
    with pytest.raises(stashpoint.UsageError, match="is not a list index"):
        set_path(doc, split_path(f"l.{index}"), 5)
    with pytest.raises(stashpoint.UsageError, match="is not a list index"):
        apply_patch(doc, [{"op": "add", "path": f"/l/{index}", "value": 5}])
    assert doc == {"l": [1, 2]}
    set_path(doc, split_path("l.0"), 5)
    assert apply_patch(doc, [{"op": "add", "path": "/l/1", "value": 7}]) == {"l": [5, 7, 2]}


AGENT = """
import os, sys
import stashpoint

store = stashpoint.open(sys.argv[1])
run = store.session("ops")

@run.step
def fetch() -> list:
    return ["report.pdf", "notes.txt"]

@run.step
def summarise(files: list, style: str) -> str:
    return f"{len(files)} files, {style}"

def main() -> str:
    state = run.state()
    files = fetch()
    if not state:
        state = {"style": "verbose", "files": files}
        run.checkpoint(state, message="planned")
        if os.environ.get("CRASH"):
            os._exit(9)  # the process dies before summarising
    return summarise(files, state["style"])

print(run.run(main).value)
"""

VALIDATORS = """
def style_is_known(state):
    if state.get("style") not in ("verbose", "terse"):
        return f"unknown style {state.get('style')!r}"
"""


def test_cli_edit_then_resume(sp: Any, tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(textwrap.dedent(AGENT))
    (tmp_path / "checks.py").write_text(textwrap.dedent(VALIDATORS))
    (tmp_path / "pyproject.toml").write_text(
        '[tool.stashpoint]\nvalidators = ["checks:style_is_known"]\n'
    )
    store = tmp_path / ".stashpoint"
    crashed = subprocess.run(
        [sys.executable, "agent.py", str(store)],
        cwd=tmp_path,
        env={**os.environ, "CRASH": "1"},
        capture_output=True,
        text=True,
    )
    assert crashed.returncode == 9, crashed.stderr
    g = ("--session", "ops")

    bad = sp(*g, "edit", "--set", "style=loud", cwd=tmp_path, check=False)
    assert bad.code == 1
    assert "style_is_known refused the state: unknown style 'loud'" in bad.err
    assert len(json.loads(sp(*g, "log", "--json", cwd=tmp_path).out)) == 1  # nothing saved

    ok = json.loads(
        sp(*g, "edit", "--set", "style=terse", "-r", "shorter", "--by", "ana", "--json",
           cwd=tmp_path).out
    )  # fmt: skip
    assert ok["kind"] == "edit" and ok["meta"]["edit"]["by"] == "ana"
    shown = sp(*g, "diff", "HEAD~1", "HEAD", cwd=tmp_path).out
    assert "'verbose'" in shown and "'terse'" in shown

    resumed = sp(*g, "resume", "--", sys.executable, "agent.py", str(store), cwd=tmp_path)
    assert resumed.out.strip().splitlines()[-1] == "2 files, terse"

    patch = tmp_path / "p.json"
    patch.write_text(json.dumps([{"op": "replace", "path": "/style", "value": "verbose"}]))
    sp(*g, "edit", "--patch", str(patch), cwd=tmp_path)
    assert '"verbose"' in sp(*g, "show", "HEAD", "--json", cwd=tmp_path).out


def test_cli_edit_in_the_editor(sp: Any, tmp_path: Path) -> None:
    store = stashpoint.open(tmp_path / ".stashpoint")
    store.session("main").checkpoint({"mode": "a"})
    store.close()
    fake_editor = tmp_path / "ed.py"
    fake_editor.write_text(
        "import sys, pathlib\np = pathlib.Path(sys.argv[1])\n"
        "p.write_text(p.read_text().replace('\"a\"', '\"b\"'))\n"
    )
    env_editor = f"{sys.executable} {fake_editor}"
    res = subprocess.run(
        [sys.executable, "-m", "stashpoint", "edit", "--editor", "-r", "by hand"],
        cwd=tmp_path,
        env={**os.environ, "EDITOR": env_editor, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(sp("show", "HEAD", "--json", cwd=tmp_path).out)["state"] == {"mode": "b"}


@pytest.mark.parametrize("saved", ["[1, 2]", "null", "3"])
def test_cli_edit_refuses_a_state_that_is_not_an_object(
    sp: Any, tmp_path: Path, saved: str
) -> None:
    store = stashpoint.open(tmp_path / ".stashpoint")
    store.session("main").checkpoint({"l": [1, 2]})
    store.close()
    fake_editor = tmp_path / "ed.py"
    fake_editor.write_text(
        f"import sys, pathlib\npathlib.Path(sys.argv[1]).write_text({saved!r})\n"
    )
    res = subprocess.run(
        [sys.executable, "-m", "stashpoint", "edit", "--editor"],
        cwd=tmp_path,
        env={**os.environ, "EDITOR": f"{sys.executable} {fake_editor}", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "must be a JSON object" in res.stderr
    bad = sp("edit", "--set", "l.\u00b2=5", cwd=tmp_path, check=False)
    assert bad.code == 1 and "Traceback" not in bad.err and "is not a list index" in bad.err
    assert len(json.loads(sp("log", "--json", cwd=tmp_path).out)) == 1  # nothing saved
