"""Framework adapters on real SQLite stores: the OpenAI Agents SDK session driven by
the SDK's own ``Runner`` with a scripted ``Model``, Pydantic AI histories with ``TestModel`` and
``FunctionModel``, the examples run as a user runs them, and ``import stashpoint`` without the
extras installed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic_ai
import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.memory import Session as SDKSession
from agents.memory import SessionSettings
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.messages import ModelResponse as PAIResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import stashpoint
from stashpoint.errors import UsageError
from stashpoint.integrations.openai_agents import StashpointSession
from stashpoint.integrations.pydantic_ai import MessageHistory
from stashpoint.verify import verify_store

from .agents_scripted import Scripted, answer, user

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


# -- OpenAI Agents SDK ---------------------------------------------------------------------


def test_agents_session_protocol_keeps_history(tmp_path: Path) -> None:
    async def scenario() -> None:
        session = StashpointSession("chat", tmp_path / "store")
        assert isinstance(session, SDKSession)  # the SDK's runtime-checkable protocol
        assert await session.get_items() == [] and await session.pop_item() is None
        await session.add_items([user("hi")])
        await session.add_items([answer("hello", "m1"), user("how are you?")])
        await session.add_items([])  # nothing to record
        items = await session.get_items()
        assert items == [user("hi"), answer("hello", "m1"), user("how are you?")]
        assert await session.get_items(limit=2) == items[-2:]
        assert await session.get_items(limit=0) == []
        items[0]["content"] = "mutated by the caller"  # returned copies, not our state
        assert (await session.get_items())[0] == user("hi")
        assert len(session.stash.history()) == 2  # one checkpoint per add_items

        # pop and clear record shorter conversations; nothing is lost
        assert await session.pop_item() == user("how are you?")
        assert await session.get_items() == [user("hi"), answer("hello", "m1")]
        await session.clear_session()
        assert await session.get_items() == []
        history = session.stash.history()
        assert [c.kind for c in history] == ["edit", "edit", "auto", "auto"]
        assert session.stash.state("HEAD~2")["messages"][-1] == user("how are you?")
        session.close()

        # another process (a new object on a new store handle) continues where it stopped
        reopened = StashpointSession(
            "chat", tmp_path / "store", session_settings=SessionSettings(limit=1)
        )
        await reopened.add_items([user("again")])
        assert await reopened.get_items() == [user("again")]  # limit from the settings
        assert len(await reopened.get_items(limit=10)) == 1
        reopened.close()

    asyncio.run(scenario())
    store = stashpoint.open(tmp_path / "store")
    assert verify_store(store).ok
    store.close()


def test_agents_calls_made_together_are_stored_in_call_order(tmp_path: Path) -> None:
    """The async methods' store calls run one at a time in the order they were made (the
    serial queue of stashpoint.aio), as an AsyncSession's do: items added by calls gathered
    at once end up in that order, not in whichever order worker threads took a lock."""

    async def scenario() -> None:
        session = StashpointSession("chat", tmp_path / "store")
        await asyncio.gather(*(session.add_items([user(str(i))]) for i in range(24)))
        assert [item["content"] for item in await session.get_items()] == [
            str(i) for i in range(24)
        ]
        session.close()

    asyncio.run(scenario())


def agent_for(workspace: Path) -> Agent[Any]:
    @function_tool
    def write_file(name: str, text: str) -> str:
        """Write a file."""
        (workspace / name).write_text(text)
        return f"wrote {name}"

    return Agent(name="t", instructions="test", model=Scripted(), tools=[write_file])


def test_agents_runner_with_workspace_and_fork_from_a_turn(tmp_path: Path) -> None:
    ws, alt = tmp_path / "ws", tmp_path / "alt"
    ws.mkdir()
    config = RunConfig(tracing_disabled=True)

    async def scenario() -> None:
        store = stashpoint.open(tmp_path / "store")
        session = StashpointSession("run", store, workspace=ws)
        for text in ("write a.txt: one", "write b.txt: two", "write a.txt: three", "count"):
            result = await Runner.run(agent_for(ws), text, session=session, run_config=config)
        assert result.final_output == "4 inputs"  # the session's history reached the model
        turns = session.turns()
        assert [t.text for t in turns] == [
            "write a.txt: one",
            "write b.txt: two",
            "write a.txt: three",
            "count",
        ]
        assert [t.end - t.start for t in turns] == [4, 4, 4, 2]
        items = await session.get_items()

        # fork after turn 2 into another directory: conversation and files as they were then
        fork = session.fork(2, "retry", into=alt)
        assert await fork.get_items() == items[:8]
        assert (alt / "a.txt").read_text() == "one" and (alt / "b.txt").read_text() == "two"
        assert fork.stash.head is not None and fork.stash.head.kind != "edit"  # no truncation
        result = await Runner.run(agent_for(alt), "count", session=fork, run_config=config)
        assert result.final_output == "3 inputs"
        assert (ws / "a.txt").read_text() == "three"  # the original run is untouched
        assert await session.get_items() == items
        assert set(session.stash.branches()) == {"main", "retry"}

        # fork from a checkpoint reference, and from before the first turn
        by_ref = session.fork("HEAD~1", "by-ref", into=tmp_path / "by-ref")
        assert await by_ref.get_items() == items[:-1]
        empty = session.fork(0, "empty", into=tmp_path / "empty")
        assert await empty.get_items() == []
        with pytest.raises(UsageError, match="no turn 9"):
            session.fork(9)
        store.close()

    asyncio.run(scenario())
    store = stashpoint.open(tmp_path / "store")
    assert verify_store(store).ok
    store.close()


def test_agents_fork_in_place_switches_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario() -> None:
        session = StashpointSession("p", tmp_path / "store", workspace=ws)
        for text in ("write a.txt: one", "write a.txt: two"):
            await Runner.run(
                agent_for(ws), text, session=session, run_config=RunConfig(tracing_disabled=True)
            )
        alt = session.fork(1)  # no `into`: this directory moves to the new branch
        assert alt.stash.branch.startswith("fork-") and session.stash.branch == "main"
        assert (ws / "a.txt").read_text() == "one"
        assert len(await alt.get_items()) == 4 and len(await session.get_items()) == 8
        session.close()

    asyncio.run(scenario())


# -- Pydantic AI ---------------------------------------------------------------------------


def as_json(messages: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(messages, mode="json")


def echo(messages: list[ModelMessage], info: AgentInfo) -> PAIResponse:
    prompts = [
        p.content
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart)
    ]
    return PAIResponse(parts=[TextPart(f"{len(prompts)} prompts, last {prompts[-1]!r}")])


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The thread's event loop for pydantic-ai's ``run_sync``, which reuses the current loop
    and leaves it open; closing it here keeps its ResourceWarning out of later tests."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def test_pydantic_ai_history_round_trip_append_and_fork(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    store = stashpoint.open(tmp_path / "store")
    history = MessageHistory("pa", store)
    assert history.load() == []
    agent = pydantic_ai.Agent(FunctionModel(echo))
    r1 = history.run_sync(agent, "first")
    assert r1.output == "1 prompts, last 'first'"
    r2 = history.run_sync(agent, "second")
    assert r2.output == "2 prompts, last 'second'"  # the loaded history reached the model
    assert history.load() == r2.all_messages()

    # saving the longer history stored only the new messages (same log, prefix kept)
    one, two = history.stash.history()[::-1]
    assert one.state.conversation is not None and two.state.conversation is not None
    assert two.state.conversation.log == one.state.conversation.log
    d = history.stash.diff(one.id, two.id)
    assert d.messages_removed == 0 and len(d.messages_added) == 2

    # every part type survives: binary content, tool calls and returns (TestModel)
    tools = pydantic_ai.Agent(TestModel())

    @tools.tool_plain
    def lookup(topic: str) -> str:
        """Look it up."""
        return topic.upper()

    binary = BinaryContent(data=b"\x00\xffPNG", media_type="image/png")
    run = tools.run_sync(["see this", binary])
    saved = history.save(run.all_messages(), message="tools", label="tools")
    reloaded = MessageHistory("pa", tmp_path / "store").load("tools")
    # pydantic-ai's own JSON format is the contract (it reloads an image as BinaryImage)
    assert as_json(reloaded) == as_json(run.all_messages())
    first_part = reloaded[0].parts[0]
    assert isinstance(first_part, UserPromptPart) and isinstance(first_part.content, list)
    assert first_part.content[1].data == b"\x00\xffPNG"  # type: ignore[union-attr]
    kinds = [p.part_kind for m in reloaded for p in m.parts]
    assert kinds == ["user-prompt", "tool-call", "tool-return", "text"]
    assert history.load(two.id) == r2.all_messages()  # earlier histories stay loadable
    assert history.stash.get("tools").id == saved.id

    # fork at the first save: an independent line
    alt = history.fork(one.id, "alt")
    r3 = loop.run_until_complete(alt.run(agent, "other"))
    assert r3.output == "2 prompts, last 'other'"
    assert as_json(history.load("tools")) == as_json(run.all_messages())  # main untouched
    assert set(history.stash.branches()) == {"main", "alt"}
    assert verify_store(store).ok
    store.close()


def test_pydantic_ai_two_histories_on_one_session_build_on_each_other(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    """Two workers on one session: each load and save starts from the latest head, not the
    one its engine object cached, so no save drops the other's turn."""
    store = stashpoint.open(tmp_path / "store")
    agent = pydantic_ai.Agent(FunctionModel(echo))
    one, two = MessageHistory("pa", store), MessageHistory("pa", store)
    one.run_sync(agent, "first")
    assert two.run_sync(agent, "second").output == "2 prompts, last 'second'"
    assert one.run_sync(agent, "third").output == "3 prompts, last 'third'"
    for history in (one, two, MessageHistory("pa", store)):
        prompts = [
            p.content for m in history.load() for p in m.parts if p.part_kind == "user-prompt"
        ]
        assert prompts == ["first", "second", "third"]
    assert verify_store(store).ok
    store.close()


def test_pydantic_ai_run_saves_off_the_event_loop(
    tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    """``await history.run(...)`` does the store's blocking I/O in a worker thread: the
    checkpoint (seen through its redactor, which runs where the checkpoint is written) is
    not written on the thread that runs the event loop."""
    writers: list[str] = []

    def redact(value: Any) -> Any:
        writers.append(threading.current_thread().name)
        return value

    store = stashpoint.open(tmp_path / "store")
    history = MessageHistory("pa", store, redact=redact)
    agent = pydantic_ai.Agent(FunctionModel(echo))
    result = loop.run_until_complete(history.run(agent, "first"))
    assert result.output == "1 prompts, last 'first'"
    assert writers and threading.current_thread().name not in writers
    assert history.load() == result.all_messages()
    store.close()


# -- packaging: optional extras, examples ---------------------------------------------------


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("stashpoint.integrations.openai_agents", "agents", "openai-agents"),
        ("stashpoint.integrations.pydantic_ai", "pydantic_ai", "pydantic-ai"),
    ],
)
def test_missing_extra_names_the_install_line(
    tmp_path: Path, module: str, blocked: str, extra: str
) -> None:
    code = f"""
import sys
sys.modules[{blocked!r}] = None  # as if the extra were not installed
import stashpoint, stashpoint.cli
store = stashpoint.open("store")
store.session("s").checkpoint({{"messages": ["ok"]}})
store.close()
try:
    import {module}
except ImportError as exc:
    from stashpoint import StashpointError
    assert isinstance(exc, StashpointError), type(exc)
    print("ERR", exc)
"""
    proc = run_python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"ERR stashpoint.integrations.{module.rsplit('.', 1)[1]} needs" in proc.stdout
    assert f"pip install 'stashpoint[{extra}]'" in proc.stdout


def test_import_stashpoint_loads_no_framework(tmp_path: Path) -> None:
    proc = run_python(
        "import sys, stashpoint, stashpoint.cli, stashpoint.session, stashpoint.integrations\n"
        "print(sorted(m for m in ('agents', 'pydantic_ai', 'openai') if m in sys.modules))",
        tmp_path,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


@pytest.mark.parametrize(
    ("script", "expect"),
    [
        ("openai_agents_session.py", ["You have sent me 4 messages so far.", "popped == HEAD~1"]),
        ("pydantic_ai_history.py", ["Your name is Grace.", "main still answers Ada"]),
    ],
)
def test_examples_run(tmp_path: Path, script: str, expect: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLES / script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for line in expect:
        assert line in proc.stdout
    assert "True" in proc.stdout and "False" not in proc.stdout
    store = stashpoint.open(tmp_path / "store")
    assert verify_store(store).ok
    session = store.sessions()[0]
    assert len(store.session(session).branches()) == 2
    store.close()
    if script.startswith("openai"):
        assert not (tmp_path / "workspace" / "notes.txt").exists()  # deleted in turn 3
        assert (tmp_path / "workspace-alt" / "notes.txt").read_text() == "buy milk and eggs\n"
