"""Pydantic AI: save and load an agent's message history with checkpoints.

    from pydantic_ai import Agent
    from stashpoint.integrations.pydantic_ai import MessageHistory

    history = MessageHistory("support-42", ".stashpoint")
    result = agent.run_sync("hello", message_history=history.load())
    history.save(result.all_messages())      # a checkpoint; only the new messages are stored
    result = history.run_sync(agent, "and then?")   # the same three steps in one call
    before = history.load("HEAD~1")          # any earlier history, as ModelMessage objects
    retry = history.fork("HEAD~1", "retry")  # an independent line from there

Why: pydantic-ai leaves persistence to the application, in its JSON history format
(``to_jsonable_python`` out, ``ModelMessagesTypeAdapter`` in). Keeping each message as one entry
of a stashpoint conversation (an append-only log) makes saving after every run cost only the
new messages, keeps every earlier history loadable and verified, and records the workspace
files in the same checkpoint when the history has a workspace.

Needs ``pip install 'stashpoint[pydantic-ai]'``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..errors import MissingExtraError

try:
    from pydantic_ai.agent import AbstractAgent
    from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
    from pydantic_ai.run import AgentRunResult
    from pydantic_core import to_jsonable_python
except ImportError as exc:
    raise MissingExtraError(
        "stashpoint.integrations.pydantic_ai needs Pydantic AI: "
        "pip install 'stashpoint[pydantic-ai]'"
    ) from exc

from .._store import Store
from ..aio import SerialQueue
from ..model import Checkpoint
from ..opening import open_store
from ..session import Session

__all__ = ["MessageHistory"]


class MessageHistory:
    """A pydantic-ai message history kept as the conversation of a stashpoint session.

    Args:
        session_id: the stashpoint session name.
        store: a :class:`stashpoint.Store`, or a URL/path to open (default ``./.stashpoint``);
            a store opened here is closed by :meth:`close`.
        branch: branch to continue (default: ``main``, or the one the workspace follows).
        workspace: a directory snapshotted with every :meth:`save`.
        **options: passed to :class:`stashpoint.Session` (``config``, ``packages``, ...).

    Several writers on one session (two histories, threads, processes): a :meth:`save` of a
    list that extends what this history last loaded or saved adds only its new messages,
    after whatever the others saved meanwhile, so nobody's messages are lost (each writer's
    in its own order). A save of a shortened or edited list is an edit: it replaces the
    conversation, and the earlier checkpoints keep what it dropped.
    """

    def __init__(
        self,
        session_id: str,
        store: Store | str | os.PathLike[str] | None = None,
        *,
        branch: str | None = None,
        workspace: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        if isinstance(store, Store):
            self.store, self._owns_store = store, False
        else:
            self.store, self._owns_store = open_store(store), True
        self._options = options
        self.stash: Session = self.store.session(
            session_id, workspace=workspace, branch=branch, **options
        )
        """The stashpoint session behind it: ``history()``, ``diff()``, ``rewind()``, labels."""
        self._base: list[ModelMessage] | None = None  # what the caller last loaded or saved
        self._calls = SerialQueue()  # the async methods' store calls, in order

    def load(self, ref: str | None = None) -> list[ModelMessage]:
        """The messages as of ``ref`` (id, label, ``HEAD~N``; default: the latest save)."""
        state = self._latest().state(ref)
        msgs = ModelMessagesTypeAdapter.validate_python(
            state.get(self.stash.conversation_key) or []
        )
        if ref is None:
            self._base = list(msgs)
        return msgs

    def save(
        self,
        messages: Sequence[ModelMessage],
        *,
        message: str | None = None,
        label: str | None = None,
        kind: str = "auto",
    ) -> Checkpoint:
        """Record the whole history (usually ``result.all_messages()``) as a checkpoint.

        Messages already saved are recognised as the log's prefix and not stored again; a
        history that was shortened or edited starts a new log from the common prefix.

        A list that extends the one this history last loaded or saved adds its new messages
        after the current ones, including those another writer saved meanwhile (re-applied
        if one commits during the save); any other list replaces the conversation.
        """
        given = list(messages)
        base, session = self._base, self._latest()
        options: dict[str, Any] = {
            "message": message or f"pydantic-ai: {len(given)} messages",
            "label": label,
            "kind": kind,
            "meta": {"pydantic_ai": {"messages": len(given)}},
        }
        if base is not None and len(given) >= len(base) and given[: len(base)] == base:
            cp = session.checkpoint(
                append_messages=to_jsonable_python(given[len(base) :]), **options
            )
        else:
            data = to_jsonable_python(given)
            state = session.state()
            key = self.stash.conversation_key
            held = state.get(key) or []
            if len(data) >= len(held) and data[: len(held)] == held:
                cp = session.checkpoint(append_messages=data[len(held) :], **options)
            else:  # an edit: this list is the conversation now
                cp = session.checkpoint({**state, key: data}, **options)
        self._base = given
        return cp

    def run_sync(
        self, agent: AbstractAgent[Any, Any], prompt: str | None = None, **kwargs: Any
    ) -> AgentRunResult[Any]:
        """``agent.run_sync`` continuing this history, then :meth:`save`."""
        result = agent.run_sync(prompt, message_history=self.load(), **kwargs)
        self.save(result.all_messages(), message=_summary(prompt))
        return result

    async def run(
        self, agent: AbstractAgent[Any, Any], prompt: str | None = None, **kwargs: Any
    ) -> AgentRunResult[Any]:
        """``await agent.run`` continuing this history, then :meth:`save`."""
        history = await self._calls.call(self.load)  # the store's I/O off the event loop
        result = await agent.run(prompt, message_history=history, **kwargs)
        await self._calls.call(self.save, result.all_messages(), message=_summary(prompt))
        return result

    def fork(
        self, ref: str, branch: str | None = None, *, into: str | os.PathLike[str] | None = None
    ) -> MessageHistory:
        """A history on a new branch starting at checkpoint ``ref``; this one is unchanged.

        With a workspace, ``into`` (a new or empty directory) gives the fork its own copy of
        the files; without it the workspace directory switches to the new branch.
        """
        target = self._latest().get(ref)
        if into is not None:
            forked = self.stash.fork(target.id, branch, into=into)
        else:
            other = self.store.session(
                self.stash.name,
                workspace=self.stash.root,
                branch=self.stash.branch,
                **self._options,
            )
            forked = other.fork(target.id, branch)
        new = MessageHistory.__new__(MessageHistory)
        new.store, new._owns_store, new._options = self.store, False, self._options
        new.stash = forked
        new._base = None
        new._calls = SerialQueue()
        return new

    def _latest(self) -> Session:
        """The session, with a fresh engine object when another writer (a second history on
        this session, another process) moved the branch head: the engine caches its head, so
        a save would otherwise record a state that drops that writer's messages."""
        head = self.stash.head
        if self.store.head_id(self.stash.name, self.stash.branch) != (
            head.id if head is not None else None
        ):
            options = {**self._options, "lease": self.stash.lease}  # the same lease, if any
            self.stash = self.store.session(
                self.stash.name, workspace=self.stash.root, branch=self.stash.branch, **options
            )
        return self.stash

    def close(self) -> None:
        """Close the store if this history opened it."""
        if self._owns_store:
            self.store.close()

    def __repr__(self) -> str:
        return f"MessageHistory({self.stash.name!r}, branch={self.stash.branch!r})"


def _summary(prompt: str | None) -> str:
    text = " ".join((prompt or "").split())
    return f"pydantic-ai: {text[:70]}" if text else "pydantic-ai run"
