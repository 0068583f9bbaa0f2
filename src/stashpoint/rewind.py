"""Going back: rewind a branch to a checkpoint, fork a new branch from one, materialise one
into a new directory, and finish any of them that a crash interrupted.

Every restore is journaled in the store before the first file is written and takes a
safety checkpoint of what is there now, so it can be undone, and completed after a crash
by the next session opened on the workspace. Files are written only where
:mod:`stashpoint.restore_target` allows.

These are :class:`~stashpoint.Session` methods defined here, by concern, and joined into
the class by :class:`Restoring`.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import restore_target
from ._fsutil import empty_directory
from ._ids import check_name as _check_name
from ._ids import new_id
from ._runs import UNREAD as _INHERIT
from ._store import check_not_pruned
from .durable_surface import args_summary as _args_summary
from .errors import (
    ConflictError,
    IntegrityError,
    NotFoundError,
    RestoreBlocked,
    StashpointError,
    StashpointWarning,
    UsageError,
)
from .metakeys import restore_journal_key
from .model import Checkpoint, utc_now_iso
from .stores.base import CheckpointRow, Commit
from .workspace import RestoreStats, restoring

if TYPE_CHECKING:
    from .durable import Effect
    from .session import Session
    from .trial import Trial
    from .workspace.tree import TreeReader

__all__ = ["Restoring", "RewindResult"]

_LINK_FILE = ".stashpoint"


@dataclass
class RewindResult:
    target: Checkpoint
    safety: Checkpoint
    """The checkpoint taken just before rewinding: rewind to it to undo."""
    head: Checkpoint
    files: RestoreStats | None = None
    effects: list[Effect] = field(default_factory=list)
    """Irreversible external effects recorded after the target: a rewind cannot undo them."""
    compensations: list[dict[str, Any]] = field(default_factory=list)
    """Compensations run (when asked for and registered in this process), newest first."""
    artifacts: dict[str, str] = field(default_factory=dict)
    """Artifacts restored: name -> the path written."""
    undo: str = ""
    """The shell command that undoes this rewind, from any directory."""
    kept_hooks: list[str] = field(default_factory=list)
    """Agent settings files stashpoint's hooks were merged back into, relative to the workspace."""
    reinstall_hooks: list[str] = field(default_factory=list)
    """Where they could not be merged back (each one also a warning): the commands to run."""


def _restoring(self: Session, *, wait: bool = True) -> contextlib.AbstractContextManager[bool]:
    """The workspace's restore lock (see :func:`stashpoint.workspace.restoring`)."""
    if self.root is None:
        return contextlib.nullcontext(True)
    home = self.store.home
    return restoring(self.root, home / "locks" if home is not None else None, wait=wait)


def _journal_key(self: Session) -> str | None:
    return restore_journal_key(self.root) if self.root is not None else None


def rewind(
    self: Session,
    ref: str,
    *,
    files: bool = True,
    state: bool = True,
    compensate: bool = False,
    artifacts: bool | Mapping[str, str | os.PathLike[str] | None] = False,
    progress: Callable[[int, int], None] | None = None,
    artifacts_to: str | os.PathLike[str] | None = None,
    recorded_paths: bool = False,
    keep_hooks: bool = True,
) -> RewindResult:
    """Go back to a checkpoint: files, state, or both.

    A safety checkpoint of whatever is there now is taken first, so every rewind can be
    undone by rewinding to it. With both files and state, the branch head moves to the
    target; with only one, a new ``rewind`` checkpoint combines the target's part with the
    current other part.

    Irreversible effects recorded after the target (sent messages, deployments) cannot be
    undone by a rewind: they are listed in the result and in a warning. With
    ``compensate``, their registered compensations run newest first — now, if this
    process registered them, else when the program next runs on this branch.

    ``artifacts`` also puts the target's artifacts back: True for all of them, or
    ``{name: path or None}`` for some. An artifact given no path goes under
    ``artifacts_to`` (a directory), or, only with ``recorded_paths``, to the path it was
    attached from; never over the store's own files. The files there now are attached
    to the safety checkpoint first, so this is undoable too.

    Files are restored only into the directory this branch is bound to (where its
    checkpoints were taken) unless the session was opened with ``bind=True``;
    otherwise :class:`~stashpoint.restore_target.RestoreRefused` (exit 1), before
    anything is written. A restore that fails on damaged data puts the workspace and
    the branch head back as they were.

    Stashpoint's hooks installed in the workspace's agent settings files (``stashpoint hooks
    install``) stay installed, merged back into the restored files (``kept_hooks``), also
    when a crash interrupts the restore; ``keep_hooks=False`` restores the files as they are.
    """
    return self._rewind(
        ref,
        files=files,
        state=state,
        compensate=compensate,
        artifacts=artifacts,
        progress=progress,
        artifacts_to=artifacts_to,
        recorded_paths=recorded_paths,
        keep_hooks=keep_hooks,
    )


def _rewind(
    self: Session,
    ref: str,
    *,
    files: bool = True,
    state: bool = True,
    compensate: bool = False,
    artifacts: bool | Mapping[str, str | os.PathLike[str] | None] = False,
    progress: Callable[[int, int], None] | None = None,
    artifacts_to: str | os.PathLike[str] | None = None,
    recorded_paths: bool = False,
    reuse_head: bool = False,
    keep_hooks: bool = True,
) -> RewindResult:
    """:meth:`rewind`; ``reuse_head``: when nothing changed since the branch head (same
    files, state and journal), the head is the undo point and no safety checkpoint is
    recorded (a trial rolling back right after its checkpoint)."""
    if not (files or state):
        raise UsageError("rewind needs files, state or both")
    if files:
        self._check_restore_here()
    target = self.get(ref)
    check_not_pruned(self.store, target)
    if files and target.workspace is not None and self.workspace is None:
        raise UsageError("this session has no workspace directory to restore files into")
    if files and target.workspace is not None:
        self._check_restore(self.branch, target)
    self._warn_if_foreign(target)
    effects = self.effects(since=target) if state else []
    plan = (
        restore_target.artifact_plan(
            target,
            artifacts,
            to_dir=artifacts_to,
            recorded_ok=recorded_paths,
            protected=self.store.own_paths,
        )
        if artifacts
        else {}
    )
    captured = {n: p for n, p in plan.items() if p.is_file()}
    # A state-only rewind run from a directory the branch is not bound to records no
    # files of it: the branch keeps its own directory's files.
    here = files or (self.root is not None and self.bound_root() == str(self.root))
    before = self._fresh_head() if reuse_head and here and not captured else None
    safety = self.checkpoint(
        kind="pre-rewind",
        message=f"before rewind to {target.id}",
        artifacts=captured,
        progress=progress if captured else None,
        files=here,
        # Nothing changed since the head (same files, same state, same journal): the head
        # is the undo point, and no duplicate is recorded.
        skip_unchanged=before is not None and self._journal_ref(before) == before.journal,
    )
    reused = before is not None and safety.id == before.id
    extra = {
        "artifacts": {n: str(p) for n, p in plan.items()},
        "captured": sorted(captured),
        "bind": "explicit" if self.explicit_root else None,
        **self._hooks_here(keep_hooks and files),
    }
    with self._restoring():
        # A rewind that writes no file (the workspace already holds the target's tree) has
        # nothing for a crash to interrupt: the head moves in one transaction, unjournaled.
        writes = bool(plan) or not (
            files
            and safety.workspace is not None
            and target.workspace is not None
            and safety.workspace.tree == target.workspace.tree
        )
        journal = self._journal(
            target, safety, files=files, state=state, extra=extra, persist=writes
        )
        try:
            result = self._finish_rewind(journal, safety, recovering=False, progress=progress)
        except (IntegrityError, NotFoundError, RestoreBlocked):
            if not reused:
                self._drop_safety(safety)
            raise
    result.effects = effects
    result.artifacts = {n: str(p) for n, p in plan.items()}
    result.undo = restore_target.undo_command(
        self.store.url,
        self.name,
        self.root,
        result.safety.id,
        files=files,
        state=state,
        artifacts=captured,
    )
    if effects and compensate:
        self.durable.request_compensation(effects)
        result.compensations = self.durable.run_pending_compensations()
    elif effects:
        _warn_effects(effects, f"rewound past {len(effects)}")
    return result


def _warn_effects(effects: list[Effect], what: str) -> None:
    listed = "; ".join(f"{e.tool}{_args_summary(e.args)} [{e.status}]" for e in effects)
    warnings.warn(
        f"{what} irreversible effect(s) that cannot be undone: {listed}",
        StashpointWarning,
        stacklevel=3,
    )


def _journal(
    self: Session,
    target: Checkpoint,
    safety: Checkpoint | None,
    *,
    branch: str | None = None,
    files: bool = True,
    state: bool = True,
    extra: dict[str, Any] | None = None,
    persist: bool = True,
) -> dict[str, Any]:
    """Record, durably and before touching any file, what a restore is going to do
    (``persist=False``: a restore that writes no file, whose journal stays in memory)."""
    journal = {
        "session": self.name,
        "branch": branch or self.branch,
        "target": target.id,
        "safety": safety.id if safety else None,
        "files": files,
        "state": state,
        "result": new_id(),
        **(extra or {}),
    }
    key = self._journal_key()
    if key is not None and persist:
        self.store.meta.set_meta(key, json.dumps(journal))
    journal["persisted"] = persist and key is not None
    return journal


def _fresh_head(self: Session) -> Checkpoint | None:
    """The branch head, if this session's view of it is current (one indexed read)."""
    head = self.head
    if head is None or self.store.meta.get_head(self.name, self.branch) != head.id:
        return None
    return head


def _finish_rewind(
    self: Session,
    journal: dict[str, Any],
    safety: Checkpoint | None,
    *,
    recovering: bool,
    progress: Callable[[int, int], None] | None = None,
) -> RewindResult:
    target = self.store.get(journal["target"])
    files, state = bool(journal["files"]), bool(journal["state"])
    stats = None
    if files and self.workspace is not None and target.workspace is not None:
        if recovering or safety is None or safety.workspace is None:
            # recovering (the directory may be half-restored), or materialising a fork
            self.workspace.clean_temp_files()
            current = self._current_tree()
        else:
            current = bytes.fromhex(safety.workspace.tree)
        want = bytes.fromhex(target.workspace.tree)
        try:
            stats = self.workspace.restore(current, want)
            if recovering:  # after a crash, check the whole tree, not just what we touched
                self.workspace.verify_equals(want, stats.kept_dirs)
        except (IntegrityError, NotFoundError, RestoreBlocked) as exc:
            self._roll_back(safety, exc)
            raise
    if journal.get("artifacts"):
        self._restore_artifacts(journal, target, safety, recovering, progress)
    kept: tuple[list[str], list[str]] = ([], [])
    if stats is not None and journal.get("hooks") and self.root is not None:
        from .agent_hooks.keep import put_back  # here: only a restore of files needs it

        kept = put_back(self.root, journal["hooks"])  # journaled: a crash is finished with them
    if state:  # the execution position went back: the branch's durable run is over
        from .durable import end_run

        end_run(self)
        self._run_record = _INHERIT
        if self._durable is not None:
            self._durable.end()
    if files and state:
        current_head = self.store.meta.get_head(self.name, self.branch)
        if current_head != target.id:
            self.store.meta.set_head(
                self.name, self.branch, target.id, current_head, fence=self.fence
            )
        self._head_loaded = False
        head = target  # (read and verified above)
    else:
        assert safety is not None, "partial rewinds always take a safety checkpoint"
        head = self._compose(journal, target, safety)
    if journal.get("bind") and files and self.root and target.workspace is not None:
        # A new branch (fork, import --into) is bound here; an explicit restore binds a
        # branch only when it has no usable directory (it does not take a project away).
        bound = restore_target.bound_to(self.store, self.name, journal["branch"])
        if journal["bind"] == "new" or not restore_target.usable(bound):
            self._bind(journal["branch"])
    if journal.get("checkout"):
        self._set_checkout(journal["branch"])
    key = self._journal_key()
    if key is not None and journal.get("persisted", True):
        self.store.meta.set_meta(key, None)
    result = RewindResult(target, safety or head, head, stats)
    result.kept_hooks, result.reinstall_hooks = kept
    self._last_restore = result
    return result


def _hooks_here(self: Session, keep: bool) -> dict[str, Any]:
    """For a restore's journal: stashpoint's hooks installed in the workspace, which the
    restore merges back (:mod:`stashpoint.agent_hooks.keep`)."""
    if not keep or self.root is None:
        return {}
    from .agent_hooks.keep import installed

    return {"hooks": installed(self.root)}


def _drop_safety(self: Session, safety: Checkpoint) -> None:
    """A failed rewind moves nothing: the branch head goes back from the safety
    checkpoint to where it was (the workspace is already back as it was, so the safety
    checkpoint holds nothing that is not still there; GC frees it)."""
    if safety.parent is None:
        return
    try:
        self.store.meta.set_head(
            self.name, safety.branch, safety.parent, safety.id, fence=self.fence
        )
    except ConflictError:
        return  # another writer moved on from it: theirs stays
    self._head_loaded = False


def _roll_back(self: Session, safety: Checkpoint | None, exc: Exception) -> None:
    """A restore hit damaged data: put the workspace back as it was and drop the journal.

    The safety checkpoint was written (and its blobs verified) just before, so going back
    to it loses nothing. If even that fails, the journal stays for a later attempt.
    """
    assert self.workspace is not None
    if safety is not None and safety.workspace is not None:
        back = bytes.fromhex(safety.workspace.tree)
        try:
            self.workspace.clean_temp_files()
            self.workspace.restore(self._current_tree(), back)
        except StashpointError as again:
            raise again from exc
    key = self._journal_key()
    if key is not None:
        self.store.meta.set_meta(key, None)


def _restore_artifacts(
    self: Session,
    journal: dict[str, Any],
    target: Checkpoint,
    safety: Checkpoint | None,
    recovering: bool,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Put the target's artifacts back, each atomically. On damage, undo the ones done
    (from the safety checkpoint, or by removing files that were not there) and the
    workspace restore, then raise."""
    from .artifacts import restore_artifact, sweep_leftovers

    targets = {str(n): Path(p) for n, p in journal["artifacts"].items()}
    if recovering:
        sweep_leftovers(targets)
    done: list[str] = []
    try:
        for name, path in targets.items():
            ref = target.artifacts.get(name)
            if ref is None:
                raise IntegrityError(f"checkpoint {target.id} has no artifact {name!r}")
            restore_artifact(self.store.blobs, ref, path, progress=progress)
            done.append(name)
    except (IntegrityError, NotFoundError) as exc:
        captured = set(journal.get("captured") or ())
        for name in done:
            old = safety.artifacts.get(name) if safety is not None else None
            if name in captured and old is not None:
                restore_artifact(self.store.blobs, old, targets[name])
            else:
                targets[name].unlink(missing_ok=True)
        if journal.get("files") and self.workspace is not None and target.workspace:
            self._roll_back(safety, exc)
        else:
            key = self._journal_key()
            if key is not None:
                self.store.meta.set_meta(key, None)
        raise


def _current_tree(self: Session) -> bytes:
    assert self.workspace is not None
    result, rows = self.workspace.scan()
    if rows:
        self.store.meta.put_blobs(rows)
    self.workspace.save_cache()
    return result.tree


def _compose(
    self: Session, journal: dict[str, Any], target: Checkpoint, safety: Checkpoint
) -> Checkpoint:
    """The checkpoint after a files-only or state-only rewind (idempotent via its id)."""
    ident = journal["result"]
    if self.store.meta.get_checkpoint(ident) is not None:
        self._head_loaded = False
        return self.store.get(ident)
    files = bool(journal["files"])
    ws = target.workspace if files else safety.workspace
    st = safety.state if files else target.state
    jr = safety.journal if files else target.journal
    arts = dict(safety.artifacts)
    arts.update({n: target.artifacts[n] for n in journal.get("artifacts") or ()})
    what = "files" if files else "state"
    cp = Checkpoint(
        id=ident,
        session=self.name,
        branch=self.branch,
        parent=safety.id,
        parent_digest=safety.digest,
        step=safety.step + 1,
        kind="rewind",
        message=f"rewound {what} to {target.id}",
        created_at=utc_now_iso(),
        schema_version=(safety if files else target).schema_version,
        config_hash=self.config_hash or (safety if files else target).config_hash,
        deps=self._deps,
        state=st,
        workspace=ws,
        journal=jr,
        artifacts=dict(sorted(arts.items())),
    )
    sealed, body = self.store.hasher.seal(cp)
    row = CheckpointRow(cp.id, cp.session, cp.branch, cp.parent, body, sealed.digest)
    self.store.meta.commit(Commit(row, safety.id, fence=self.fence))
    self._head, self._head_loaded, self._conv_objs = sealed, True, None
    return sealed


def complete_interrupted_restore(self: Session) -> bool:
    """Finish a rewind that a crash interrupted (called on open); True if there was one."""
    key = self._journal_key()
    if key is None:
        return False
    raw = self.store.meta.get_meta(key)
    if raw is None:
        return False
    journal = json.loads(raw)
    if journal.get("session") != self.name:
        return False
    with self._restoring(wait=False) as mine:
        if not mine:
            return False  # the rewind that wrote it is running now: not interrupted
        if self.store.meta.get_meta(key) != raw:
            return False  # it finished between our read and taking the lock
        return self._complete(journal)


def _complete(self: Session, journal: dict[str, Any]) -> bool:
    saved_branch = self.branch
    self.branch = journal["branch"]
    safety = None
    try:
        safety = self.store.get(journal["safety"]) if journal.get("safety") else None
        safety = self._keep_work_since(journal, safety)
        self._finish_rewind(journal, safety, recovering=True)
    except (IntegrityError, NotFoundError, RestoreBlocked) as exc:
        if safety is not None:
            self._drop_safety(safety)
        # The target is damaged (or blocked by ignored files): the workspace went back to
        # its safety checkpoint and the journal is gone, so this command can go on.
        warnings.warn(
            f"an interrupted rewind to {journal['target']} could not be completed ({exc}); "
            "the workspace was put back as it was before that rewind",
            StashpointWarning,
            stacklevel=3,
        )
    else:
        if journal.get("checkout") and self.root is not None:
            saved_branch = journal["branch"]  # a fork here finished: follow its branch
    finally:
        self.branch = saved_branch
        self._head_loaded = False
    return True


def _keep_work_since(
    self: Session, journal: dict[str, Any], safety: Checkpoint | None
) -> Checkpoint | None:
    """Before an interrupted restore is finished: if a file now holds what neither its
    target nor its safety checkpoint has (work done since the interruption), record the
    workspace first, and finish from that checkpoint (the undo point, what a failure puts
    back) so that none of that work is lost."""
    if not journal.get("files") or self.workspace is None:
        return safety
    target = self.store.get(journal["target"])
    if target.workspace is None:
        return safety
    self.workspace.clean_temp_files()
    current = self._current_tree()
    reader = self.workspace.reader
    new = _changed_files(reader, bytes.fromhex(target.workspace.tree), current)
    if new and safety is not None and safety.workspace is not None:
        new &= _changed_files(reader, bytes.fromhex(safety.workspace.tree), current)
    if not new:
        return safety
    kept = self.checkpoint(
        kind="pre-rewind",
        message=f"work found while finishing an interrupted restore to {target.id}",
    )
    some = ", ".join(os.fsdecode(p) for p in sorted(new)[:3])
    more = f" and {len(new) - 3} more" if len(new) > 3 else ""
    warnings.warn(
        f"an interrupted restore to {target.id} is being finished; {some}{more} changed "
        f"since it was interrupted, so the workspace was first saved as checkpoint "
        f"{kept.id} (rewind to it to get that work back)",
        StashpointWarning,
        stacklevel=4,
    )
    return kept


def _changed_files(reader: TreeReader, base: bytes, now: bytes) -> set[bytes]:
    """Paths of the files and links in tree ``now`` that differ from ``base`` (new
    content, kind or mode); deletions and directories are not work a restore can lose."""
    return {
        c.path
        for c in reader.diff(base, now)
        if c.new is not None and c.new.kind != "d" and c.status != "deleted"
    }


def fork(
    self: Session,
    ref: str,
    branch: str | None = None,
    *,
    into: str | os.PathLike[str] | None = None,
    keep_hooks: bool = True,
) -> Session:
    """A new branch starting at a checkpoint.

    With ``into``, the checkpoint's files are materialised in that (new or empty) directory,
    which then follows the new branch, bound to it: two directories, two independent runs
    from identical state. Without it, this workspace switches to the new branch (after a
    safety checkpoint), under the same rule as a rewind of where files may be written.

    The branch exists only once its files are in place: a fork that fails, or is killed,
    leaves no branch behind, and re-running it (or any command in ``into``) finishes it.
    Here, stashpoint's agent hooks stay installed as with :meth:`rewind` (``last_restore``
    says where they were merged back).
    """
    target = self.get(ref)
    check_not_pruned(self.store, target)
    if not branch:  # the first free one of fork-<id>, fork-<id>-2, ...
        base, taken = f"fork-{target.id[-8:].lower()}", set(self.store.meta.branches(self.name))
        names = [base, *(f"{base}-{n}" for n in range(2, len(taken) + 2))]
        branch = next(b for b in names if b not in taken)
    _check_name("branch", branch)
    if into is not None:
        dest = Path(into).resolve()
        resumed = self._resume_fork_into(dest, branch)
        if resumed is not None:
            return resumed
        self._check_fork_into(dest)  # before the branch name is judged: the likelier mistake
    if branch in self.store.meta.branches(self.name):
        raise UsageError(f"branch {branch!r} already exists in session {self.name!r}")
    files = self.workspace is not None and target.workspace is not None
    if into is None and files:
        self._check_restore(self.branch, target)
    effects = self.effects(since=target)
    if effects:  # the new branch starts before them; the world has them already
        _warn_effects(effects, f"the fork starts before {len(effects)}")
    if into is not None:
        return self._materialise(dest, target, branch)
    safety = None
    if files:
        safety = self.checkpoint(kind="pre-rewind", message=f"before fork to {branch}")
    with self._restoring():
        journal = self._journal(
            target,
            safety,
            branch=branch,
            extra={
                "bind": "new" if files else None,
                "checkout": True,
                **self._hooks_here(keep_hooks and files),
            },
        )
        old_branch = self.branch
        self.branch, self._head_loaded = branch, False
        try:
            self._finish_rewind(journal, safety, recovering=False)
        except (IntegrityError, NotFoundError, RestoreBlocked):
            self.branch, self._head_loaded = old_branch, False
            if safety is not None:
                self._drop_safety(safety)
            raise
    return self


def materialize(self: Session, into: str | os.PathLike[str], ref: str = "HEAD") -> Session:
    """Write a checkpoint of this branch (default: its head) into a new or empty
    directory, which then follows this branch and is bound to it: how an imported
    session gets a workspace (``stashpoint import FILE --into DIR``)."""
    target = self.get(ref)
    check_not_pruned(self.store, target)
    if self.store.meta.get_head(self.name, self.branch) != target.id:
        raise UsageError(
            f"{ref} is not the head of branch {self.branch!r}: fork it --into a directory"
        )
    return self._materialise(Path(into).resolve(), target, self.branch)


def _materialise(self: Session, dest: Path, target: Checkpoint, branch: str) -> Session:
    """``target``'s files into the new or empty ``dest``, bound to ``branch``, whose head
    is set to ``target`` once they are there."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} exists and is not an empty directory")
    restore_target.check_new_workspace(
        dest,
        own=self.store.own_paths,
        workspaces=[*restore_target.workspaces_of(self.store), *([self.root] if self.root else [])],
    )
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    other = type(self)(self.store, self.name, workspace=dest, branch=branch, force=True, bind=True)
    other.schema_version, other.config_hash = self.schema_version, self.config_hash
    # Journal first, then the link file: a crash while materialising is completed by the
    # next stashpoint command run inside the new directory (or the same command run
    # again); the branch head is set last, when the files are there.
    with other._restoring():
        journal = other._journal(
            target, None, branch=branch, extra={"bind": "new", "checkout": True}
        )
        try:
            self._write_link_file(dest, branch)
            other._finish_rewind(journal, None, recovering=False)
        except (IntegrityError, NotFoundError, RestoreBlocked):
            # Damaged data: the directory was empty (or new) before, so nothing in it is
            # the user's; leave it as it was rather than half made.
            empty_directory(dest, remove=created)
            raise
    return other


def _resume_fork_into(self: Session, dest: Path, branch: str) -> Session | None:
    """A ``fork --into`` killed after writing ``dest``'s link file: finish it (opening a
    session there completes its journal) instead of refusing a non-empty directory."""
    try:
        if [p.name for p in dest.iterdir()] != [_LINK_FILE]:
            return None
    except OSError:
        return None
    if self._unfinished_fork_in(dest) != {"session": self.name, "branch": branch}:
        return None
    other = type(self)(self.store, self.name, workspace=dest, branch=branch, force=True, bind=True)
    return other if other.head is not None else None


def _check_fork_into(self: Session, dest: Path) -> None:
    """Refuse a fork's ``into`` that is neither new nor empty, saying why: a directory a
    killed fork left behind is finished by the next command run inside it."""
    if not dest.exists():
        return
    if not dest.is_dir():
        raise UsageError(f"{dest} exists and is not a directory")
    if not any(dest.iterdir()):
        return
    link = self._unfinished_fork_in(dest)
    if link is not None:
        import shlex

        raise UsageError(
            f"{dest} holds a fork to branch {link['branch']!r} that was interrupted; any "
            f"stashpoint command run inside it finishes it: cd {shlex.quote(str(dest))} && "
            "stashpoint log"
        )
    raise UsageError(f"{dest} exists and is not an empty directory")


def _unfinished_fork_in(self: Session, dest: Path) -> dict[str, str] | None:
    """Session and branch of a fork into ``dest`` from this store that has not finished."""
    try:
        link = json.loads((dest / _LINK_FILE).read_text())
    except (OSError, ValueError):
        return None
    home = self.store.home
    if (
        home is None
        or not isinstance(link, dict)
        or link.get("store") != str(home)
        or self.store.meta.get_meta(restore_journal_key(dest)) is None
    ):
        return None
    return {"session": str(link.get("session")), "branch": str(link.get("branch"))}


def _write_link_file(self: Session, dest: Path, branch: str) -> None:
    """A ``.stashpoint`` file telling the CLI, run inside ``dest``, which store to use."""
    if self.store.home is None:
        return
    link = {"store": str(self.store.home), "session": self.name, "branch": branch}
    (dest / _LINK_FILE).write_text(json.dumps(link) + "\n")


def trial(self: Session, ref: str | Checkpoint | None = None) -> Trial:
    """Try something from checkpoint ``ref`` (default: a checkpoint of the workspace as it
    is now), then keep it or roll back; use as ``with session.trial(ref) as t: ...``.
    See :class:`stashpoint.trial.Trial`."""
    from .trial import Trial

    return Trial(self, ref)


class Restoring:
    """The methods above, as :class:`~stashpoint.Session` has them."""

    _last_restore: RewindResult | None = None

    @property
    def last_restore(self) -> RewindResult | None:
        """What this session's latest restore did (a rewind, a fork, one finished on open)."""
        return self._last_restore

    _restoring = _restoring
    _journal_key = _journal_key
    _hooks_here = _hooks_here
    rewind = rewind
    _rewind = _rewind
    _journal = _journal
    _fresh_head = _fresh_head
    _finish_rewind = _finish_rewind
    _keep_work_since = _keep_work_since
    _check_fork_into = _check_fork_into
    _unfinished_fork_in = _unfinished_fork_in
    _drop_safety = _drop_safety
    _roll_back = _roll_back
    _restore_artifacts = _restore_artifacts
    _current_tree = _current_tree
    _compose = _compose
    complete_interrupted_restore = complete_interrupted_restore
    _complete = _complete
    fork = fork
    materialize = materialize
    _materialise = _materialise
    _resume_fork_into = _resume_fork_into
    _write_link_file = _write_link_file
    trial = trial
