"""A scripted ``Model`` for the OpenAI Agents SDK tests: the SDK's real ``Runner`` without an
API or a network. A module of its own (not a test file) so that a child process can import it
without the other frameworks the integration tests load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents import Agent, ModelResponse, Usage, function_tool
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(text: str, ident: str = "m") -> dict[str, Any]:
    return {
        "id": ident,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


class Scripted(Model):
    """Rules instead of an API: ``write NAME: TEXT`` calls the tool, a tool result gets a
    final answer, anything else is answered with the number of user inputs it was given."""

    def __init__(self, *, response_ids: bool = False) -> None:
        self.n = 0
        self.response_ids = response_ids
        """Give each response an id, as the Responses API does (what the SDK's automatic
        compaction waits for)."""

    async def get_response(
        self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        self.n += 1
        items = [user(input)] if isinstance(input, str) else input
        last = items[-1]
        if last.get("type") == "function_call_output":
            out: Any = self.text(f"done: {last['output']}")
        elif str(last.get("content", "")).startswith("write "):
            name, _, body = str(last["content"])[6:].partition(": ")
            out = ResponseFunctionToolCall(
                id=f"fc{self.n}",
                call_id=f"call{self.n}",
                type="function_call",
                name="write_file",
                arguments=json.dumps({"name": name, "text": body}),
            )
        else:
            out = self.text(f"{sum(1 for i in items if i.get('role') == 'user')} inputs")
        response_id = f"resp{self.n}" if self.response_ids else None
        return ModelResponse(output=[out], usage=Usage(), response_id=response_id)

    def text(self, text: str) -> ResponseOutputMessage:
        part = ResponseOutputText(type="output_text", text=text, annotations=[], logprobs=[])
        return ResponseOutputMessage(
            id=f"msg{self.n}",
            type="message",
            role="assistant",
            status="completed",
            content=[part],
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def approval_agent(workspace: Path, *, response_ids: bool = False) -> Agent[Any]:
    """``write NAME: TEXT`` asks for approval first; every execution is logged in
    ``workspace/.calls``, so a tool run twice would show."""

    @function_tool(needs_approval=True)
    def write_file(name: str, text: str) -> str:
        """Write a file."""
        (workspace / name).write_text(text)
        with (workspace.parent / f"{workspace.name}.calls").open("a") as log:
            log.write(f"{name}\n")
        return f"wrote {name}"

    model = Scripted(response_ids=response_ids)
    return Agent(name="approver", instructions="test", model=model, tools=[write_file])
