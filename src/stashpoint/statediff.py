"""What changed between two checkpoints, in a form people read: decoded state values and the
conversation as messages added, removed and edited, each with its role and text.

Why a module of its own: the CLI, the web UI and :meth:`Session.diff` show the same thing, and
the stored form is not readable as it is. A LangGraph thread keeps each channel and message as
LangGraph's serializer wrote it (base64 in the state), so a raw diff is a wall of base64;
:mod:`stashpoint.langgraph_values` decodes those, and :func:`render_message`
turns the message shapes of the frameworks stashpoint works with (chat dicts, LangChain
messages, OpenAI Agents items, Pydantic AI messages) into a role and a text.

Messages are paired the way a reader expects: the common prefix and suffix are unchanged;
between them, messages stored alike are aligned as a sequence (``difflib``, anchored on
messages found once on each side), so a message dropped from the front of a window is one
removal, and one found elsewhere is reported as moved. A message whose id is on both sides is
the same message (edited when its content differs); others pair by place in a changed block
when their roles match. Only the messages in changed blocks are decoded and rendered.

Every text rendered here is one line, cut to a limit, with control characters escaped
(:func:`printable`): stored text comes from tools and models, and must not drive a terminal or
forge other lines of a diff.
"""

from __future__ import annotations

import bisect
import dataclasses
import difflib
import itertools
import json
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from . import serde
from .errors import SerializationError

if TYPE_CHECKING:
    from .model import Checkpoint
    from .session import Session
    from .workspace.tree import Change

__all__ = [
    "CheckpointDiff",
    "ConversationDiff",
    "MessageEdit",
    "MessageMove",
    "MessageView",
    "ValueChange",
    "jsonable",
    "printable",
    "render_message",
    "short_text",
    "text_lines",
    "to_json",
]

ChangeKind = Literal["added", "removed", "changed"]

MAX_TEXT = 300
"""Characters of a value or message shown in text and HTML before it is cut (with a count)."""

MAX_JSON_TEXT = 10_000
"""Characters of one string in ``--json`` output before it is cut (unless ``--full``)."""

MAX_JSON_ITEMS = 1_000
"""Items of one list in ``--json`` output before it is cut (unless ``--full``)."""

MAX_CALLS = 5
"""Tool calls of one message shown in its one-line summary."""

_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` safe to print as one line: C0 and C1 control characters (escape sequences,
    newlines, carriage returns), DEL, Unicode line separators and bidirectional overrides
    and lone surrogates are written as escapes (``\\x1b``, ``\\n``, ``\\u202e``). Stored text
    comes from models and tools; printed raw it could move the cursor, set the terminal's
    title or clipboard, hide text, or print lines that look like the diff's own."""
    return _UNPRINTABLE.sub(_escape, text)


@dataclass(frozen=True)
class ValueChange:
    """One state value (a LangGraph channel) that differs."""

    key: str
    kind: ChangeKind
    before: Any
    """Decoded value in the first checkpoint (None when added)."""
    after: Any
    """Decoded value in the second checkpoint (None when removed)."""


@dataclass(frozen=True)
class MessageView:
    """A message as a reader sees it, whatever framework made it."""

    index: int
    """Its position in its conversation."""
    role: str
    """``user``, ``assistant``, ``system``, ``tool``, ``tool call``, ``tool result``..."""
    text: str
    """Its text content (full; displays cut it)."""
    id: str | None = None
    tool_calls: tuple[str, ...] = ()
    """Tool calls it makes, each ``name(arguments)``."""

    def summary(self, limit: int = MAX_TEXT) -> str:
        """``role: text [→ call(args)]`` as one printable line: the text and each call cut to
        ``limit`` characters, at most :data:`MAX_CALLS` calls."""
        parts = [short_text(self.text, limit)] if self.text or not self.tool_calls else []
        parts += [f"→ {short_text(c, limit)}" for c in self.tool_calls[:MAX_CALLS]]
        if len(self.tool_calls) > MAX_CALLS:
            parts.append(f"(+{len(self.tool_calls) - MAX_CALLS} calls)")
        return f"{short_text(self.role, 80)}: " + " ".join(parts)


@dataclass(frozen=True)
class MessageEdit:
    """The same message (same id, or same place and role) with other content."""

    before: MessageView
    after: MessageView


@dataclass(frozen=True)
class MessageMove:
    """The same message, unchanged, at another place relative to the others."""

    before: MessageView
    after: MessageView


@dataclass
class ConversationDiff:
    """How the conversation changed: unchanged up to ``common_prefix``, then these."""

    common_prefix: int = 0
    added: list[MessageView] = field(default_factory=list)
    removed: list[MessageView] = field(default_factory=list)
    edited: list[MessageEdit] = field(default_factory=list)
    before_length: int = 0
    after_length: int = 0
    moved: list[MessageMove] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.edited or self.moved)


@dataclass
class CheckpointDiff:
    """What changed from checkpoint ``a`` to checkpoint ``b``.

    ``state_changes`` and ``conversation`` are the readable view; ``values``,
    ``messages_removed`` and ``messages_added`` are the older fields, kept for callers that
    use them (their values decoded the same way).
    """

    a: Checkpoint
    b: Checkpoint
    values: list[tuple[str, str, Any, Any]] = field(default_factory=list)
    """(key, added|removed|changed, old, new)"""
    messages_removed: int = 0
    """Messages of ``a`` after the common prefix."""
    messages_added: list[Any] = field(default_factory=list)
    """Messages of ``b`` after the common prefix, decoded."""
    files: list[Change] = field(default_factory=list)
    state_changes: list[ValueChange] = field(default_factory=list)
    conversation: ConversationDiff = field(default_factory=ConversationDiff)


# -- computing ---------------------------------------------------------------------------------


def compare(session: Session, ca: Checkpoint, cb: Checkpoint) -> CheckpointDiff:
    """The diff :meth:`Session.diff` returns (both checkpoints already checked)."""
    from . import langgraph_values as lgv

    out = CheckpointDiff(ca, cb)
    blobs = session.store.blobs
    langgraph = lgv.is_langgraph(ca) or lgv.is_langgraph(cb)
    if langgraph:
        refs_a, refs_b = lgv.channel_refs(ca, blobs), lgv.channel_refs(cb, blobs)

        def load(ref: str) -> Any:
            return lgv.load_ref(ref, blobs)

    else:
        refs_a, refs_b = dict(ca.state.values), dict(cb.state.values)

        def load(ref: str) -> Any:
            return serde.decode(blobs.read(bytes.fromhex(ref)))

    for key in sorted(refs_a.keys() | refs_b.keys()):
        ra, rb = refs_a.get(key), refs_b.get(key)
        if ra == rb:
            continue
        old = load(ra) if ra is not None else None
        new = load(rb) if rb is not None else None
        kind: ChangeKind = "added" if ra is None else "removed" if rb is None else "changed"
        if kind == "changed" and old == new:  # the same value stored again (another encoding)
            continue
        out.state_changes.append(ValueChange(key, kind, old, new))
    out.values = [(c.key, c.kind, c.before, c.after) for c in out.state_changes]

    conv_a, conv_b = ca.state.conversation, cb.state.conversation
    if conv_a != conv_b:
        ma = session._load_messages(conv_a) if conv_a else []
        mb = session._load_messages(conv_b) if conv_b else []
        decode: Callable[[Any], Any] = lgv.decode_text if langgraph else _same
        k = 0
        while k < min(len(ma), len(mb)) and ma[k] == mb[k]:
            k += 1
        out.messages_removed = len(ma) - k
        out.messages_added = [decode(m) for m in mb[k:]] if langgraph else mb[k:]
        out.conversation = conversation_diff(k, ma[k:], mb[k:], decode=decode)
        out.conversation.before_length, out.conversation.after_length = len(ma), len(mb)

    ta = bytes.fromhex(ca.workspace.tree) if ca.workspace else None
    tb = bytes.fromhex(cb.workspace.tree) if cb.workspace else None
    from .workspace.tree import TreeReader

    out.files = list(TreeReader(blobs).diff(ta, tb))
    return out


def _same(value: Any) -> Any:
    return value


def conversation_diff(
    start: int,
    stored_a: Sequence[Any],
    stored_b: Sequence[Any],
    msgs_a: Sequence[Any] | None = None,
    msgs_b: Sequence[Any] | None = None,
    *,
    decode: Callable[[Any], Any] = _same,
) -> ConversationDiff:
    """Pair the messages after a common prefix of ``start``. ``stored_*`` compare contents
    (the stored form, cheap and exact); the messages shown are ``msgs_*`` when given, else
    ``decode`` of the stored ones, computed only for messages that changed.

    The unchanged suffix is set aside; the rest is aligned on the stored forms: messages
    found exactly once on each side anchor the alignment (the longest run of them in the
    same order stays, the others moved), and :class:`difflib.SequenceMatcher` aligns what lies
    between anchors. Then removed and added messages with the same id are one message
    (edited, or moved when its content is the same), and in a changed block an id-less
    removed and added message of the same role are one message edited."""
    n_a, n_b = len(stored_a), len(stored_b)
    suffix = 0
    while suffix < min(n_a, n_b) and stored_a[n_a - 1 - suffix] == stored_b[n_b - 1 - suffix]:
        suffix += 1
    ka = [_fingerprint(m) for m in stored_a[: n_a - suffix]]
    kb = [_fingerprint(m) for m in stored_b[: n_b - suffix]]
    views: dict[tuple[int, int], MessageView] = {}

    def view(side: int, i: int) -> MessageView:
        got = views.get((side, i))
        if got is None:
            shown = msgs_a if side == 0 else msgs_b
            stored = stored_a if side == 0 else stored_b
            got = _view(start + i, shown[i] if shown is not None else decode(stored[i]))
            views[(side, i)] = got
        return got

    out = ConversationDiff(common_prefix=start)
    # anchors: fingerprints found once on each side; the longest increasing run stays
    count_a: dict[Any, int] = {}
    for key in ka:
        count_a[key] = count_a.get(key, 0) + 1
    count_b: dict[Any, int] = {}
    for key in kb:
        count_b[key] = count_b.get(key, 0) + 1
    where_b = {key: j for j, key in enumerate(kb) if count_b[key] == 1}
    pairs = [(i, where_b[key]) for i, key in enumerate(ka) if count_a[key] == 1 and key in where_b]
    kept = _increasing_run(pairs)
    kept_set = set(kept)
    moved_a = {i for i, j in pairs if (i, j) not in kept_set}
    moved_b = {j for i, j in pairs if (i, j) not in kept_set}
    out.moved = [MessageMove(view(0, i), view(1, j)) for i, j in pairs if (i, j) not in kept_set]
    # between anchors: a sequence alignment of what is left
    removed: list[int] = []
    added: list[int] = []
    blocks: list[tuple[list[int], list[int]]] = []  # replaced: (removed, added)
    bounds = [(-1, -1), *kept, (len(ka), len(kb))]
    for (a0, b0), (a1, b1) in itertools.pairwise(bounds):
        ga = [i for i in range(a0 + 1, a1) if i not in moved_a]
        gb = [j for j in range(b0 + 1, b1) if j not in moved_b]
        if not ga or not gb:
            removed += ga
            added += gb
            continue
        if len(ga) * len(gb) > _MAX_ALIGN:  # too big to align: one changed block
            blocks.append((ga, gb))
            continue
        matcher = difflib.SequenceMatcher(
            None, [ka[i] for i in ga], [kb[j] for j in gb], autojunk=False
        )
        for tag, i0, i1, j0, j1 in matcher.get_opcodes():
            if tag == "equal":
                continue
            blocks.append((ga[i0:i1], gb[j0:j1]))
    # the same id on both sides: one message (edited, or moved when stored alike)
    loose_a = sorted(removed + [i for ra, _ in blocks for i in ra])
    loose_b = sorted(added + [j for _, rb in blocks for j in rb])
    by_id: dict[str, int] = {}
    for j in loose_b:
        ident = view(1, j).id
        if ident is not None:
            by_id.setdefault(ident, j)
    paired_a: set[int] = set()
    paired_b: set[int] = set()
    for i in loose_a:
        ident = view(0, i).id
        match = by_id.get(ident) if ident is not None else None
        if match is None or match in paired_b:
            continue
        paired_a.add(i)
        paired_b.add(match)
        if stored_a[i] != stored_b[match]:
            out.edited.append(MessageEdit(view(0, i), view(1, match)))
        else:
            out.moved.append(MessageMove(view(0, i), view(1, match)))
    # in a changed block, id-less messages of the same role in turn: one message edited
    for ra, rb in blocks:
        plain_a = [i for i in ra if i not in paired_a and view(0, i).id is None]
        plain_b = [j for j in rb if j not in paired_b and view(1, j).id is None]
        for i, j in zip(plain_a, plain_b, strict=False):
            if view(0, i).role == view(1, j).role:
                paired_a.add(i)
                paired_b.add(j)
                if stored_a[i] != stored_b[j]:
                    out.edited.append(MessageEdit(view(0, i), view(1, j)))
    out.removed = [view(0, i) for i in loose_a if i not in paired_a]
    out.added = [view(1, j) for j in loose_b if j not in paired_b]
    out.edited.sort(key=lambda e: e.before.index)
    out.moved.sort(key=lambda m: m.before.index)
    return out


_MAX_ALIGN = 4_000_000
"""Largest (removed x added) block aligned by :class:`difflib.SequenceMatcher` (quadratic in
the worst case); a bigger one is shown as one changed block."""


def _fingerprint(stored: Any) -> Any:
    """A hashable stand-in for a stored message: equal messages get equal ones."""
    if isinstance(stored, str | bytes | int | float | bool | None):
        return (type(stored).__name__, stored)
    try:
        return ("enc", serde.encode(stored))
    except SerializationError:
        return ("repr", repr(stored))


def _increasing_run(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest run of ``pairs`` (sorted by their first item) whose second items rise:
    the anchors that kept their order (patience sorting, n log n)."""
    tails: list[int] = []  # second item ending the best run of each length
    tail_at: list[int] = []  # index in pairs of that end
    back: list[int] = []
    for n, (_, j) in enumerate(pairs):
        k = bisect.bisect_left(tails, j)
        if k == len(tails):
            tails.append(j)
            tail_at.append(n)
        else:
            tails[k] = j
            tail_at[k] = n
        back.append(tail_at[k - 1] if k else -1)
    run: list[tuple[int, int]] = []
    n = tail_at[-1] if tail_at else -1
    while n >= 0:
        run.append(pairs[n])
        n = back[n]
    return run[::-1]


# -- rendering messages ------------------------------------------------------------------------

_ROLES = {"human": "user", "ai": "assistant", "AIMessageChunk": "assistant", "developer": "system"}


def _view(index: int, message: Any) -> MessageView:
    role, text, ident, calls = render_message(message)
    return MessageView(index, role, text, ident, calls)


def render_message(message: Any) -> tuple[str, str, str | None, tuple[str, ...]]:
    """``(role, text, id, tool calls)`` of one message: a chat dict, a LangChain message, an
    OpenAI Agents item, a Pydantic AI message (object or its JSON form); anything else
    becomes a short JSON text with role ``?``."""
    if isinstance(message, str):
        return "?", message, None, ()
    tree = _as_mapping(message)
    if tree is None:
        return "?", _dumps(message), None, ()
    ident = tree.get("id")
    ident = str(ident) if isinstance(ident, str | int) and ident != "" else None
    if "parts" in tree and tree.get("kind") in ("request", "response"):  # Pydantic AI
        return _pydantic_ai(tree, ident)
    kind = tree.get("type")
    if kind == "function_call":  # OpenAI Agents / Responses items
        call = f"{tree.get('name', '?')}({_args(tree.get('arguments'))})"
        return "tool call", "", ident or _opt(tree.get("call_id")), (call,)
    if kind == "function_call_output":
        return "tool result", _content(tree.get("output")), ident or _opt(tree.get("call_id")), ()
    if kind == "reasoning":
        return "reasoning", _content(tree.get("summary") or tree.get("content")), ident, ()
    data = tree.get("data")
    if isinstance(data, Mapping) and isinstance(kind, str) and "content" in data:
        tree, ident = {**data, "type": kind}, _opt(data.get("id"))  # messages_to_dict form
    role = tree.get("role") or tree.get("type")
    if not isinstance(role, str) or ("content" not in tree and "tool_calls" not in tree):
        return "?", _dumps(message), ident, ()
    role = _ROLES.get(role, role)
    if role == "tool" and tree.get("name"):
        role = f"tool {tree['name']}"
    calls = tuple(_tool_call(c) for c in tree.get("tool_calls") or () if isinstance(c, Mapping))
    return role, _content(tree.get("content")), ident, calls


def _pydantic_ai(tree: Mapping[str, Any], ident: str | None) -> tuple[str, str, str | None, Any]:
    texts: list[str] = []
    calls: list[str] = []
    role = "assistant" if tree.get("kind") == "response" else "user"
    kinds = set()
    for part in tree.get("parts") or ():
        if not isinstance(part, Mapping):
            continue
        pk = part.get("part_kind")
        kinds.add(pk)
        if pk == "tool-call":
            calls.append(f"{part.get('tool_name', '?')}({_args(part.get('args'))})")
        elif pk in ("tool-return", "retry-prompt") and part.get("tool_name"):
            texts.append(f"[{part['tool_name']}] {_content(part.get('content'))}")
        elif pk == "system-prompt":
            texts.append(f"[system] {_content(part.get('content'))}")
        elif "content" in part:
            texts.append(_content(part.get("content")))
    if role == "user" and kinds and kinds <= {"tool-return", "retry-prompt"}:
        role = "tool result"
    return role, "\n".join(t for t in texts if t), ident, tuple(calls)


def _as_mapping(message: Any) -> Mapping[str, Any] | None:
    if isinstance(message, Mapping):
        return message
    dump = getattr(message, "model_dump", None)  # LangChain messages, pydantic models
    if callable(dump):
        try:
            got = dump(mode="json")
        except Exception:  # a model that cannot dump itself: shown as text
            return None
        return got if isinstance(got, Mapping) else None
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        try:  # Pydantic AI's messages are dataclasses
            from pydantic_core import to_jsonable_python

            got = to_jsonable_python(message)
        except Exception:  # pydantic not there, or a value it cannot carry
            got = dataclasses.asdict(message)
        return got if isinstance(got, Mapping) else None
    return None


def _content(content: Any) -> str:
    """Text of a content field: a string, or a list of parts (text parts joined, others
    named by type)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        content = [content]
    if isinstance(content, list | tuple):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, Mapping):
                text = part.get("text", part.get("content"))
                if isinstance(text, str):
                    out.append(text)
                else:
                    out.append(f"[{part.get('type', 'part')}]")
            else:
                out.append(_dumps(part))
        return "\n".join(out)
    return _dumps(content)


def _tool_call(call: Mapping[str, Any]) -> str:
    fn = call.get("function")
    if isinstance(fn, Mapping):  # OpenAI chat format
        return f"{fn.get('name', '?')}({_args(fn.get('arguments'))})"
    return f"{call.get('name', '?')}({_args(call.get('args', call.get('arguments')))})"


def _args(args: Any) -> str:
    if isinstance(args, str):
        return args
    return _dumps(args) if args is not None else ""


def _opt(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def readable_state(s: Session, cp: Checkpoint) -> tuple[list[Any] | None, dict[str, Any]]:
    """(conversation, other state values) as a reader wants them. A LangGraph record keeps
    each channel and message as the saver packed them (base64): they are decoded the way
    ``Session.diff`` decodes them, and the saver's bookkeeping values are left out."""
    state = s.state(cp)
    messages = state.pop(s.conversation_key, None)
    from . import langgraph_values as lgv

    if not lgv.is_langgraph(cp):
        return (messages if isinstance(messages, list) else None), state
    blobs = s.store.blobs
    values = {k: lgv.load_ref(ref, blobs) for k, ref in lgv.channel_refs(cp, blobs).items()}
    if isinstance(messages, list):
        messages = [lgv.decode_text(m) for m in messages]
    return (messages if isinstance(messages, list) else None), values


# -- values as text and JSON -------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """``value`` as JSON data: stashpoint's encoding when it can carry it, else a model's or
    dataclass's JSON form, else its text."""
    try:
        return serde.to_tree(value)
    except SerializationError:
        pass
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    tree = _as_mapping(value)
    if tree is not None:
        return jsonable(dict(tree))
    return repr(value)


def _dumps(value: Any) -> str:
    try:
        return json.dumps(jsonable(value), ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        return repr(value)


def short_text(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters, saying how many more there are, as one printable
    line (:func:`printable`)."""
    if len(text) <= limit:
        return printable(text)
    return f"{printable(text[:limit])}… (+{len(text) - limit:,} chars)"


def value_text(value: Any, limit: int = MAX_TEXT) -> str:
    """A value as one line a reader can follow: message lists as messages, other values as
    their Python repr (models as their fields); cut to ``limit`` characters. The repr is
    built cut (:mod:`reprlib`), so a huge value costs no more than a small one."""
    if isinstance(value, list) and value and all(_is_message(m) for m in value[:5]):
        shown = [_view(i, m).summary(80) for i, m in enumerate(value[:5])]
        more = f" … (+{len(value) - 5} messages)" if len(value) > 5 else ""
        return short_text(f"[{len(value)} messages] " + " | ".join(shown), limit) + more
    text = _ValueRepr(limit).repr(value)
    return short_text(text, limit)


class _ValueRepr(reprlib.Repr):
    """A cut repr: long strings and bytes cut before they are repr'd, long containers
    cut to their first items; models and messages shown as their fields."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.maxlevel = 8
        self.maxstring = self.maxother = self.maxlong = limit + 3
        self.maxdict = self.maxlist = self.maxtuple = 50
        self.maxset = self.maxfrozenset = self.maxdeque = self.maxarray = 50

    def repr1(self, x: Any, level: int) -> str:
        if not isinstance(x, str | bytes | int | float | list | tuple | dict | set | frozenset):
            if _is_message(x):
                return repr(_view(0, x).summary())
            tree = _as_mapping(x)
            if tree is not None:
                return self.repr1(dict(tree), level)
        return super().repr1(x, level)

    def repr_str(self, x: str, level: int) -> str:
        cut = len(x) > self.maxstring
        return repr(x[: self.maxstring]) + ("…" if cut else "")

    def repr_bytes(self, x: bytes, level: int) -> str:
        cut = len(x) > self.maxstring
        return repr(x[: self.maxstring]) + ("…" if cut else "")


def _is_message(value: Any) -> bool:
    return render_message(value)[0] != "?"


def text_lines(
    d: CheckpointDiff, limit: int = MAX_TEXT, max_items: int | None = None
) -> Iterable[tuple[str, str]]:
    """The state and conversation part of a diff as ``(style, line)``: style is ``head``,
    ``add``, ``del`` or ``""``. The CLI colours them; the web UI escapes them. Each line is
    one printable line (:func:`printable`) of at most about ``limit`` characters per value;
    ``max_items`` caps the messages listed per kind of change (None: all), with a line
    saying how many more there are."""

    def capped(items: Sequence[Any]) -> Sequence[Any]:
        return items if max_items is None else items[:max_items]

    def more(items: Sequence[Any], what: str) -> Iterable[tuple[str, str]]:
        if max_items is not None and len(items) > max_items:
            yield "", f"… {len(items) - max_items:,} more {what}"

    for c in d.state_changes:
        yield "head", f"state {short_text(c.key, limit)}: {c.kind}"
        if c.kind != "added":
            yield "del", f"- {value_text(c.before, limit)}"
        if c.kind != "removed":
            yield "add", f"+ {value_text(c.after, limit)}"
    conv = d.conversation
    if conv.changed:
        yield (
            "head",
            f"conversation: {len(conv.added)} added, {len(conv.removed)} removed, "
            f"{len(conv.edited)} edited"
            + (f", {len(conv.moved)} moved" if conv.moved else "")
            + f" ({conv.before_length} -> {conv.after_length} messages, "
            f"first {conv.common_prefix} unchanged)",
        )
        for m in capped(conv.removed):
            yield "del", f"- [{m.index}] {m.summary(limit)}"
        yield from more(conv.removed, "removed")
        for e in capped(conv.edited):
            where = f"{e.before.index}" + (
                f"->{e.after.index}" if e.after.index != e.before.index else ""
            )
            yield "", f"~ [{where}] edited"
            yield "del", f"  - {e.before.summary(limit)}"
            yield "add", f"  + {e.after.summary(limit)}"
        yield from more(conv.edited, "edited")
        for mv in capped(conv.moved):
            yield "", f"> [{mv.before.index}->{mv.after.index}] moved: {mv.after.summary(limit)}"
        yield from more(conv.moved, "moved")
        for m in capped(conv.added):
            yield "add", f"+ [{m.index}] {m.summary(limit)}"
        yield from more(conv.added, "added")


def _message_json(m: MessageView) -> dict[str, Any]:
    return {
        "index": m.index,
        "role": m.role,
        "text": m.text,
        "id": m.id,
        "tool_calls": list(m.tool_calls),
    }


def to_json(d: CheckpointDiff, *, full: bool = False) -> dict[str, Any]:
    """A diff as JSON data (``stashpoint diff --json``): values and messages decoded, each
    value converted once (``state_changes``, and the older ``values``). Unless ``full``, a
    string longer than :data:`MAX_JSON_TEXT` characters or a list longer than
    :data:`MAX_JSON_ITEMS` is cut, ends with a ``… (+N chars)`` / ``… (+N items)`` marker,
    and ``truncated`` is true."""
    import os

    cut = [False]

    def cap(tree: Any, depth: int = 0) -> Any:
        if full:
            return tree
        if isinstance(tree, str):
            if len(tree) > MAX_JSON_TEXT:
                cut[0] = True
                return f"{tree[:MAX_JSON_TEXT]}… (+{len(tree) - MAX_JSON_TEXT:,} chars)"
            return tree
        if isinstance(tree, list):
            items = [cap(v, depth + 1) for v in tree[:MAX_JSON_ITEMS]]
            if len(tree) > MAX_JSON_ITEMS:
                cut[0] = True
                items.append(f"… (+{len(tree) - MAX_JSON_ITEMS:,} items)")
            return items
        if isinstance(tree, dict):
            return {k: cap(v, depth + 1) for k, v in tree.items()}
        return tree

    def value(v: Any) -> Any:
        if not full and isinstance(v, bytes) and len(v) > MAX_JSON_TEXT:
            # cut before it is encoded (base64 of a 20 MB value), marked like a list
            cut[0] = True
            return [jsonable(v[:MAX_JSON_TEXT]), f"… (+{len(v) - MAX_JSON_TEXT:,} bytes)"]
        return cap(jsonable(v))

    def seq(items: Sequence[Any], make: Callable[[Any], Any]) -> list[Any]:
        """A list cut before its items are converted (a conversation of 100k messages)."""
        if full or len(items) <= MAX_JSON_ITEMS:
            return [cap(make(v)) for v in items]
        cut[0] = True
        shown: list[Any] = [cap(make(v)) for v in items[:MAX_JSON_ITEMS]]
        return [*shown, f"… (+{len(items) - MAX_JSON_ITEMS:,} items)"]

    def pair(e: MessageEdit | MessageMove) -> dict[str, Any]:
        return {"before": _message_json(e.before), "after": _message_json(e.after)}

    conv = d.conversation
    trees = [(c, value(c.before), value(c.after)) for c in d.state_changes]
    out = {
        "a": d.a.id,
        "b": d.b.id,
        # the older key, kept for scripts that read it; the values are cut as below
        "values": [
            {"key": c.key, "status": c.kind, "old": old, "new": new} for c, old, new in trees
        ],
        "state_changes": [
            {"key": c.key, "kind": c.kind, "before": old, "after": new} for c, old, new in trees
        ],
        "conversation": {
            "common_prefix": conv.common_prefix,
            "before_length": conv.before_length,
            "after_length": conv.after_length,
            "added": seq(conv.added, _message_json),
            "removed": seq(conv.removed, _message_json),
            "edited": seq(conv.edited, pair),
            "moved": seq(conv.moved, pair),
        },
        "messages_removed": d.messages_removed,
        "messages_added": seq(d.messages_added, jsonable),
        "files": seq(d.files, lambda c: {"path": os.fsdecode(c.path), "status": c.status}),
    }
    out["truncated"] = cut[0]
    return out
