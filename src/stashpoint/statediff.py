"""What changed between two checkpoints, in a form people read: decoded state values and the
conversation as messages added, removed and edited, each with its role and text.

Why a module of its own: the CLI, the web UI and :meth:`Session.diff` show the same thing, and
the stored form is not readable as it is. A LangGraph thread keeps each channel and message as
LangGraph's serializer wrote it (base64 in the state), so a raw diff is a wall of base64;
:mod:`stashpoint.integrations.langgraph_values` decodes those, and :func:`render_message`
turns the message shapes of the frameworks stashpoint works with (chat dicts, LangChain
messages, OpenAI Agents items, Pydantic AI messages) into a role and a text.

Messages are paired the way a reader expects: the common prefix is unchanged; after it, a
message whose id is in both conversations is the same message (edited when its content
differs), and messages without ids are paired by position when their roles match.
"""

from __future__ import annotations

import dataclasses
import json
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
    "MessageView",
    "ValueChange",
    "jsonable",
    "render_message",
    "short_text",
    "text_lines",
    "to_json",
]

ChangeKind = Literal["added", "removed", "changed"]

MAX_TEXT = 300
"""Characters of a value or message shown in text and HTML before it is cut (with a count)."""


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
        """``role: text [→ call(args)]``, cut to ``limit`` characters of text."""
        parts = [short_text(self.text, limit)] if self.text or not self.tool_calls else []
        parts += [f"→ {short_text(c, limit)}" for c in self.tool_calls]
        return f"{self.role}: " + " ".join(parts)


@dataclass(frozen=True)
class MessageEdit:
    """The same message (same id, or same place and role) with other content."""

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

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.edited)


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
    from .integrations import langgraph_values as lgv

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
        tail_a = [decode(m) for m in ma[k:]]
        tail_b = [decode(m) for m in mb[k:]]
        out.messages_removed = len(ma) - k
        out.messages_added = tail_b
        out.conversation = conversation_diff(k, ma[k:], mb[k:], tail_a, tail_b)
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
    msgs_a: Sequence[Any],
    msgs_b: Sequence[Any],
) -> ConversationDiff:
    """Pair the messages after a common prefix of ``start``: by id where they have one, else
    by position among those without. ``stored_*`` compare contents (the stored form, cheap
    and exact); ``msgs_*`` are the decoded messages shown."""
    va = [_view(start + i, m) for i, m in enumerate(msgs_a)]
    vb = [_view(start + i, m) for i, m in enumerate(msgs_b)]
    out = ConversationDiff(common_prefix=start)
    by_id = {v.id: i for i, v in enumerate(vb) if v.id is not None}
    paired_b: set[int] = set()
    loose_a: list[int] = []
    for i, v in enumerate(va):
        j = by_id.get(v.id) if v.id is not None else None
        if j is None or j in paired_b:
            loose_a.append(i)
            continue
        paired_b.add(j)
        if stored_a[i] != stored_b[j]:
            out.edited.append(MessageEdit(v, vb[j]))
    loose_b = [j for j in range(len(vb)) if j not in paired_b]
    # without ids: the n-th loose message of each side are the same one when their roles
    # match (an edited turn); a message with an id pairs only by its id
    plain_a = [i for i in loose_a if va[i].id is None]
    plain_b = [j for j in loose_b if vb[j].id is None]
    for i, j in zip(plain_a, plain_b, strict=False):
        if va[i].role == vb[j].role:
            loose_a.remove(i)
            loose_b.remove(j)
            if stored_a[i] != stored_b[j]:
                out.edited.append(MessageEdit(va[i], vb[j]))
    out.removed = [va[i] for i in loose_a]
    out.added = [vb[j] for j in loose_b]
    return out


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
    """``text`` cut to ``limit`` characters, saying how many more there are."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (+{len(text) - limit:,} chars)"


def value_text(value: Any, limit: int = MAX_TEXT) -> str:
    """A value as one line a reader can follow: message lists as messages, other values as
    their Python repr (models as their fields); cut to ``limit`` characters."""
    if isinstance(value, list) and value and all(_is_message(m) for m in value):
        shown = [_view(i, m).summary(80) for i, m in enumerate(value[:5])]
        more = f" … (+{len(value) - 5} messages)" if len(value) > 5 else ""
        return short_text(f"[{len(value)} messages] " + " | ".join(shown), limit) + more
    return short_text(repr(_plain(value)), limit)


def _plain(value: Any, depth: int = 0) -> Any:
    """Models and messages inside ``value`` as their fields, so that its repr reads as data."""
    if depth > serde.MAX_DEPTH or isinstance(value, str | int | float | bool | None):
        return value
    if isinstance(value, Mapping):
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [_plain(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if _is_message(value):
        return _view(0, value).summary()
    tree = _as_mapping(value)
    return value if tree is None else _plain(dict(tree), depth + 1)


def _is_message(value: Any) -> bool:
    return render_message(value)[0] != "?"


def text_lines(d: CheckpointDiff, limit: int = MAX_TEXT) -> Iterable[tuple[str, str]]:
    """The state and conversation part of a diff as ``(style, line)``: style is ``head``,
    ``add``, ``del`` or ``""``. The CLI colours them; the web UI escapes them."""
    for c in d.state_changes:
        yield "head", f"state {c.key}: {c.kind}"
        if c.kind != "added":
            yield "del", f"- {value_text(c.before, limit)}"
        if c.kind != "removed":
            yield "add", f"+ {value_text(c.after, limit)}"
    conv = d.conversation
    if conv.changed:
        yield (
            "head",
            f"conversation: {len(conv.added)} added, {len(conv.removed)} removed, "
            f"{len(conv.edited)} edited ({conv.before_length} -> {conv.after_length} messages, "
            f"first {conv.common_prefix} unchanged)",
        )
        for m in conv.removed:
            yield "del", f"- [{m.index}] {m.summary(limit)}"
        for e in conv.edited:
            where = f"{e.before.index}" + (
                f"->{e.after.index}" if e.after.index != e.before.index else ""
            )
            yield "", f"~ [{where}] edited"
            yield "del", f"  - {e.before.summary(limit)}"
            yield "add", f"  + {e.after.summary(limit)}"
        for m in conv.added:
            yield "add", f"+ [{m.index}] {m.summary(limit)}"


def _message_json(m: MessageView) -> dict[str, Any]:
    return {
        "index": m.index,
        "role": m.role,
        "text": m.text,
        "id": m.id,
        "tool_calls": list(m.tool_calls),
    }


def to_json(d: CheckpointDiff) -> dict[str, Any]:
    """A diff as JSON data (``stashpoint diff --json``): values and messages decoded, texts
    whole; the older keys (``values``, ``messages_removed``, ``messages_added``) kept."""
    import os

    values = [
        {"key": c.key, "status": c.kind, "old": jsonable(c.before), "new": jsonable(c.after)}
        for c in d.state_changes
    ]
    conv = d.conversation
    return {
        "a": d.a.id,
        "b": d.b.id,
        "values": values,
        "state_changes": [
            {"key": c.key, "kind": c.kind, "before": v["old"], "after": v["new"]}
            for c, v in zip(d.state_changes, values, strict=True)
        ],
        "conversation": {
            "common_prefix": conv.common_prefix,
            "before_length": conv.before_length,
            "after_length": conv.after_length,
            "added": [_message_json(m) for m in conv.added],
            "removed": [_message_json(m) for m in conv.removed],
            "edited": [
                {"before": _message_json(e.before), "after": _message_json(e.after)}
                for e in conv.edited
            ],
        },
        "messages_removed": d.messages_removed,
        "messages_added": jsonable(d.messages_added),
        "files": [{"path": os.fsdecode(c.path), "status": c.status} for c in d.files],
    }
