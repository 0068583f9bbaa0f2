"""The OpenAI Agents SDK's optional session hooks on ``StashpointSession``, driven by the SDK's
own ``Runner`` with a scripted model: a run paused for tool approval kept in the store and
resumed by another process after the first one died, the SDK's compaction session replacing
history in one checkpoint (and never over another writer's items), and ``pop_item`` racing a
writer.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner
from agents.memory import OpenAIResponsesCompactionSession, SessionSettings

import stashpoint
from stashpoint.errors import UsageError
from stashpoint.integrations.openai_agents import StashpointSession
from stashpoint.verify import verify_store

from .agents_scripted import approval_agent, user

CONFIG = RunConfig(tracing_disabled=True)


def kinds(items: list[Any]) -> list[str]:
    return [str(item.get("type") or item.get("role")) for item in items]


# -- a run paused for approval ---------------------------------------------------------------


def pause_and_die(ws: Path, store: str) -> None:
    """The first half, in a child process: run until the tool asks for approval, keep the
    paused run in the session, and die (no close, no cleanup: only the store survives)."""

    async def main() -> None:
        session = StashpointSession("paused", store, workspace=ws)
        result = await Runner.run(
            approval_agent(ws), "write a.txt: hello", session=session, run_config=CONFIG
        )
        assert [i.tool_name for i in result.interruptions] == ["write_file"]
        await session.save_run_state(result)
        os._exit(0)

    try:
        asyncio.run(main())
    finally:
        os._exit(3)


def test_paused_run_resumes_in_a_fresh_process_from_the_store_alone(tmp_path: Path) -> None:
    ws, store = tmp_path / "ws", str(tmp_path / "store")
    ws.mkdir()
    # a fresh interpreter (spawned, not forked: a fork of a test worker whose earlier tests
    # started the SDK's threads can inherit a held lock and hang): nothing of the run reaches
    # the resuming side but what the store holds
    child = multiprocessing.get_context("spawn").Process(target=pause_and_die, args=(ws, store))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    calls = tmp_path / "ws.calls"
    assert not calls.exists()  # the tool waits for approval

    async def resume() -> None:
        agent = approval_agent(ws)  # a new agent, a new model: nothing from the dead process
        session = StashpointSession("paused", store, workspace=ws)
        assert kinds(await session.get_items()) == ["user", "function_call"]
        state = await session.load_run_state(agent)
        assert state is not None
        [waiting] = state.get_interruptions()
        assert waiting.tool_name == "write_file"
        state.approve(waiting)
        result = await Runner.run(agent, state, session=session, run_config=CONFIG)
        assert result.final_output == "done: wrote a.txt"
        assert (ws / "a.txt").read_text() == "hello"
        items = await session.get_items()
        assert kinds(items) == ["user", "function_call", "function_call_output", "message"]
        assert items[0]["content"] == "write a.txt: hello"
        assert items[2]["output"] == "wrote a.txt"
        assert await session.load_run_state(agent) is None  # spent: the run went on

        # back to the pause: the conversation, the files and the paused run come back together
        paused = next(cp for cp in session.stash.history() if cp.kind == "paused")
        session.stash.rewind(paused.id)
        assert kinds(await session.get_items()) == ["user", "function_call"]
        assert not (ws / "a.txt").exists()
        again = await session.load_run_state(agent)
        assert again is not None
        again.reject(again.get_interruptions()[0])
        result = await Runner.run(agent, again, session=session, run_config=CONFIG)
        assert str(result.final_output).startswith("done: ") and not (ws / "a.txt").exists()
        session.close()

    asyncio.run(resume())
    assert calls.read_text() == "a.txt\n"  # approved once, run once
    opened = stashpoint.open(store)
    assert verify_store(opened).ok
    opened.close()


def test_run_state_follows_forks_and_not_other_conversations(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario() -> None:
        agent = approval_agent(ws)
        session = StashpointSession("s", tmp_path / "store", workspace=ws)
        assert await session.load_run_state(agent) is None
        result = await Runner.run(agent, "write b.txt: x", session=session, run_config=CONFIG)
        paused = await session.save_run_state(result.to_state())
        fork = session.fork(paused.id, "other", into=tmp_path / "fork")
        peek = await fork.load_run_state(approval_agent(tmp_path / "fork"), claim=False)
        assert peek is not None
        await session.add_items([user("something else")])  # another writer moved on
        assert await session.load_run_state(agent) is None
        assert await fork.load_run_state(approval_agent(tmp_path / "fork")) is not None
        assert await fork.load_run_state(approval_agent(tmp_path / "fork")) is None  # claimed
        session.close()

    asyncio.run(scenario())


def resume_when_told(ws: Path, store: str, go: Any, out: Any) -> None:
    """One of two processes resuming the same paused run at the same instant."""

    async def main() -> None:
        session = StashpointSession("paused", store, workspace=ws)
        agent = approval_agent(ws)
        go.wait()
        state = await session.load_run_state(agent)
        if state is None:
            out.put("none")
            return
        state.approve(state.get_interruptions()[0])
        result = await Runner.run(agent, state, session=session, run_config=CONFIG)
        out.put(str(result.final_output))

    try:
        asyncio.run(main())
    finally:
        out.close()
        out.join_thread()  # os._exit skips the flush of what was put: the parent waits for it
        os._exit(0)


def test_two_processes_resuming_one_paused_run_run_the_tool_once(tmp_path: Path) -> None:
    ws, store = tmp_path / "ws", str(tmp_path / "store")
    ws.mkdir()

    async def pause() -> None:
        session = StashpointSession("paused", store, workspace=ws)
        result = await Runner.run(
            approval_agent(ws), "write a.txt: hello", session=session, run_config=CONFIG
        )
        await session.save_run_state(result)
        session.close()

    asyncio.run(pause())
    ctx = multiprocessing.get_context("spawn")  # see above: a fork could inherit a held lock
    go, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=resume_when_told, args=(ws, store, go, out)) for _ in range(2)]
    for proc in procs:
        proc.start()
    results = sorted(out.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(60)
    assert results == ["done: wrote a.txt", "none"]
    assert (tmp_path / "ws.calls").read_text() == "a.txt\n"  # approved once, run once

    async def check() -> None:
        session = StashpointSession("paused", store)
        items = await session.get_items()
        assert kinds(items) == ["user", "function_call", "function_call_output", "message"]
        # popping the resumed run's items does not bring the spent run back
        await session.pop_item()
        await session.pop_item()
        assert await session.load_run_state(approval_agent(ws)) is None
        session.close()

    asyncio.run(check())


def test_a_run_that_is_not_paused_or_another_agent_is_refused(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario() -> None:
        session = StashpointSession("s", tmp_path / "store", workspace=ws)
        done = await Runner.run(approval_agent(ws), "just talk", session=session, run_config=CONFIG)
        with pytest.raises(UsageError, match="not paused"):
            await session.save_run_state(done)
        paused = await Runner.run(
            approval_agent(ws), "write c.txt: x", session=session, run_config=CONFIG
        )
        cp = await session.save_run_state(paused)
        assert cp.message == "agents run paused: awaiting write_file"
        stranger = Agent(name="stranger")
        with pytest.raises(UsageError, match="cannot be resumed"):
            await session.load_run_state(stranger)
        assert await session.load_run_state(approval_agent(ws)) is not None  # not claimed
        session.close()

    asyncio.run(scenario())


# -- the SDK's compaction session ----------------------------------------------------------


class Compactor:
    """Stands in for the OpenAI client's ``responses.compact`` (the only call the compaction
    session makes): one summary item for what it was given; ``meanwhile`` runs while the
    request is in flight."""

    def __init__(self, meanwhile: Any = None) -> None:
        self.responses = self
        self.inputs: list[list[Any]] = []
        self.meanwhile = meanwhile

    async def compact(self, **kwargs: Any) -> Any:
        given = list(kwargs.get("input") or [])
        self.inputs.append(given)
        if self.meanwhile is not None:
            await self.meanwhile()
        return SimpleNamespace(output=[user(f"summary of {len(given)} items")], usage=None)


def compacting(session: StashpointSession, client: Compactor) -> OpenAIResponsesCompactionSession:
    return OpenAIResponsesCompactionSession(
        session.session_id,
        session,
        client=client,  # type: ignore[arg-type]
        compaction_mode="input",
        should_trigger_compaction=lambda context: True,
    )


def test_compaction_replaces_history_in_one_checkpoint(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario() -> None:
        # the model is sent the latest two items only: those and the run's exchange are
        # summarised, the three before them are kept as they are
        session = StashpointSession("c", tmp_path / "store", session_settings=SessionSettings(2))
        client = Compactor()
        wrapped = compacting(session, client)
        earlier = [user(f"earlier {i}") for i in range(5)]
        await session.add_items(earlier)
        agent = approval_agent(ws, response_ids=True)
        before = len(session.stash.history())
        result = await Runner.run(agent, "how many?", session=wrapped, run_config=CONFIG)
        assert result.final_output == "3 inputs"
        [sent] = client.inputs
        assert sent[:3] == [*earlier[3:], user("how many?")] and kinds(sent)[3:] == ["message"]
        assert session.stash.state()["messages"] == [*earlier[:3], user("summary of 4 items")]
        history = session.stash.history()
        # the run's input, its answer, then the compaction: one checkpoint each
        assert [cp.kind for cp in history[:4]] == ["edit", "auto", "auto", "auto"]
        assert len(history) == before + 3
        assert session.stash.state(history[1].id)["messages"] == [*earlier, *sent[2:]]

        # a manual compaction replaces the whole history, again as one checkpoint
        await wrapped.run_compaction({"force": True})
        [summary] = session.stash.state()["messages"]
        assert str(summary["content"]).startswith("summary of")
        assert len(session.stash.history()) == before + 4
        session.close()

    asyncio.run(scenario())


def test_compaction_never_drops_what_another_writer_added(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario() -> None:
        session = StashpointSession("c", tmp_path / "store")
        other = StashpointSession("c", tmp_path / "store")  # another process, in effect

        async def meanwhile() -> None:
            await other.add_items([user("from the other writer")])

        wrapped = compacting(session, Compactor(meanwhile))
        agent = approval_agent(ws, response_ids=True)
        await Runner.run(agent, "hi", session=wrapped, run_config=CONFIG)
        items = await session.get_items()
        assert kinds(items) == ["user", "message", "user"]
        assert items[-1] == user("from the other writer")
        other.close()
        session.close()

    asyncio.run(scenario())


# -- pop_item racing another writer ------------------------------------------------------------


def test_pop_item_never_overwrites_another_writers_items(tmp_path: Path) -> None:
    """Another writer appends between pop_item's read and its commit: the pop applies to the
    conversation with their item (as the SDK's SQLiteSession pops the newest row), and nothing
    else disappears."""

    async def scenario() -> list[Any]:
        session = StashpointSession("p", tmp_path / "store")
        other = StashpointSession("p", tmp_path / "store")
        await session.add_items([user("a"), user("b")])
        meta = session.store.meta
        commit = meta.commit

        def racing_commit(*args: Any, **kwargs: Any) -> Any:
            meta.commit = commit  # once
            other.stash.checkpoint(append_messages=[user("c")])
            return commit(*args, **kwargs)

        meta.commit = racing_commit  # type: ignore[method-assign]
        popped = await session.pop_item()
        assert popped == user("c")
        items = await other.get_items()
        other.close()
        session.close()
        return items

    assert asyncio.run(scenario()) == [user("a"), user("b")]
