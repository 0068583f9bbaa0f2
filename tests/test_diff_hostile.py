"""Diffs of stores someone else wrote: a LangGraph value naming a function must not run it,
stored text must not drive the terminal or forge lines, messages pair as a reader expects
(moves, a dropped first message), lone surrogates are stored, and big diffs render only what
changed (JSON cut with a marker)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from click.testing import CliRunner
from langgraph.checkpoint.serde.jsonplus import EXT_CONSTRUCTOR_POS_ARGS, JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

import stashpoint
from stashpoint import statediff
from stashpoint.cli import cli
from stashpoint.integrations.langgraph import StashpointSaver
from stashpoint.statediff import conversation_diff, value_text


class _Note(TypedDict):
    note: str


def test_a_langgraph_value_naming_a_function_is_shown_not_called(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Hostile(JsonPlusSerializer):  # only the writer's side: the store holds the payload
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            if obj == "PAYLOAD":  # builtins.open(marker, "w"): creates the marker if called
                args = ormsgpack.packb(("builtins", "open", [str(marker), "w"]))
                return "msgpack", ormsgpack.packb(ormsgpack.Ext(EXT_CONSTRUCTOR_POS_ARGS, args))
            return super().dumps_typed(obj)

    g = StateGraph(_Note)
    g.add_node("a", lambda s: {"note": "PAYLOAD"})
    g.add_edge(START, "a")
    g.add_edge("a", END)
    saver = StashpointSaver(str(tmp_path / "store"), serde=Hostile())
    g.compile(checkpointer=saver).invoke(
        {"note": "hello"}, {"configurable": {"thread_id": "t"}}, durability="sync"
    )
    saver.close()
    with stashpoint.open(tmp_path / "store") as store:
        d = store.session("lg:t").diff("HEAD~1", "HEAD")
        [change] = d.state_changes
    assert not marker.exists()
    note = "<a value of type builtins.open, not decoded: it would need to import module builtins>"
    assert value_text(change.after) == note
    got = CliRunner().invoke(
        cli, ["--store", str(tmp_path / "store"), "--session", "lg:t", "--json", "diff", "HEAD~1"]
    )
    assert got.exit_code == 0, got.output
    assert json.loads(got.output)["state_changes"][0]["after"] == note
    assert not marker.exists()


EVIL = "ok\x1b[2K\r\x1b[1A\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b]0;title\x07\x9b31m\x7f"
FORGED = "LGTM\nstate approved: changed\n- False\n+ True"


def test_stored_text_is_escaped_in_diff_log_and_stat(tmp_path: Path, sp: Any) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with stashpoint.open(tmp_path / "store") as store:
        s = store.session("main", workspace=ws)
        s.checkpoint({"messages": [{"role": "user", "content": "hi"}], "approved": False})
        (ws / "evil\x1b]0;t\x07.txt").write_text("a\x1b[2Jb\n")
        s.checkpoint(
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "tool", "content": EVIL},
                    {"role": "tool", "content": FORGED},
                ],
                "approved": "y\x1b[31m\nRED",
            },
            message=f"step {EVIL}",
        )
    args = ("--store", str(tmp_path / "store"), "--session", "main")
    outs = [sp(*args, *cmd).out for cmd in (["diff", "HEAD~1"], ["diff", "--stat", "HEAD~1"])]
    outs.append(sp(*args, "log").out)
    for out in outs:  # through a pipe: no control character but the newlines ending lines
        assert not [c for c in out if (ord(c) < 32 and c != "\n") or 0x7F <= ord(c) < 0xA0], out
    diff, stat, log = outs
    assert "state approved: changed" in diff.splitlines()  # the real one, once
    assert diff.splitlines().count("state approved: changed") == 1
    assert "+ [2] tool: LGTM\\nstate approved: changed\\n- False\\n+ True" in diff
    assert "+ 'y\\x1b[31m\\nRED'" in diff
    assert "+a\\x1b[2Jb" in diff  # file contents too
    assert "added  evil\\x1b]0;t\\x07.txt" in stat
    assert "step ok\\x1b[2K\\r\\x1b[1A" in log
    got = CliRunner().invoke(cli, [*args, "--json", "diff", "HEAD~1"])
    data = json.loads(got.output)  # JSON: escaped by JSON
    assert [m["text"] for m in data["conversation"]["added"]] == [EVIL, FORGED]
    assert statediff.printable("\u202eevil\ud83d\u2028") == "\\u202eevil\\ud83d\\u2028"


def test_messages_pair_by_alignment_and_moves_are_reported(store: stashpoint.Store) -> None:
    s = store.session("swap")
    m1 = {"role": "user", "content": "approve deploy?", "id": "m1"}
    m2 = {"role": "assistant", "content": "NO, do not deploy", "id": "m2"}
    a = s.checkpoint({"messages": [m1, m2]})
    b = s.checkpoint({"messages": [m2, m1]})
    conv = s.diff(a.id, b.id).conversation
    assert conv.changed and not (conv.added or conv.removed or conv.edited)
    assert [(m.before.index, m.after.index) for m in conv.moved] in ([(0, 1)], [(1, 0)])
    t = store.session("window")
    u = [{"role": "user", "content": c} for c in ("alpha", "beta", "gamma")]
    a = t.checkpoint({"messages": u})
    b = t.checkpoint({"messages": u[1:]})
    conv = t.diff(a.id, b.id).conversation
    assert ([m.text for m in conv.removed], conv.edited, conv.added) == (["alpha"], [], [])
    # an id'd message moved and edited at once is an edit
    a = s.checkpoint({"messages": [m1, m2, {"role": "user", "content": "x"}]})
    b = s.checkpoint({"messages": [{"role": "user", "content": "x"}, m2, dict(m1, content="ok")]})
    conv = s.diff(a.id, b.id).conversation
    assert [(e.before.index, e.after.index, e.after.text) for e in conv.edited] == [(0, 2, "ok")]


def test_a_lone_surrogate_is_stored_as_it_is(store: stashpoint.Store) -> None:
    half = json.loads('"half an emoji: \\ud83d"')
    s = store.session("main")
    s.checkpoint({"v": {half: [half]}}, append_messages=[{"role": "tool", "content": half}])
    assert s.state() == {"v": {half: [half]}, "messages": [{"role": "tool", "content": half}]}


def test_only_changed_messages_are_rendered_and_json_is_cut(
    store: stashpoint.Store, tmp_path: Path
) -> None:
    limit = statediff.MAX_JSON_TEXT
    n = 2000
    a = [{"role": "user", "content": f"m{i}"} for i in range(n)]
    b = [{"role": "user", "content": "EDIT"}, *a[1:]]
    seen: list[Any] = []

    def decode(m: Any) -> Any:
        seen.append(m)
        return m

    d = conversation_diff(0, a, b, decode=decode)
    assert [(e.before.text, e.after.text) for e in d.edited] == [("m0", "EDIT")]
    assert len(seen) == 2  # not the 1999 unchanged ones
    s = store.session("big")
    s.checkpoint({"doc": "a" * (limit + 5), "blob": b"\0" * (limit + 7)})
    s.checkpoint({"doc": "b" * (limit + 5), "blob": b"\1" * (limit + 7)})
    args = ["--store", str(tmp_path / "store"), "--session", "big", "--json", "diff", "HEAD~1"]
    cut = json.loads(CliRunner().invoke(cli, args).output)
    assert cut["truncated"] is True
    assert cut["values"][1]["new"] == cut["state_changes"][1]["after"]
    doc = cut["state_changes"][1]
    assert doc["after"] == "b" * limit + "… (+5 chars)"
    assert cut["state_changes"][0]["after"][1] == "… (+7 bytes)"
    whole = json.loads(CliRunner().invoke(cli, [*args, "--full"]).output)
    assert whole["truncated"] is False
    assert whole["state_changes"][1]["after"] == "b" * (limit + 5)
    assert len(value_text("x" * 10_000_000)) < 400


@pytest.mark.parametrize("n", [3])
def test_value_text_of_messages_and_models_stays_one_line(n: int) -> None:
    msgs = [{"role": "tool", "content": "a\nb", "tool_calls": []}] * n
    assert "\n" not in value_text(msgs) and value_text(msgs).startswith("[3 messages]")


def test_a_lone_surrogate_in_a_checkpoint_message_is_stored_as_a_replacement(
    tmp_path: Path,
) -> None:
    """A tool's broken output quoted in a message (the Agents adapter does this) used to make
    the checkpoint fail with a bare UnicodeEncodeError."""
    broken = json.loads('"cut \\ud83d here"')
    with stashpoint.open(tmp_path / "st") as store:
        run = store.session("s")
        cp = run.checkpoint({"note": broken}, message=f"said {broken}")
        assert run.get(cp.id).message == "said cut \ufffd here"
        assert run.state(cp.id)["note"] == broken  # the state keeps it exactly
