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
and any turn can be forked into an independent session.

Needs ``pip install 'stashpoint[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import MissingExtraError

try:
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
    from agents.memory.session_settings import resolve_session_limit
except ImportError as exc:
    raise MissingExtraError(
        "stashpoint.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'stashpoint[openai-agents]'"
    ) from exc

from .. import serde
from .._store import Store, open_store
from ..errors import UsageError
from ..integrity import EMPTY_CHAIN, message_chain
from ..model import Checkpoint
from ..session import Session

__all__ = ["StashpointSession", "Turn"]

_T = TypeVar("_T")


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

    The async protocol methods run the store's blocking I/O in a worker thread. ``fork``,
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
    ``clear_session`` behave the same way.
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

        def pop() -> Any:
            items = self._items()
            if not items:
                return None
            self._record(items[:-1], "edit", f"pop_item: {_describe(items[-1])}")
            return items[-1]

        popped: TResponseInputItem | None = copy.deepcopy(await _settled(self._call(pop)))
        return popped

    async def clear_session(self) -> None:
        """Start over with an empty conversation; the earlier checkpoints stay."""

        def clear() -> None:
            if self._items():
                self._record([], "edit", "clear_session")

        await _settled(self._call(clear))

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
            with new._mutex:
                new._record(keep, "edit", f"fork at turn {at}")
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
        def locked() -> _T:
            with self._mutex:
                return fn()

        return await asyncio.to_thread(locked)

    def _state(self) -> dict[str, Any]:
        """The head's state, decoded once per head; re-read if another writer moved it."""
        head_id = self.store.meta.get_head(self.stash.name, self.stash.branch)
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

    def _record(self, items: list[Any], kind: str, message: str) -> None:
        state = {**self._state(), self.stash.conversation_key: items}
        cp = self.stash.checkpoint(
            state,
            kind=kind,
            message=f"agents {message}",
            meta={"openai_agents": {"items": len(items)}},
        )
        self._cache = (cp.id, state)

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
