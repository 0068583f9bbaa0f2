"""A Pydantic AI agent whose message history is saved with stashpoint checkpoints.

Offline and deterministic: ``FunctionModel`` answers from the messages it is given (so it
only knows your name if the history was really loaded), and ``TestModel`` shows a tool call
round trip. The history is saved after each run, reloaded by a second ``MessageHistory`` (as a
new process would), and forked from an earlier checkpoint into an independent branch.

    pip install 'stashpoint[pydantic-ai]'
    python examples/pydantic_ai_history.py [DIR]     # default: a new temporary directory
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import stashpoint
from stashpoint.integrations.pydantic_ai import MessageHistory


def remembers_names(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model that can only answer 'what is my name?' from the conversation it receives."""
    prompts = [
        part.content
        for m in messages
        if isinstance(m, ModelRequest)
        for part in m.parts
        if isinstance(part, UserPromptPart) and isinstance(part.content, str)
    ]
    names = [m.group(1) for p in prompts if (m := re.search(r"my name is (\w+)", p))]
    if "name?" in prompts[-1]:
        return ModelResponse(parts=[TextPart(f"Your name is {names[-1]}." if names else "?")])
    return ModelResponse(parts=[TextPart(f"Noted ({len(prompts)} prompts so far).")])


def main(root: Path) -> None:
    store = stashpoint.open(root / "store")
    agent = Agent(FunctionModel(remembers_names))

    history = MessageHistory("pa-chat", store)
    for prompt in ("my name is Ada", "I like tea", "what is my name?"):
        result = history.run_sync(agent, prompt)  # load, run, save
        print(f"  [main] > {prompt}\n  [main] < {result.output}")

    print("\na second MessageHistory (as a new process would) loads the same history:")
    loaded = MessageHistory("pa-chat", store).load()
    print(f"  {len(loaded)} messages, equal to what was saved: {loaded == result.all_messages()}")

    print("\nsave and load by hand (TestModel calls a tool; every part survives the trip):")
    tool_agent = Agent(TestModel())

    @tool_agent.tool_plain
    def lookup(topic: str) -> str:
        """Look something up."""
        return f"facts about {topic}"

    tools = MessageHistory("pa-tools", store)
    run = tool_agent.run_sync("look it up", message_history=tools.load())
    cp = tools.save(run.all_messages(), label="after-lookup")
    kinds = [part.part_kind for m in tools.load("after-lookup") for part in m.parts]
    print(f"  {cp.id[:12]} [after-lookup]: {' -> '.join(kinds)}")
    print(f"  loaded == saved: {tools.load() == run.all_messages()}")

    print("\nfork from the checkpoint after the first run, and give another name there:")
    first = history.stash.history()[-1]  # oldest: after 'my name is Ada'
    retry = history.fork(first.id, "grace")
    for prompt in ("actually, my name is Grace", "what is my name?"):
        result = retry.run_sync(agent, prompt)
        print(f"  [grace] > {prompt}\n  [grace] < {result.output}")
    print(f"  main still answers Ada: {history.run_sync(agent, 'what is my name?').output}")

    print("\nhistory (newest first):")
    for c in history.stash.history():
        print(f"  {c.id[:12]} {c.branch:<6} {c.message}")
    print(f"store: {root / 'store'}; try:")
    print(f"  stashpoint --store {root / 'store'} --session pa-chat log --graph")
    store.close()


if __name__ == "__main__":
    if len(sys.argv) > 2 or (len(sys.argv) == 2 and sys.argv[1].startswith("-")):
        sys.exit(f"usage: python {sys.argv[0]} [DIRECTORY]  (default: a new temporary one)")
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="sp-pydantic-")))
