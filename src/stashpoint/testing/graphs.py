"""A small real LangGraph chat graph, for tests and benchmarks that compare checkpointers.

Two nodes, ``plan`` (counts the turn) then ``reply`` (one AI message), over a state whose
``messages`` channel uses ``add_messages``: the shape of a chat agent's turn, with nothing
else in it, so what is measured or checked is the checkpointer's work. Needs ``langgraph``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["chat_graph"]


def chat_graph(
    checkpointer: Any,
    reply: Callable[[int], str] = lambda turn: f"answer {turn}",
    *,
    on_plan: Callable[[int], None] | None = None,
) -> Any:
    """The compiled graph over ``checkpointer``: each ``invoke`` is one turn; ``reply(t)``
    is the AI message of turn ``t`` (from 1), ``on_plan(t)`` runs in the plan node (a
    benchmark rewrites a workspace file there)."""
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, AnyMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    # The functional form: this module's annotations are strings, which LangGraph would
    # resolve in the module's globals, where these names are not (imported here, lazily).
    State = TypedDict(  # noqa: UP013
        "State", {"messages": Annotated[list[AnyMessage], add_messages], "turn": int}
    )

    def plan(state: Any) -> dict[str, Any]:
        turn = int(state.get("turn", 0)) + 1
        if on_plan is not None:
            on_plan(turn)
        return {"turn": turn}

    def answer(state: Any) -> dict[str, Any]:
        return {"messages": [AIMessage(content=reply(int(state["turn"])))]}

    g = StateGraph(State)
    g.add_node("plan", plan)
    g.add_node("reply", answer)
    g.add_edge(START, "plan")
    g.add_edge("plan", "reply")
    g.add_edge("reply", END)
    return g.compile(checkpointer=checkpointer)
