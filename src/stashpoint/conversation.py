"""The conversation as last checkpointed, kept by a session to find the prefix of a new
checkpoint's messages that is stored already (so a checkpoint encodes only what is new), and
where the new ones go: the parent's log, or a new log forked where the two part.

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
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress
from typing import TYPE_CHECKING, Any, NamedTuple

from . import serde
from ._ids import new_id
from .errors import IntegrityError
from .integrity import EMPTY_CHAIN, message_chain, message_links
from .model import ConversationRef
from .stores.base import LogAppend, LogInfo

if TYPE_CHECKING:
    from .model import Checkpoint
    from .session import Session

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


class Known(NamedTuple):
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


# -- where a checkpoint's messages go ------------------------------------------------------


def _conversation_for(
    self: Session, head: Checkpoint | None, state: Mapping[str, Any] | None
) -> tuple[ConversationRef | None, LogAppend | None]:
    """Where the conversation goes: extend the parent's log, or branch a new one."""
    parent = head.state.conversation if head else None
    if state is None:
        return parent, None
    msgs = state.get(self.conversation_key)
    if msgs is None:
        return None, None
    n = parent.length if parent else 0
    prefix = self._common_prefix(head, parent, msgs)
    if parent is not None and prefix == n == len(msgs):
        return parent, None
    if parent is not None and prefix == n:
        log, start, chain, new_log = self._log_end(parent)
    else:
        # Diverged (edited or truncated history): a new log continuing the common prefix.
        log, start = new_id(), prefix
        if parent is not None and prefix > 0:
            chain = self._message_rows(parent.log, prefix)[-1][0].hex()
            new_log = LogInfo(self.name, parent.log, prefix, prefix)
        else:
            chain, start = EMPTY_CHAIN, 0
            new_log = LogInfo(self.name, None, 0, 0)
    encoded = [serde.encode(m) for m in msgs[start:]]
    return _chained(log, start, chain, new_log, encoded)


def _conversation_appended(
    self: Session, head: Checkpoint | None, added: list[bytes]
) -> tuple[ConversationRef | None, LogAppend | None]:
    """The head's conversation followed by the ``added`` (encoded) messages."""
    parent = head.state.conversation if head else None
    if not added:
        return parent, None
    return _chained(*self._log_end(parent), added)


def _log_end(self: Session, parent: ConversationRef | None) -> tuple[str, int, str, LogInfo | None]:
    """Where messages after ``parent`` go: (log, start, chain, new log's info or None).
    The parent's own log when its tip is where ``parent`` ends, else a new log forked
    there (another branch wrote past it); a new root log without a parent."""
    if parent is None:
        return new_id(), 0, EMPTY_CHAIN, LogInfo(self.name, None, 0, 0)
    log, start = parent.log, parent.length
    tip = self._log_tips.get(log)
    if tip is None:
        info = self.store.meta.log_info(log)
        tip = info.length if info else -1
    if tip == start:
        return log, start, parent.hash, None
    return new_id(), start, parent.hash, LogInfo(self.name, log, start, start)


def _common_prefix(
    self: Session, head: Checkpoint | None, parent: ConversationRef | None, msgs: list[Any]
) -> int:
    """How many leading messages equal the parent's conversation.

    Compared by content with copies of the messages as they were checkpointed (decoded
    from the bytes written), not with the objects given then: a message changed in place
    since (``msgs[-1]["content"] = "edited"``) is the same object, but no longer the same
    message. The comparison is one ``list ==`` in C (dicts, lists and strings compare
    there without calling back into Python), far below encoding the conversation again
    but not free: ~430 CPU instructions a message (a dict of two strings; the identity
    test it replaced took ~25), ~0.86 M at 2,000 messages, more than the rest of a
    checkpoint (~0.65 M). Messages of an immutable type (the
    LangGraph saver's encoded strings) are kept as the objects given: one identity test.
    A copy that compares unequal although the message encodes the same bytes (a ``nan``
    inside) is not taken for a change.
    """
    if parent is None or head is None:
        return 0
    known = self._conv_objs
    if known is None or len(known.objs) != parent.length:
        known = self._load_conversation(parent)
        self._conv_objs = known
    objs, n = known.objs, min(len(known.objs), len(msgs))
    red = self._redacting
    if red is not None and red[2] is msgs and self._redacted[1] is objs and 0 < red[1] <= n:
        # The redactor's output: its first k messages are these very copies (it compared
        # the caller's messages with theirs by content), so only the rest is compared.
        k = red[1]
        i = k + same_prefix(msgs[k:], objs[k:])
    else:
        i = same_prefix(msgs, objs)
    while i < n and serde.encode(msgs[i]) == known.data[i]:  # equal after all
        i += 1 + same_prefix(msgs[i + 1 : n], objs[i + 1 : n])
    return i


def _chained(
    log: str, start: int, chain: str, new_log: LogInfo | None, encoded: list[bytes]
) -> tuple[ConversationRef, LogAppend]:
    """The conversation ref and the append (fenced by the commit that carries it) of
    ``encoded`` messages written to ``log`` from ``start``, each chained to the last."""
    rows, last = message_links(chain, encoded)
    return ConversationRef(log, start + len(encoded), last), LogAppend(log, start, rows, new_log)


class KnownConversation:
    """The methods above, as :class:`~stashpoint.Session` has them."""

    _load_conversation = _load_conversation
    _known_written = _known_written
    _known_appended = _known_appended
    _conversation_for = _conversation_for
    _conversation_appended = _conversation_appended
    _log_end = _log_end
    _common_prefix = _common_prefix
