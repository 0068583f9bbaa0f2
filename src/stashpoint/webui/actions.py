"""The actions that change history, each behind a page that says what will change and what
cannot be undone, and each ending on a banner with the command that takes it back.

A GET only shows the confirmation; the change is the POST its form sends (with the CSRF field).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..errors import UsageError
from .render import Frame, banner, command, cp_url, dumps, e, q, s_url, short

if TYPE_CHECKING:
    from ..rewind import RewindResult
    from ..session import Session

__all__ = ["confirm_body", "done_banner", "hooks_params", "parse_value"]

MAX_LISTED = 15
_MODES = {"both": "files and state", "files": "files only", "state": "state only"}


def _effects_note(s: Session, ref: str, what: str) -> str:
    effects = s.effects(since=ref)
    if not effects:
        return "<p>No external effects were recorded after this checkpoint.</p>"
    items = "".join(
        f"<li><b>{e(x.tool)}</b> <code>{e(dumps(x.args)[:300])}</code> ({e(x.status)})</li>"
        for x in effects
    )
    return (
        f"<div class='warn'><b>Cannot be undone:</b> {len(effects)} external effect(s) "
        f"happened after this checkpoint; {what}<ul>{items}</ul></div>"
    )


def confirm_body(s: Session, params: Mapping[str, str], frame: Frame) -> tuple[str, str]:
    """(title, body) of the confirmation of a rewind or a fork."""
    op = params.get("op", "")
    target = s.get(params.get("ref", ""))
    url = s_url(s.name)
    back = f"<a href='{e(cp_url(s.name, target.id))}'>cancel</a>"
    if op == "rewind":
        mode = params.get("mode", "both")
        if mode not in _MODES:
            raise UsageError("mode must be both, files or state")
        if mode != "state" and s.workspace is None:
            raise UsageError("no workspace is bound to this UI: only state can be rewound")
        body = f"<p>Rewind branch <b>{e(s.branch)}</b> to <code>{short(target.id)}</code> "
        body += f"({e(target.message or target.kind)}): <b>{_MODES[mode]}</b>.</p>"
        head = s.head
        if head is not None and head.id != target.id:
            d = s.diff(head, target)
            if mode != "state" and s.workspace is not None:
                files = [
                    c
                    for c in d.files
                    if not ((c.new and c.new.kind == "d") or (c.old and c.old.kind == "d"))
                ]
                listed = "".join(
                    f"<li>{e(c.status)} <code>{e(os.fsdecode(c.path))}</code></li>"
                    for c in files[:MAX_LISTED]
                )
                more = (
                    f"<li>… {len(files) - MAX_LISTED} more</li>" if len(files) > MAX_LISTED else ""
                )
                root = e(str(s.workspace.root))
                body += (
                    f"<p>{len(files)} file(s) in <code>{root}</code> will change (ignored files "
                    f"are not touched):</p><ul>{listed}{more}</ul>"
                )
            if mode != "files":
                c = d.conversation
                body += (
                    f"<p>State: {len(d.state_changes)} value(s) change; the conversation loses "
                    f"{len(c.removed)} and regains {len(c.added)} message(s), {len(c.edited)} "
                    "edited.</p>"
                )
        if mode != "files":
            body += _effects_note(s, target.id, "a rewind does not take them back.")
        body += (
            "<p>Undo: a safety checkpoint of what is there now is taken first; rewinding to it "
            "puts everything back.</p>"
        )
        body += frame.form(url + "/rewind", {"ref": target.id, "mode": mode}, "rewind now")
        return f"rewind to {short(target.id)}?", body + " " + back
    if op == "fork":
        branch = params.get("branch", "").strip()
        into = params.get("into", "").strip()
        name = branch or f"fork-{target.id[-8:].lower()}"
        body = f"<p>Start branch <b>{e(name)}</b> at <code>{short(target.id)}</code>.</p>"
        if into:
            body += (
                f"<p>Its files are written into <code>{e(into)}</code> (a new or empty "
                "directory), which then follows the new branch. Nothing here changes.</p>"
            )
        elif s.workspace is not None and target.workspace is not None:
            body += (
                f"<p>This workspace <code>{e(str(s.workspace.root))}</code> switches to the new "
                "branch: its files become the checkpoint's, after a safety checkpoint of what "
                "is there now (rewind to it to undo).</p>"
            )
        else:
            body += "<p>Only the state forks (no workspace is bound to this UI).</p>"
        body += _effects_note(
            s, target.id, "the new branch starts before them, but they stay done."
        )
        fields = {"ref": target.id, "branch": branch, "into": into}
        return f"fork at {short(target.id)}?", body + frame.form(
            url + "/fork", fields, "fork now"
        ) + " " + back
    raise UsageError("op must be rewind or fork")


def parse_value(text: str) -> object:
    """A form's value as JSON (``10``, ``"x"``, ``[1]``), or else as the plain string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def hooks_params(result: RewindResult | None) -> dict[str, str]:
    """For the redirect after a restore: where stashpoint's agent hooks were merged back
    (``kept``), and the commands that install them again where they could not be
    (``reinstall``)."""
    if result is None:
        return {}
    return {"kept": ",".join(result.kept_hooks), "reinstall": ",".join(result.reinstall_hooks)}


def _hooks_note(params: Mapping[str, str]) -> str:
    """What a restore did to stashpoint's hooks in the agent's settings files, if anything: the
    files are the checkpoint's, with the hooks merged back so the agent stays checkpointed."""
    kept = [p for p in params.get("kept", "").split(",") if p]
    reinstall = [c for c in params.get("reinstall", "").split(",") if c]
    note = ""
    if kept:
        files = ", ".join(f"<code>{e(p)}</code>" for p in kept)
        note += (
            f" Kept stashpoint's hooks in {files}: the checkpoint's settings file, with the "
            "hooks merged back, so the agent is still checkpointed."
        )
    for again in reinstall:
        note += (
            " <b>stashpoint's hooks could not be merged back</b> into the restored settings "
            f"file: the agent is not checkpointed until you run <code>{e(again)}</code>."
        )
    return note


def done_banner(name: str, params: Mapping[str, str]) -> str:
    """The banner after an action, from the redirect's parameters (escaped: a link could be
    crafted, but only with the token, and it would only show text)."""
    done = params.get("done")
    if done == "rewound":
        safety = params.get("safety", "")
        mode = params.get("mode", "both")
        undo = q(s_url(name) + "/confirm", op="rewind", ref=safety, mode=mode)
        return banner(
            "Rewound to this checkpoint. What was there before is checkpoint "
            f"<a href='{e(cp_url(name, safety))}'><code>{short(safety)}</code></a>: "
            f"<a href='{e(undo)}'>"
            "restore it to undo</a>." + _hooks_note(params),
            command("stashpoint", "--session", name, "rewind", safety),
        )
    if done == "forked":
        into = params.get("into")
        where = f" into <code>{e(into)}</code>" if into else ""
        return banner(
            f"Forked branch <b>{e(params.get('branch', ''))}</b>{where}." + _hooks_note(params),
            command("rm", "-r", into) if into else None,
        )
    if done == "labelled":
        label = params.get("label")
        text = f"Labelled <b>{e(label)}</b>." if label else "Label removed."
        ref = params.get("ref", "")
        undo = command("stashpoint", "--session", name, "label", ref, "--delete")
        return banner(text, undo if label else None)
    if done == "edited":
        of = params.get("of", "")
        return banner(
            f"Saved the edit as this checkpoint; the original <code>{short(of)}</code> is "
            "unchanged.",
            command("stashpoint", "--session", name, "rewind", of, "--state-only"),
        )
    if done in ("approved", "rejected"):
        return banner(
            f"{e(params.get('tool', 'call'))} {done}. The run goes on when it resumes: "
            f"<code>{e(command('stashpoint', '--session', name, 'resume'))}</code>."
        )
    return ""
