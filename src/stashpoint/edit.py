"""Operator corrections to a checkpoint's state: ``--set PATH=VALUE`` and JSON Patch.

The path and patch functions are pure, over plain data: they never touch the store, so a
bad edit fails before anything is written. :class:`Editing` joins the session's side into
:class:`~stashpoint.Session`: validators, and the edit saved as a new child checkpoint.

Paths are JSON Pointers (RFC 6901: ``/plan/steps/0``) or, for typing convenience, dotted
paths (``plan.steps.0``). In both, a list index is ``0`` or ASCII digits
without a leading zero (RFC 6901), and ``-`` is the end of the list where an item is added.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ._ids import check_name as _check_name
from ._runs import UNREAD as _INHERIT
from .errors import (
    NotFoundError,
    UsageError,
    ValidationError,
)
from .model import Checkpoint, utc_now_iso

if TYPE_CHECKING:
    from .session import Session

F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "Editing",
    "ValidationError",
    "apply_patch",
    "parse_assignment",
    "set_path",
    "split_path",
]


def split_path(path: str) -> list[str]:
    if path.startswith("/"):
        return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]
    if not path or path == ".":
        return []
    return path.split(".")


def parse_assignment(text: str) -> tuple[list[str], Any]:
    """``PATH=VALUE``; VALUE is JSON when it parses as JSON, else a plain string."""
    path, sep, raw = text.partition("=")
    if not sep or not path:
        raise UsageError(f"--set wants PATH=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return split_path(path), value


def _child(container: Any, key: str, path: Sequence[str]) -> Any:
    if isinstance(container, Mapping):
        if key not in container:
            raise UsageError(f"{_show(path)}: no key {key!r}")
        return container[key]
    if isinstance(container, list):
        return container[_index(container, key, path, allow_end=False)]
    raise UsageError(f"{_show(path)}: cannot descend into a {type(container).__name__}")


def _index(items: list[Any], key: str, path: Sequence[str], *, allow_end: bool) -> int:
    if allow_end and key == "-":
        return len(items)
    # RFC 6901: "0" or ASCII digits without a leading zero (str.isdigit also accepts "²")
    if not (key.isascii() and key.isdigit()) or (len(key) > 1 and key[0] == "0"):
        raise UsageError(f"{_show(path)}: {key!r} is not a list index")
    i = int(key)
    if i > len(items) or (i == len(items) and not allow_end):
        raise UsageError(f"{_show(path)}: index {i} is out of range (length {len(items)})")
    return i


def _show(path: Sequence[str]) -> str:
    return "/" + "/".join(path)


def _parent(doc: Any, path: Sequence[str]) -> Any:
    if not path:
        raise UsageError("the whole state cannot be the target of this operation")
    target = doc
    for i, key in enumerate(path[:-1]):
        target = _child(target, key, path[: i + 1])
    return target


def set_path(doc: dict[str, Any], path: Sequence[str], value: Any, *, create: bool = True) -> None:
    """Replace (or add, for a new key / list end ``-``) the value at ``path``, in place."""
    parent = _parent(doc, path)
    key = path[-1]
    if isinstance(parent, dict):
        if not create and key not in parent:
            raise UsageError(f"{_show(path)}: no key {key!r} to replace")
        parent[key] = value
    elif isinstance(parent, list):
        i = _index(parent, key, path, allow_end=create)
        if i == len(parent):
            parent.append(value)
        else:
            parent[i] = value
    else:
        raise UsageError(f"{_show(path)}: cannot set inside a {type(parent).__name__}")


def _remove(doc: dict[str, Any], path: Sequence[str]) -> Any:
    parent = _parent(doc, path)
    key = path[-1]
    if isinstance(parent, dict):
        if key not in parent:
            raise UsageError(f"{_show(path)}: no key {key!r} to remove")
        return parent.pop(key)
    if isinstance(parent, list):
        return parent.pop(_index(parent, key, path, allow_end=False))
    raise UsageError(f"{_show(path)}: cannot remove from a {type(parent).__name__}")


def _add(doc: dict[str, Any], path: Sequence[str], value: Any) -> None:
    parent = _parent(doc, path)
    if isinstance(parent, list):
        parent.insert(_index(parent, path[-1], path, allow_end=True), value)
    else:
        set_path(doc, path, value)


def _get(doc: Any, path: Sequence[str]) -> Any:
    target = doc
    for i, key in enumerate(path):
        target = _child(target, key, path[: i + 1])
    return target


def apply_patch(doc: dict[str, Any], patch: Any) -> dict[str, Any]:
    """A new document with the RFC 6902 operations applied, all or nothing."""
    if not isinstance(patch, list):
        raise UsageError("a JSON Patch is a JSON array of operations")
    out = copy.deepcopy(doc)
    for n, op in enumerate(patch):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise UsageError(f"patch operation #{n} needs 'op' and 'path'")
        kind, path = op["op"], split_path(str(op["path"]))
        if kind in ("add", "replace", "test") and "value" not in op:
            raise UsageError(f"patch operation #{n} ({kind}) needs 'value'")
        if kind == "add":
            _add(out, path, op["value"])
        elif kind == "replace":
            set_path(out, path, op["value"], create=False)
        elif kind == "remove":
            _remove(out, path)
        elif kind in ("move", "copy"):
            source = split_path(str(op.get("from", "")))
            value = _remove(out, source) if kind == "move" else copy.deepcopy(_get(out, source))
            _add(out, path, value)
        elif kind == "test":
            if _get(out, path) != op["value"]:
                raise UsageError(f"patch test failed at {_show(path)}")
        else:
            raise UsageError(f"patch operation #{n}: unknown op {kind!r}")
    return out


# -- a session's edits -------------------------------------------------------------------
def validator(self: Session, fn: F) -> F:
    """Decorator: register a state validator for :meth:`edit`."""
    self.validators.append(fn)
    return fn


def validate(self: Session, state: dict[str, Any]) -> None:
    """Run every validator; ValidationError naming the first that refuses."""

    for check in self.validators:
        name = getattr(check, "__qualname__", repr(check))
        try:
            verdict = check(state)
        except Exception as exc:
            raise ValidationError(f"validator {name} refused the state: {exc}") from exc
        if verdict is False or (isinstance(verdict, str) and verdict):
            why = verdict if isinstance(verdict, str) else "it returned False"
            raise ValidationError(f"validator {name} refused the state: {why}")


def edit(
    self: Session,
    ref: str | Checkpoint | None = None,
    *,
    assign: Mapping[str, Any] | None = None,
    patch: list[dict[str, Any]] | None = None,
    state: Mapping[str, Any] | None = None,
    reason: str | None = None,
    by: str | None = None,
    branch: str | None = None,
) -> Checkpoint:
    """Correct a checkpoint's state and save it as a new child checkpoint (kind ``edit``,
    with who, when and why); the original stays as it was.

    ``assign`` maps paths (``plan.budget`` or ``/plan/budget``) to new values (the CLI's
    ``--set``), ``patch`` is a
    JSON Patch, ``state`` replaces the state whole. Validators run first: a refused edit
    saves nothing. Editing the head continues the branch (a durable run resumes from the
    edit); editing an older checkpoint needs ``branch``, a new branch starting at the edit.
    """
    from .durable import _user

    target = self._as_checkpoint(ref)
    if target is None:
        raise NotFoundError(f"branch {self.branch!r} of session {self.name!r} is empty")
    head = self.head
    if branch is None and (head is None or head.id != target.id):
        raise UsageError(
            f"{target.id} is not the head of branch {self.branch!r}: to edit an older "
            "checkpoint, name a new branch for the edit (branch=… / --branch NAME)"
        )
    new = dict(state) if state is not None else self.state(target)
    changes: list[str] = []
    for path, value in (assign or {}).items():
        set_path(new, split_path(path), value)
        changes.append(f"set {path}")
    if patch is not None:
        new = apply_patch(new, patch)
        changes += [f"{op.get('op')} {op.get('path')}" for op in patch]
    if state is not None:
        changes.append("replaced the state")
    self.validate(new)
    meta: dict[str, dict[str, Any]] = {
        "edit": {
            "of": target.id,
            "by": by or _user(),
            "reason": reason,
            "changes": changes,
            "at": utc_now_iso(),
        }
    }
    message = "edited: " + (reason or "; ".join(changes) or "no change")
    from .durable import Journal

    def withdraw(on: Session, command: Mapping[str, Any] | None = None) -> None:
        # Approved arguments must come from the edited state: unanswered requests are
        # withdrawn, and each call asks again with the arguments it then has.
        withdrawn = Journal(on).cancel_pending(f"superseded by an edit: {message}", command=command)
        on._run_record = _INHERIT  # the edit checkpoint records the journal with them
        if withdrawn:
            meta["edit"]["withdrew"] = withdrawn[0].to_dict()
        if len(withdrawn) > 1:
            meta["edit"]["withdrew_all"] = [p.to_dict() for p in withdrawn]

    if branch is None:
        withdraw(self)
        return self.checkpoint(new, kind="edit", message=message, meta=meta, files=False)
    _check_name("branch", branch)
    if branch in self.branches():
        raise UsageError(f"branch {branch!r} already exists in session {self.name!r}")
    command = Journal(self).last_command  # a resume on the new branch runs the same program
    self.store.start_branch(self.name, branch, target.id, fence=self.fence)
    other = type(self)(
        self.store,
        self.name,
        branch=branch,
        schema_version=self.schema_version,
        conversation_key=self.conversation_key,
    )
    other.config_hash = self.config_hash
    withdraw(other, command)
    return other.checkpoint(new, kind="edit", message=message, meta=meta, files=False)


class Editing:
    """The methods above, as :class:`~stashpoint.Session` has them."""

    validator = validator
    validate = validate
    edit = edit
