"""An OpenAI Agents SDK agent whose session is checkpointed by stashpoint, then forked.

Offline and deterministic: the model is scripted (it implements the SDK's ``Model`` interface
with rules instead of an API call), its tools write real files in a workspace directory, and
every batch of items the ``Runner`` saves becomes a stashpoint checkpoint together with the
workspace files at that moment. After three turns the run is forked from turn 2 into a second
directory, where the files are as they were then, and continues differently there.

    pip install 'stashpoint[openai-agents]'
    python examples/openai_agents_session.py [DIR]     # default: a new temporary directory
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent, ModelResponse, RunConfig, Runner, Usage, function_tool
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import stashpoint
from stashpoint.integrations.openai_agents import StashpointSession


class ScriptedModel(Model):
    """Answers from rules, like the SDK's own tests' fake model: ``write NAME: TEXT`` and
    ``delete NAME`` become tool calls, a tool result is acknowledged, anything else is
    answered with how much history the model was given."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(
        self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        self.calls += 1
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        last = items[-1]
        if last.get("type") == "function_call_output":
            return self._reply(f"Done: {last['output']}.")
        text = str(last.get("content", ""))
        if text.startswith("write "):
            name, _, body = text[len("write ") :].partition(": ")
            return self._call("write_file", {"name": name, "text": body})
        if text.startswith("delete "):
            return self._call("delete_file", {"name": text[len("delete ") :]})
        users = sum(1 for i in items if i.get("role") == "user")
        return self._reply(f"You have sent me {users} messages so far.")

    def stream_response(self, *args: Any, **kw: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("this example does not stream")

    def _reply(self, text: str) -> ModelResponse:
        content = [ResponseOutputText(type="output_text", text=text, annotations=[], logprobs=[])]
        msg = ResponseOutputMessage(
            id=f"msg_{self.calls}",
            type="message",
            role="assistant",
            status="completed",
            content=content,
        )
        return ModelResponse(output=[msg], usage=Usage(), response_id=None)

    def _call(self, name: str, arguments: dict[str, str]) -> ModelResponse:
        call = ResponseFunctionToolCall(
            id=f"fc_{self.calls}",
            call_id=f"call_{self.calls}",
            type="function_call",
            name=name,
            arguments=json.dumps(arguments),
        )
        return ModelResponse(output=[call], usage=Usage(), response_id=None)


def make_agent(workspace: Path) -> Agent[Any]:
    @function_tool
    def write_file(name: str, text: str) -> str:
        """Write a text file in the workspace."""
        (workspace / name).write_text(text + "\n")
        return f"wrote {name}"

    @function_tool
    def delete_file(name: str) -> str:
        """Delete a file from the workspace."""
        (workspace / name).unlink()
        return f"deleted {name}"

    return Agent(
        name="notes",
        instructions="Keep notes.",
        model=ScriptedModel(),
        tools=[write_file, delete_file],
    )


async def turn(session: StashpointSession, workspace: Path, text: str) -> None:
    config = RunConfig(tracing_disabled=True)  # offline: no trace export
    result = await Runner.run(make_agent(workspace), text, session=session, run_config=config)
    files = sorted(p.name for p in workspace.iterdir() if not p.name.startswith("."))
    print(
        f"  [{session.stash.branch}] > {text}\n  [{session.stash.branch}] < {result.final_output}"
        f"   files: {', '.join(files) or '-'}"
    )


async def main(root: Path) -> None:
    workspace, alt = root / "workspace", root / "workspace-alt"
    workspace.mkdir(parents=True, exist_ok=True)
    store = stashpoint.open(root / "store")
    session = StashpointSession("notes-chat", store, workspace=workspace)

    print("three turns, each item batch checkpointed with the workspace:")
    for text in ("write notes.txt: buy milk", "write plan.txt: step 1", "delete notes.txt"):
        await turn(session, workspace, text)
    for t in session.turns():
        print(f"  turn {t.number}: {t.text!r} (items {t.start}-{t.end - 1})")

    print("\nfork after turn 2 into a second directory (notes.txt is back there):")
    retry = session.fork(2, "keep-notes", into=alt)
    await turn(retry, alt, "write notes.txt: buy milk and eggs")
    await turn(retry, alt, "how long is this conversation?")

    print("\npop_item keeps history: the popped answer is still in the previous checkpoint")
    popped = await session.pop_item()
    kept = session.stash.state("HEAD~1")["messages"][-1]
    print(f"  popped == HEAD~1's last item: {popped == kept}")

    print("\nhistory (newest first):")
    for cp in session.stash.history():
        print(f"  {cp.id[:12]} {cp.branch:<10} {cp.kind:<10} {cp.message}")
    main_items, retry_items = await session.get_items(), await retry.get_items()
    print(f"\nmain has {len(main_items)} items, keep-notes {len(retry_items)}")
    print(f"store: {root / 'store'}; try:")
    print(f"  stashpoint --store {root / 'store'} --session notes-chat log --graph")
    store.close()


if __name__ == "__main__":
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1].startswith("-")):
        sys.exit(f"usage: python {sys.argv[0]} [DIRECTORY]  (default: a new temporary one)")
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="sp-agents-"))
    asyncio.run(main(root))
