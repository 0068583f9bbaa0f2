"""Random sequences of conversation edits, checkpointed after each and read back in a fresh
process: the conversation read equals the one written, on SQLite, PostgreSQL and Redis.

The edits are the ones agent frameworks make: append a turn, truncate, pop several (the
OpenAI Agents SDK's ``pop_item`` to undo a turn, LangGraph's ``RemoveMessage``), replace a
middle message with a new object, change a message object in place, and fork an earlier
checkpoint and continue there. A conversation that shrank twice in a row once failed its third
checkpoint with "conversation log ... has missing messages"; a message changed in place was
once taken for the one already stored (the same object) and its change was lost.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stashpoint

from .test_postgres import pg_url  # noqa: F401 - fixture: a fresh schema per test
from .test_redis import redis_url  # noqa: F401 - fixture: a fresh key prefix per test

Edit = tuple[str, int]
EDITS = st.lists(
    st.tuples(
        st.sampled_from(["append", "append", "truncate", "pop", "replace", "in-place", "fork"]),
        st.integers(min_value=0, max_value=10),
    ),
    min_size=1,
    max_size=12,
)


def _message(n: int, text: str) -> dict[str, Any]:
    return {"role": "user" if n % 2 else "assistant", "content": text}


def play(store: stashpoint.Store, name: str, edits: list[Edit]) -> list[tuple[str, list[Any]]]:
    """Apply ``edits`` to a conversation, checkpointing after each; (id, messages) each."""
    run = store.session(name)
    msgs: list[Any] = []
    written: list[tuple[str, list[Any]]] = []
    for counter, (op, k) in enumerate(edits, start=1):
        if op == "append":
            msgs = [*msgs, *(_message(counter + i, f"m{counter}.{i}") for i in range(k % 3 + 1))]
        elif op == "truncate":
            msgs = msgs[: k % (len(msgs) + 1)]
        elif op == "pop":
            msgs = msgs[: max(0, len(msgs) - (k % 3 + 1))]
        elif op == "replace" and msgs:
            i = k % len(msgs)
            msgs = [*msgs[:i], _message(i, f"edited{counter}"), *msgs[i + 1 :]]
        elif op == "in-place" and msgs:
            msgs[k % len(msgs)]["content"] += f" changed{counter}"  # the same dict object
        elif op == "fork" and written:
            ident, msgs = written[k % len(written)]
            branch = f"b{counter}"
            run = run.fork(ident, branch)
            msgs = copy.deepcopy(msgs)
        cp = run.checkpoint({"messages": msgs, "n": counter})
        written.append((cp.id, copy.deepcopy(msgs)))
    return written


VERIFY = """
import json, sys
import stashpoint
url, cases = sys.argv[1], json.load(open(sys.argv[2]))
with stashpoint.open(url) as store:
    for name, ident, want in cases:
        got = store.session(name).state(ident)["messages"]
        assert got == want, (name, ident, got, want)
print(len(cases))
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgres", "redis"])
def test_conversation_edits_read_back_in_a_fresh_process(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = {
        "sqlite": lambda: str(tmp_path / "store"),
        "postgres": lambda: request.getfixturevalue("pg_url"),
        "redis": lambda: request.getfixturevalue("redis_url"),
    }[backend]()
    cases: list[tuple[str, str, list[Any]]] = []
    names = iter(range(10**6))

    @settings(
        max_examples=25 if backend == "sqlite" else 12,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(edits=EDITS)
    def run(edits: list[Edit]) -> None:
        name = f"s{next(names)}"
        with stashpoint.open(url) as store:
            written = play(store, name, edits)
            for ident, want in written:  # also in this process, from a fresh session object
                assert store.session(name).state(ident)["messages"] == want
        cases.extend((name, ident, want) for ident, want in written)

    run()
    # Explicit shrink-twice sequences, whatever the random draw held.
    with stashpoint.open(url) as store:
        for name, edits in {
            "shrink-twice": [("append", 2), ("pop", 0), ("pop", 0)],
            "in-place-at-the-end": [("append", 1), ("in-place", 1), ("in-place", 1)],
            "shrink-thrice-then-grow": [
                ("append", 2),
                ("append", 2),
                ("pop", 1),
                ("truncate", 2),
                ("pop", 0),
                ("append", 1),
            ],
        }.items():
            written = play(store, name, edits)  # type: ignore[arg-type]
            cases.extend((name, ident, want) for ident, want in written)
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(cases))
    proc = subprocess.run(
        [sys.executable, "-c", VERIFY, url, str(spec)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) == len(cases)


def test_openai_agents_pop_item_twice_undoes_a_turn(tmp_path: Path) -> None:
    """The SDK's documented undo of a turn: ``pop_item()`` twice (the answer, then the
    question). The second pop's checkpoint failed with "has missing messages"."""
    import asyncio

    from stashpoint.integrations.openai_agents import StashpointSession

    async def scenario() -> None:
        session = StashpointSession("chat", tmp_path / "store")
        turn1 = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        turn2 = [{"role": "user", "content": "bad"}, {"role": "assistant", "content": "oops"}]
        await session.add_items(turn1)
        await session.add_items(turn2)
        assert await session.pop_item() == turn2[1]
        assert await session.pop_item() == turn2[0]
        assert await session.pop_item() == turn1[1]  # a third shrink
        await session.add_items([{"role": "assistant", "content": "hello again"}])
        session.close()
        reopened = StashpointSession("chat", tmp_path / "store")
        assert await reopened.get_items() == [
            turn1[0],
            {"role": "assistant", "content": "hello again"},
        ]
        reopened.close()

    asyncio.run(scenario())


def test_pydantic_ai_history_saved_shorter_twice(tmp_path: Path) -> None:
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    from stashpoint.integrations.pydantic_ai import MessageHistory

    msgs = [ModelRequest(parts=[UserPromptPart(content=f"q{i}")]) for i in range(4)]
    history = MessageHistory("pa", tmp_path / "store")
    for n in (4, 3, 2, 1):
        history.save(msgs[:n])
    reloaded = MessageHistory("pa", tmp_path / "store")
    assert [m.parts[0].content for m in reloaded.load()] == ["q0"]  # type: ignore[union-attr]
    assert [len(reloaded.load(c.id)) for c in reloaded.stash.history()] == [1, 2, 3, 4]


def test_a_message_changed_in_place_is_redacted_again(tmp_path: Path) -> None:
    """The redactor does not scan a message again when it was redacted before: one that
    gained a secret in place must be scanned again (else the secret is stored), and one whose
    secret was edited out in place must be stored as edited (not the earlier redacted copy)."""
    key = "sk-" + "a1B2c3D4" * 4
    with stashpoint.open(tmp_path / "store") as store:
        run = store.session("s")
        msgs = [_message(0, "hello"), _message(1, f"my key is {key}")]
        run.checkpoint({"messages": msgs})
        msgs[0]["content"] = f"now {key}"
        msgs[1]["content"] = "no key here"
        run.checkpoint({"messages": msgs})
    with stashpoint.open(tmp_path / "store") as store:
        got = [m["content"] for m in store.session("s").state()["messages"]]
    assert key not in got[0] and got[0].startswith("now ")
    assert got[1] == "no key here"


def test_nested_values_changed_in_place_are_stored(tmp_path: Path) -> None:
    """A message is compared with a copy of it taken when it was stored: a dict of strings
    is copied whole, one with lists or dicts inside copies those too. A change deep inside a
    message that is otherwise the same object with the same text is stored."""
    with stashpoint.open(tmp_path / "store") as store:
        run = store.session("s")
        msgs: list[Any] = [
            {"role": "user", "content": "q", "parts": ["a"]},
            {"role": "assistant", "content": "r", "calls": [{"args": {"q": "x"}}]},
            {"role": "tool", "content": "t", "pair": (1, ["y"])},
            {"role": "user", "content": "plain"},
        ]
        run.checkpoint({"messages": msgs})
        msgs[0]["parts"].append("b")
        msgs[1]["calls"][0]["args"]["q"] = "changed"
        msgs[2]["pair"][1].append("z")
        msgs[3]["extra"] = {}
        run.checkpoint({"messages": msgs})
        want = copy.deepcopy(msgs)
    with stashpoint.open(tmp_path / "store") as store:
        assert store.session("s").state()["messages"] == want
