"""Operator tools: ``edit`` (correct a checkpoint's state, then resume from it) and
``chaos`` (kill an agent at every step boundary and at random instants; check it recovers)."""

from __future__ import annotations

import importlib
import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ._app import Ctx, emit, json_option, pass_ctx, short

# Library modules are imported inside the commands, not here: every CLI run (``--help``
# too) imports this module (start-up time).


def _load_validators(specs: tuple[str, ...], root: Path) -> list[Callable[[dict[str, Any]], Any]]:
    """Validators named on the command line or in the project's pyproject.toml
    (``[tool.stashpoint] validators = ["pkg.module:function"]``) - configuration the project
    owns, never names read from the store."""
    names = list(specs)
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and sys.version_info >= (3, 11):
        import tomllib

        try:
            config = tomllib.loads(pyproject.read_text())
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"cannot read {pyproject}: {exc}") from None
        names += list(config.get("tool", {}).get("stashpoint", {}).get("validators", []))
    out = []
    if names and str(root) not in sys.path:
        sys.path.insert(0, str(root))  # the project's own modules, as `python -m` would
    for spec in names:
        module, _, attr = str(spec).partition(":")
        if not module or not attr:
            raise click.UsageError(f"a validator is module:function, got {spec!r}")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise click.ClickException(f"cannot load validator {spec}: {exc}") from None
        out.append(fn)
    return out


def _edit_in_editor(state: dict[str, Any]) -> dict[str, Any] | None:
    """The state as JSON in $EDITOR; None when the file comes back unchanged."""
    import subprocess  # here, not at the top: every CLI run imports this module
    import tempfile

    from ..serde import from_tree, to_tree

    text = json.dumps(to_tree(state), indent=2, ensure_ascii=False) + "\n"
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    fd, name = tempfile.mkstemp(prefix="stashpoint-edit-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        code = subprocess.call([*shlex.split(editor), name])
        if code != 0:
            raise click.ClickException(f"{editor} exited with status {code}; nothing saved")
        edited = Path(name).read_text(encoding="utf-8")
    finally:
        os.unlink(name)
    if edited == text:
        return None
    from ..errors import StashpointError

    try:
        state = from_tree(json.loads(edited))
    except ValueError as exc:
        raise click.ClickException(f"the edited state is not valid JSON: {exc}") from None
    except StashpointError as exc:
        raise click.ClickException(f"the edited state cannot be read: {exc}") from None
    if not isinstance(state, dict):
        kind = "null" if state is None else type(state).__name__
        raise click.ClickException(
            f"the edited state must be a JSON object (the state's keys), not {kind}; nothing saved"
        )
    return state


@click.command()
@click.argument("ref", required=False)
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="PATH=VALUE",
    help="Set a value (JSON, else a string); PATH like plan.budget or /plan/budget.",
)
@click.option(
    "--patch",
    "patch_file",
    type=click.File("r"),
    metavar="FILE",
    help="Apply a JSON Patch (RFC 6902) from FILE ('-' for stdin).",
)
@click.option("--editor", is_flag=True, help="Edit the state as JSON in $EDITOR.")
@click.option("--reason", "-r", help="Why (recorded with the edit).")
@click.option("--by", help="Who edits (default: the current user).")
@click.option("--branch", "-b", help="Put the edit on a new branch (needed unless REF is HEAD).")
@click.option(
    "--validator",
    "validators",
    multiple=True,
    metavar="MODULE:FUNCTION",
    help="A state validator to run first (also [tool.stashpoint] validators).",
)
@json_option
@pass_ctx
def edit(
    ctx: Ctx,
    ref: str | None,
    assignments: tuple[str, ...],
    patch_file: Any,
    editor: bool,
    reason: str | None,
    by: str | None,
    branch: str | None,
    validators: tuple[str, ...],
) -> None:
    """Correct the state of checkpoint REF (default HEAD) and save it as a new child
    checkpoint of kind `edit` (who, when, why recorded); the original is untouched. State
    validators run first and a refused edit saves nothing. Then `stashpoint resume`.

    \b
    Example:
      stashpoint edit --set plan.budget=100 --set 'plan.note="ask first"' -r "over budget"
      stashpoint edit --patch fix.json -r "drop the bad tool result"
      stashpoint diff HEAD~1 HEAD && stashpoint resume
    """
    from ..edit import parse_assignment

    if not (assignments or patch_file or editor):
        raise click.UsageError("say what to change: --set PATH=VALUE, --patch FILE or --editor")
    session = ctx.session(files=False)
    _url, root, _s, _b = ctx.locate()
    session.validators.extend(_load_validators(validators, root))
    assign: dict[str, Any] = {}
    for text in assignments:
        path, value = parse_assignment(text)
        assign["/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path)] = value
    patch = None
    if patch_file is not None:
        try:
            patch = json.load(patch_file)
        except ValueError as exc:
            raise click.UsageError(f"--patch: not JSON: {exc}") from None
    state = None
    if editor:
        base = session.state(ref)
        state = _edit_in_editor(base)
        if state is None and not (assign or patch):
            emit(ctx, {"created": False}, "no change; nothing saved")
            return
    cp = session.edit(
        ref, assign=assign, patch=patch, state=state, reason=reason, by=by, branch=branch
    )
    from ..session import checkpoint_json

    where = f" on new branch {branch!r}" if branch else ""
    emit(
        ctx,
        checkpoint_json(cp, session.labels()),
        f"saved edit {short(cp.id)}{where} ({cp.message}); see it: stashpoint diff "
        f"{short(cp.parent)} {short(cp.id)}",
    )


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--random", "random_runs", default=5, show_default=True, help="Random-instant kills.")
@click.option(
    "--boundaries/--no-boundaries",
    default=True,
    show_default=True,
    help="Kill right after each journal append (every step boundary).",
)
@click.option("--max-boundaries", default=50, show_default=True, help="Sample at most this many.")
@click.option("--approve", is_flag=True, help="Approve what a paused run asks, to go on.")
@click.option("--seed", type=int, help="Seed for the random instants (reproducible runs).")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds per agent run.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@json_option
@pass_ctx
def chaos(
    ctx: Ctx,
    random_runs: int,
    boundaries: bool,
    max_boundaries: int,
    approve: bool,
    seed: int | None,
    timeout: float,
    command: tuple[str, ...],
) -> None:
    """Test that an agent recovers: run COMMAND in fresh copies of this directory, kill it
    (SIGKILL) after each step boundary and at random instants, resume it until it finishes,
    and report per run whether it reached an uninterrupted run's output with no step body
    executed again after its result was journaled. Exit 1 if any run did not.

    \b
    Example:
      stashpoint --session job chaos --approve --random 10 -- python agent.py
    """
    from ..chaos import ChaosRun, run_chaos

    source = Path(ctx.workspace or ".").resolve()

    def show(r: ChaosRun) -> None:
        if ctx.json:
            return
        mark = click.style("ok  ", fg="green") if r.ok else click.style("FAIL", fg="red")
        extra = f", {r.approvals} approval(s)" if r.approvals else ""
        extra += f", {r.in_doubt} in-doubt effect(s) retried" if r.in_doubt else ""
        why = f"  {r.error or ''}{' ran twice: ' + ', '.join(r.ran_twice) if r.ran_twice else ''}"
        click.echo(f"  {mark} {r.scenario:<18} {r.attempts} run(s){extra}{why.rstrip()}")

    report = run_chaos(
        list(command),
        source=source,
        session=ctx.session_name or "main",
        boundaries=boundaries,
        max_boundaries=max_boundaries,
        random_runs=random_runs,
        seed=seed,
        approve=approve,
        timeout=timeout,
        progress=show,
    )
    emit(ctx, report.to_dict(), report.summary())
    if not report.ok:
        raise click.exceptions.Exit(1)
