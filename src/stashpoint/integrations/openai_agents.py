"""OpenAI Agents SDK: a ``Session`` whose conversation lives in a stashpoint store.

    from agents import Agent, Runner
    from stashpoint.integrations.openai_agents import StashpointSession

    session = StashpointSession("support-42", ".stashpoint", workspace="repo/")
    await Runner.run(agent, "hello", session=session)
    retry = session.fork(1, "retry", into="repo-retry/")   # as it was after turn 1
    await Runner.run(agent, "something else", session=retry)

Why: the SDK's own sessions keep one mutable list per session id, so ``pop_item`` and
``clear_session`` destroy history and there is no way back to an earlier turn. Here the items
are the stashpoint conversation of a stashpoint session (the ``messages`` state key, stored as
an append-only log): every ``add_items`` is a checkpoint in a verified hash chain (with the
workspace files at that moment, when the session has a workspace), ``pop_item`` and
``clear_session`` record the shorter conversation as a new checkpoint and keep the old ones,
and any turn can be forked into an independent session. A run paused for tool approval is
kept in the checkpoint too (:meth:`StashpointSession.save_run_state`), so any process can
resume it from the store alone. Under the SDK's ``OpenAIResponsesCompactionSession``, a
compaction replaces the history in one checkpoint.

Needs ``pip install 'stashpoint[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import MissingExtraError

try:
    from agents import Agent, RunResult, RunResultStreaming, RunState
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.memory.session import _CompactionSnapshot
    from agents.memory.session_settings import resolve_session_limit
except ImportError as exc:
    raise MissingExtraError(
        "stashpoint.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'stashpoint[openai-agents]'"
    ) from exc

from .. import serde
from .._store import Store
from ..aio import SerialQueue
from ..errors import ConflictError, LeaseHeld, LeaseLost, UsageError
from ..integrity import EMPTY_CHAIN, message_chain
from ..model import Checkpoint
from ..opening import open_store
from ..session import Session

__all__ = ["RUN_STATE_KEY", "StashpointSession", "Turn"]

_T = TypeVar("_T")

RUN_STATE_KEY = "openai_agents.run_state"
"""State key of the run saved by :meth:`StashpointSession.save_run_state`."""

_RETRIES = 50

_Write = tuple[dict[str, Any], str, dict[str, Any]]
"""A whole state to commit, the checkpoint message and its ``openai_agents`` meta."""


@dataclass(frozen=True)
class Turn:
    """One user input and everything the agent produced for it: items ``[start, end)``."""

    number: int
    """1 for the first user input."""
    text: str
    """The user's input, as text."""
    start: int
    end: int


class StashpointSession:
    """An Agents SDK session (the ``agents.memory.Session`` protocol) backed by stashpoint.

    Args:
        session_id: the stashpoint session name (also the SDK's ``session_id``).
        store: a :class:`stashpoint.Store`, or a URL/path to open (default ``./.stashpoint``);
            a store opened here is closed by :meth:`close`.
        branch: branch to continue (default: ``main``, or the one the workspace follows).
        workspace: a directory snapshotted with every checkpoint, so rewinding or forking a
            turn also gives back the files the agent's tools had written by then.
        session_settings: the SDK's settings (``limit`` for :meth:`get_items`).
        **options: passed to :class:`stashpoint.Session` (``config``, ``packages``, ...).

    The async protocol methods run the store's blocking I/O in a worker thread, one call at
    a time in the order they were made (see :class:`stashpoint.aio.SerialQueue`). ``fork``,
    ``turns`` and ``close`` are synchronous: they are called between runs.

    Several writers on one session id (two session objects, tasks, threads or processes)
    lose nothing: each :meth:`add_items` is appended after whatever the others have added
    by then, as one checkpoint, so every item is kept and each writer's items stay in its
    own order (interleaved with the others' between calls, as with the SDK's
    ``SQLiteSession``).

    One :meth:`add_items` call adds all its items or none of them. Cancelling it (a
    timeout, a cancelled run) does not stop a write already under way: the call still
    raises ``CancelledError``, but only once the write has finished, so by then all its
    items are stored (none, if it was cancelled before it began). ``pop_item`` and
    ``clear_session`` behave the same way, and apply to the conversation as it is when they
    are committed (with another writer's items, if any arrived meanwhile).
    """

    def __init__(
        self,
        session_id: str,
        store: Store | str | os.PathLike[str] | None = None,
        *,
        branch: str | None = None,
        workspace: str | os.PathLike[str] | None = None,
        session_settings: SessionSettings | None = None,
        **options: Any,
    ) -> None:
        if isinstance(store, Store):
            self.store, self._owns_store = store, False
        else:
            self.store, self._owns_store = open_store(store), True
        self.session_id = session_id
        self.session_settings = session_settings
        self._options = options
        self.stash: Session = self.store.session(
            session_id, workspace=workspace, branch=branch, **options
        )
        """The stashpoint session behind it: ``history()``, ``diff()``, ``rewind()``, labels."""
        self._mutex = threading.Lock()
        self._calls = SerialQueue()
        self._cache: tuple[str | None, dict[str, Any]] | None = None

    @classmethod
    def _wrap(cls, parent: StashpointSession, stash: Session) -> StashpointSession:
        new = cls.__new__(cls)
        new.store, new._owns_store = parent.store, False
        new.session_id = parent.session_id
        new.session_settings = parent.session_settings
        new._options = parent._options
        new.stash = stash
        new._mutex = threading.Lock()
        new._calls = SerialQueue()
        new._cache = None
        return new

    # -- the SDK's session protocol --------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation (the latest ``limit`` items, in order)."""
        limit = resolve_session_limit(limit, self.session_settings)
        items = await self._call(self._items)
        if limit is not None and limit >= 0:
            items = items[-limit:] if limit else []
        return copy.deepcopy(items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items and record a checkpoint (and a workspace snapshot, if any)."""
        if not items:
            return
        new = copy.deepcopy(list(items))
        await _settled(self._call(lambda: self._append(new)))

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the last item; the checkpoints that had it stay in the history."""
        popped: list[Any] = []

        def pop(state: dict[str, Any]) -> _Write | None:
            items = list(state.get(self.stash.conversation_key) or [])
            popped[:] = items[-1:]
            if not items:
                return None
            return self._with_items(state, items[:-1], f"pop_item: {_describe(items[-1])}")

        await _settled(self._call(lambda: self._rewrite(pop, "edit")))
        return copy.deepcopy(popped[0]) if popped else None

    async def clear_session(self) -> None:
        """Start over with an empty conversation; the earlier checkpoints stay."""

        def clear(state: dict[str, Any]) -> _Write | None:
            if not state.get(self.stash.conversation_key):
                return None
            return self._with_items(state, [], "clear_session")

        await _settled(self._call(lambda: self._rewrite(clear, "edit")))

    # -- a run paused for approval ---------------------------------------------------------
    async def save_run_state(
        self,
        run: RunState[Any, Any] | RunResult | RunResultStreaming,
        **to_json: Any,
    ) -> Checkpoint:
        """Keep a run paused for approval (``result.interruptions``) in this session, so that
        any process can resume it from the store alone (:meth:`load_run_state`).

        ``run`` is the result (or ``result.to_state()``); ``to_json`` goes to the SDK's
        ``RunState.to_json`` (``context_serializer``, ...). The state is recorded in a
        checkpoint (kind ``paused``) together with the conversation it belongs to, and stays
        resumable until one process claims it with :meth:`load_run_state` or the conversation
        moves on; rewinding or forking to that checkpoint brings it back. A run that is not
        paused (no interruptions) is refused: resuming it would call the model again.
        """
        state = run if isinstance(run, RunState) else run.to_state()
        interruptions = state.get_interruptions()
        if not interruptions:
            raise UsageError(
                "this run is not paused (it has no interruptions): there is nothing to resume"
            )
        data = state.to_json(**to_json)
        waiting = sorted({str(i.tool_name or "tool") for i in interruptions})

        def save(current: dict[str, Any]) -> _Write:
            saved = {"conversation": list(_conversation_id(self.stash.head)), "state": data}
            message = "run paused" + (f": awaiting {', '.join(waiting)}" if waiting else "")
            return {**current, RUN_STATE_KEY: saved}, message, {"awaiting": waiting}

        cp = await _settled(self._call(lambda: self._rewrite(save, "paused")))
        assert cp is not None  # save always writes
        return cp

    async def load_run_state(
        self, agent: Agent[Any], *, claim: bool = True, **from_json: Any
    ) -> RunState[Any, Agent[Any]] | None:
        """The run :meth:`save_run_state` kept with the current conversation, ready to approve
        and pass to ``Runner.run(agent, state, session=self)``; None when there is none, when
        the conversation has moved on since, or when another process claimed it first.

        Loading claims the run (``claim=False`` only looks): one checkpoint removes it from
        the session's state, committed only on the head it was read from, so of two
        processes resuming the same paused run at once exactly one gets it and the approved
        tool runs once. A process that dies after claiming it leaves it in the ``paused``
        checkpoint: rewind (or fork) there to resume it again.

        ``agent`` is the run's starting agent; ``from_json`` goes to ``RunState.from_json``
        (``context_override``, ...). A saved run this agent cannot resume raises UsageError
        and is not claimed."""

        def read() -> Any:
            head, state = self._read()
            saved = state.get(RUN_STATE_KEY)
            if not isinstance(saved, dict) or saved.get("conversation") != list(
                _conversation_id(head)
            ):
                return None
            return copy.deepcopy(saved)

        saved = await self._call(read)
        if saved is None:
            return None
        try:
            state = await RunState.from_json(agent, saved["state"], **from_json)
        except Exception as exc:  # the SDK's UserError, a missing agent or tool, ...
            raise UsageError(
                f"the run paused in session {self.session_id!r} cannot be resumed with agent "
                f"{getattr(agent, 'name', agent)!r}: {exc}"
            ) from exc
        if not claim:
            return state

        def take(current: dict[str, Any]) -> _Write | None:
            moved = saved["conversation"] != list(_conversation_id(self.stash.head))
            if moved or current.get(RUN_STATE_KEY) != saved:
                return None  # claimed by another process, or the conversation moved on
            rest = {k: v for k, v in current.items() if k != RUN_STATE_KEY}
            return rest, f"run resumed (process {os.getpid()})", {"resumed": True}

        cp = await _settled(self._call(lambda: self._rewrite(take, "approval")))
        return state if cp is not None else None

    # -- the SDK's compaction hooks --------------------------------------------------------
    async def _get_compaction_snapshot(
        self,
        limit: int,
        *,
        prune_prefix: Callable[[TResponseInputItem], bool] | None = None,
    ) -> _CompactionSnapshot | None:
        """The latest ``limit`` items, for the SDK's ``OpenAIResponsesCompactionSession``:
        its ``replace_suffix`` swaps the items it summarised for the summary in one
        checkpoint, and only while the conversation is still the one read here (another
        writer's items are never summarised away nor overwritten; it returns False instead).
        Without this hook the SDK replaces the history as a clear and an add.

        A subclass that transforms items in ``get_items`` / ``add_items`` gets None (the SDK
        then uses those methods), as the SDK's own stores do: this would bypass them."""
        if type(self) is not StashpointSession:
            return None

        def read() -> tuple[tuple[int, str | None], list[Any]]:
            head, state = self._read()
            return _conversation_id(head), list(state.get(self.stash.conversation_key) or [])

        seen, items = await self._call(read)
        window = items[-limit:] if limit > 0 else []
        offset = len(items) - len(window)

        async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
            if not 0 <= start < len(window):
                return False
            summary = copy.deepcopy(list(output))

            def replace(state: dict[str, Any]) -> _Write | None:
                if _conversation_id(self.stash.head) != seen:
                    return None
                kept = items[: offset + start]
                if prune_prefix is not None:
                    while kept and prune_prefix(kept[0]):
                        kept.pop(0)
                message = f"compaction: {len(items) - len(kept)} items -> {len(summary)}"
                return self._with_items(state, [*kept, *summary], message)

            cp = await _settled(self._call(lambda: self._rewrite(replace, "edit")))
            return cp is not None

        return _CompactionSnapshot(copy.deepcopy(window), offset == 0, replace_suffix)

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """The whole conversation replaced by ``items`` in one checkpoint (the SDK's manual
        compaction; without this hook it clears the session, then adds the items). False,
        for the SDK to use those two instead, in a subclass (see the snapshot above)."""
        if type(self) is not StashpointSession:
            return False
        new = copy.deepcopy(list(items))

        def replace(state: dict[str, Any]) -> _Write:
            return self._with_items(state, new, f"replaced by {len(new)} items")

        await _settled(self._call(lambda: self._rewrite(replace, "edit")))
        return True

    # -- branching -------------------------------------------------------------------------
    def turns(self) -> list[Turn]:
        """The conversation's turns, each starting at a user input."""
        with self._mutex:
            return _turns(self._items())

    def fork(
        self,
        at: int | str,
        branch: str | None = None,
        *,
        into: str | os.PathLike[str] | None = None,
    ) -> StashpointSession:
        """A new session on a new branch, starting from turn ``at`` (an ``int``: the
        conversation as it was after that turn, ``0`` for empty) or from a checkpoint (a
        ``str``: id, label or ``HEAD~N``). This session keeps its branch and items.

        With a workspace, the fork starts from the files as they were at that point: pass
        ``into`` (a new or empty directory) to give the fork its own copy; without it the
        workspace directory itself switches to the new branch, like ``git checkout``.
        A turn is forked from the checkpoint that ended it; if the items were added in chunks
        that do not end there, from the latest checkpoint, then truncated.
        """
        with self._mutex:
            keep: list[Any] | None = None
            if isinstance(at, int):
                ref, keep = self._turn_checkpoint(at)
            else:
                ref = self.stash.get(at).id
            if into is not None:
                forked = self.stash.fork(ref, branch, into=into)
            else:
                forked = self._fresh().fork(ref, branch)
        new = StashpointSession._wrap(self, forked)
        if keep is not None:
            truncated = keep
            with new._mutex:
                new._rewrite(
                    lambda st: new._with_items(st, truncated, f"fork at turn {at}"), "edit"
                )
        return new

    def _turn_checkpoint(self, n: int) -> tuple[str, list[Any] | None]:
        """(checkpoint to fork from, items to truncate to, or None if it ends turn ``n``)."""
        items = self._items()
        turns = _turns(items)
        if not 0 <= n <= len(turns):
            raise UsageError(f"no turn {n}: this conversation has {len(turns)} turn(s)")
        end = turns[n - 1].end if n else 0
        chain = EMPTY_CHAIN
        for item in items[:end]:
            chain = message_chain(chain, serde.encode(item))
        head = self.stash.head
        if head is None:
            raise UsageError("nothing to fork: this session has no checkpoint yet")
        cp: Checkpoint | None = head
        while cp is not None and end:
            conv = cp.state.conversation
            if conv is not None and conv.length == end and conv.hash == chain:
                return cp.id, None
            cp = self.store.get(cp.parent) if cp.parent else None
        return head.id, items[:end]

    # -- internals -------------------------------------------------------------------------
    async def _call(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` off the loop, after the calls made before it on this session (the queue
        keeps their order) and apart from the sync methods' (the mutex)."""

        def locked() -> _T:
            with self._mutex:
                return fn()

        return await self._calls.call(locked)

    def _state(self) -> dict[str, Any]:
        """The head's state, decoded once per head; re-read if another writer moved it."""
        head_id = self.store.head_id(self.stash.name, self.stash.branch)
        if self._cache is not None and self._cache[0] == head_id:
            return self._cache[1]
        known = self.stash.head
        if (known.id if known is not None else None) != head_id:
            self.stash = self._fresh()  # someone else committed: a fresh view of the branch
        state = self.stash.state()
        self._cache = (head_id, state)
        return state

    def _fresh(self) -> Session:
        """Another engine object on the same branch (its own head cache and branch pointer)."""
        return self.store.session(
            self.stash.name, workspace=self.stash.root, branch=self.stash.branch, **self._options
        )

    def _items(self) -> list[Any]:
        return list(self._state().get(self.stash.conversation_key) or [])

    def _append(self, new: list[Any]) -> None:
        """One checkpoint adding ``new`` after the items the branch head holds when it is
        committed (the engine re-applies the append on top of another writer's checkpoint),
        not after the items this object last saw: concurrent writers lose nothing."""
        cached = self._cache
        key = self.stash.conversation_key
        cp = self.stash.checkpoint(
            append_messages=new,
            kind="auto",
            message=f"agents +{len(new)}: " + ", ".join(map(_describe, new)),
            meta={"openai_agents": {"added": len(new)}},
        )
        if cached is not None and cp.parent == cached[0]:  # nobody else wrote in between
            self._cache = (cp.id, {**cached[1], key: [*(cached[1].get(key) or []), *new]})
        else:
            self._cache = None

    def _read(self) -> tuple[Checkpoint | None, dict[str, Any]]:
        """The branch head and its state, read together."""
        for _ in range(_RETRIES):
            state = self._state()
            head = self.stash.head
            if self._cache is not None and self._cache[0] == (head.id if head else None):
                return head, state
            self._cache = None  # the head moved while it was read: again
        raise ConflictError(f"session {self.stash.name!r} is being written by others too fast")

    def _rewrite(
        self, change: Callable[[dict[str, Any]], _Write | None], kind: str
    ) -> Checkpoint | None:
        """One checkpoint of the state ``change`` derives from the head's (None: nothing to
        record), committed on that head only: when another writer moves it first, ``change``
        runs again on theirs, so what they added is never overwritten by a stale copy."""
        for attempt in range(_RETRIES):
            head, state = self._read()
            write = change(state)
            if write is None:
                return None
            new, message, meta = write
            try:
                cp = self.stash.checkpoint(
                    new,
                    kind=kind,
                    message=f"agents {message}",
                    meta={"openai_agents": meta},
                    expect_head=head.id if head else "",
                )
            except (LeaseHeld, LeaseLost):
                raise
            except ConflictError:
                self._cache = None
                if attempt:
                    time.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))
                continue
            self._cache = (cp.id, new)
            return cp
        raise ConflictError(f"session {self.stash.name!r} is being written by others too fast")

    def _with_items(self, state: dict[str, Any], items: list[Any], message: str) -> _Write:
        return {**state, self.stash.conversation_key: items}, message, {"items": len(items)}

    def close(self) -> None:
        """Close the store if this session opened it."""
        if self._owns_store:
            self.store.close()

    def __repr__(self) -> str:
        return f"StashpointSession({self.session_id!r}, branch={self.stash.branch!r})"


async def _settled(call: Awaitable[_T]) -> _T:
    """``await call``, but a cancellation waits for the write to finish before it is raised:
    a write handed to a worker thread cannot be stopped half way, and a caller told
    "cancelled" must not see its items appear later (nor a next call overtake them)."""
    task = asyncio.ensure_future(call)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation is what the caller hears about
        raise cancelled
    return task.result()


def _conversation_id(head: Checkpoint | None) -> tuple[int, str | None]:
    """The head's conversation as (length, chain hash): equal ids, equal items."""
    conv = head.state.conversation if head is not None else None
    return (conv.length, conv.hash) if conv is not None else (0, None)


def _text(item: Any) -> str:
    content = item.get("content") if isinstance(item, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text")) for part in content if isinstance(part, dict) and "text" in part
        )
    return ""


def _turns(items: list[Any]) -> list[Turn]:
    starts = [
        i for i, item in enumerate(items) if isinstance(item, dict) and item.get("role") == "user"
    ]
    ends = [*starts[1:], len(items)]
    return [
        Turn(number=k + 1, text=_text(items[s]), start=s, end=e)
        for k, (s, e) in enumerate(zip(starts, ends, strict=True))
    ]


def _describe(item: Any) -> str:
    if not isinstance(item, dict):
        return type(item).__name__
    what = str(item.get("role") or item.get("type") or "item")
    if item.get("name"):
        what += f" {item['name']}"
    text = " ".join(_text(item).split())
    return f"{what}: {text[:60]}" if text else what
