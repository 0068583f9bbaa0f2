"""The conversation as last checkpointed, kept by a session to find the prefix of a new
checkpoint's messages that is stored already (so a checkpoint encodes only what is new).

The messages are kept as copies independent of the caller's objects (decoded from the bytes
written, or plain copies sharing immutable leaves): a message changed in place after it was
checkpointed is then seen as changed. The conversation itself is read back verified, every
message against the log's hash chain.

The session methods here are joined into :class:`~stashpoint.Session` by
:class:`KnownConversation`.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import TYPE_CHECKING, Any

from . import serde
from .errors import IntegrityError
from .integrity import EMPTY_CHAIN, message_chain

if TYPE_CHECKING:
    from .model import Checkpoint, ConversationRef
    from .session import Session
    from .stores.base import LogAppend

__all__ = [
    "Known",
    "KnownConversation",
    "copied",
    "fields_of",
    "plain_copy",
    "same_prefix",
    "snapshot",
]

_IMMUTABLE = frozenset((str, bytes, int, float, bool, type(None)))
_is_leaf = _IMMUTABLE.__contains__
_data = operator.itemgetter(1)  # of a log row: (chain, data)


@dataclass
class Known:
    """The conversation as last checkpointed, independent of the caller's objects: what a
    new checkpoint's messages are compared against to find the prefix already stored.

    ``objs`` holds copies decoded from the bytes written (a message of an immutable type is
    kept as it is, so that the comparison stays one identity test); ``data`` holds those
    bytes, the arbiter when a message and its copy compare unequal although it encodes the
    same (a ``nan`` inside)."""

    objs: list[Any]
    data: list[bytes]


def _written(msgs: Sequence[Any], data: Sequence[bytes]) -> list[Any]:
    """Copies of ``msgs`` as written (``data``: their encodings), independent of the objects:
    new dicts, lists and tuples around the same immutable leaves (so that comparing a message
    with its copy mostly compares pointers), or the message decoded from its bytes when it
    holds anything else (a registered dataclass, a pydantic model)."""
    try:
        return list(map(plain_copy, msgs))  # in C, the usual case
    except TypeError:
        pass
    out = []
    for m, d in zip(msgs, data, strict=True):
        try:
            out.append(plain_copy(m))
        except TypeError:
            out.append(serde.decode(d))
    return out


def plain_copy(value: Any) -> Any:
    """A copy of the dicts, lists and tuples of ``value`` sharing its immutable leaves
    (strings, numbers, bytes, None); TypeError for anything else inside."""
    t = type(value)
    if t is dict:
        if all(map(_is_leaf, map(type, value.values()))):  # the usual message: one C copy
            return value.copy()
        return {k: v if type(v) in _IMMUTABLE else plain_copy(v) for k, v in value.items()}
    if t is list:
        if all(map(_is_leaf, map(type, value))):
            return value.copy()
        return [v if type(v) in _IMMUTABLE else plain_copy(v) for v in value]
    if t is tuple:
        if all(map(_is_leaf, map(type, value))):
            return value  # immutable all the way down: itself
        return tuple([v if type(v) in _IMMUTABLE else plain_copy(v) for v in value])
    if t in _IMMUTABLE:
        return value
    raise TypeError(t.__name__)


_FIELDS = operator.attrgetter("__dict__")


def fields_of(msgs: Iterable[Any]) -> list[Any]:
    """What messages are compared by: an object's fields (its ``__dict__``: a LangChain
    message's content, ids, tool calls, metadata), else the message itself (a dict)."""
    msgs = msgs if isinstance(msgs, list) else list(msgs)
    try:
        return list(map(_FIELDS, msgs))  # in C
    except AttributeError:
        return [getattr(m, "__dict__", m) for m in msgs]


_NO_DICT: dict[Any, Any] = {}
_NO_LIST: list[Any] = []
"""The empty containers of every copy :func:`snapshot` takes: copies are only compared,
never changed nor handed out, so one empty dict and one empty list serve them all."""


def snapshot(fields: Any) -> Any:
    """A copy of a message's fields (:func:`fields_of`), independent of the message, to
    compare it with later: it shares the immutable leaves and the empty containers.

    A LangChain message's fields are mostly strings and None, with empty dicts and lists
    (``additional_kwargs``, ``tool_calls``): the dict is copied in C, then only its other
    fields (found in C) are copied again, the empty ones not at all (they become the shared
    ``_NO_DICT`` and ``_NO_LIST``). A put compares every message with its copy: one dict each,
    not one dict and 2-4 empty containers, is ~40 % less time comparing."""
    try:
        if type(fields) is not dict:
            return plain_copy(fields)
        out = fields.copy()
        for k in compress(fields, map(operator.not_, map(_is_leaf, map(type, fields.values())))):
            v = fields[k]
            t = type(v)
            if not v and (t is dict or t is list):
                out[k] = _NO_DICT if t is dict else _NO_LIST
            else:
                out[k] = plain_copy(v)
        return out
    except TypeError:
        return copied(fields)


def copied(value: Any) -> Any:
    """A deep copy, or (not copyable) a stand-in equal to nothing."""
    try:
        return copy.deepcopy(value)
    except Exception:  # then the value is scanned again next time
        return object()


def same_prefix(msgs: list[Any], known: list[Any]) -> int:
    """How many leading items of ``msgs`` equal those of ``known``: one comparison in C for
    the usual case (all of them), then item by item from the first difference."""
    n = min(len(known), len(msgs))
    if (msgs[:n] == known) if n == len(known) else (msgs == known[:n]):  # one slice
        return n
    for i in range(n):
        a, b = known[i], msgs[i]
        if a is not b and a != b:
            return i
    return n  # pragma: no cover - the slice comparison above said they differ


def _load_conversation(self: Session, conv: ConversationRef) -> Known:
    rows = self._message_rows(conv.log, conv.length)
    chain = EMPTY_CHAIN
    msgs = []
    for stored_chain, data in rows:
        chain = message_chain(chain, data)
        if bytes.fromhex(chain) != stored_chain:
            raise IntegrityError(f"conversation log {conv.log} is corrupt")
        msgs.append(serde.decode(data))
    if chain != conv.hash:
        raise IntegrityError(
            f"conversation of length {conv.length} in log {conv.log} does not match its hash"
        )
    return Known(msgs, [data for _chain, data in rows])


def _known_written(self: Session, msgs: Any, append: LogAppend | None) -> None:
    """After a checkpoint of the conversation ``msgs`` (``append``: what it wrote)."""
    redacting, self._redacting = self._redacting, None
    if not isinstance(msgs, list):
        self._conv_objs = None
        return
    known = self._conv_objs  # what _common_prefix compared against (all of it if unchanged)
    start = append.start if append is not None else len(msgs)
    data = list(map(_data, append.messages)) if append is not None else []
    if known is None or len(known.objs) < start:
        if start:  # (the head had no conversation to compare against: nothing kept)
            self._conv_objs = None
            return
        known = Known([], [])
    new = _written(msgs[start:], data)
    if len(known.objs) == start:  # appended: extend the lists (no copy of the prefix)
        known.objs.extend(new)
        known.data.extend(data)
    else:
        known = Known(known.objs[:start] + new, known.data[:start] + data)
    self._conv_objs = known
    if redacting is not None and redacting[2] is msgs:
        given, k, red = redacting  # given: the messages from k on
        snaps = known.objs
        # A message the redactor left as it was has the copy just written as its copy.
        more = [snaps[i] if red[i] is m else copied(m) for i, m in enumerate(given, start=k)]
        old = self._redacted[0]
        if len(old) == k:
            old.extend(more)
        else:
            old = old[:k] + more
        self._redacted = (old, snaps)


def _known_appended(
    self: Session, head: Checkpoint | None, msgs: list[Any], data: list[bytes]
) -> None:
    known = self._conv_objs
    n = head.state.conversation.length if head and head.state.conversation else 0
    if n == 0:
        known = Known([], [])
    if known is None or len(known.objs) != n:
        self._conv_objs = None
        return
    known.objs.extend(_written(msgs, data))
    known.data.extend(data)
    self._conv_objs = known


class KnownConversation:
    """The methods above, as :class:`~stashpoint.Session` has them."""

    _load_conversation = _load_conversation
    _known_written = _known_written
    _known_appended = _known_appended
