"""Durable execution: steps that run once, task progress, a side-effect ledger, approval gates.

A durable run journals every call it makes through :meth:`Session.step`, :meth:`Session.tool`,
:meth:`Session.plan` and :meth:`Session.task` into an append-only log (the same kind of log as
the conversation: hash-chained rows, forked without copying). When the process dies and the
program runs again, it re-executes from the top and every call that has a journal entry returns
the recorded result instead of running its body - so the program must make the same durable
calls in the same order, and keep its non-determinism (LLM calls, clocks, I/O) inside steps.

Each call takes a *slot*: its number in call order. Entries carry their slot, so a replay looks
calls up by slot, not by log position, and concurrent async steps may finish in any order.

A journal belongs to a branch through a *run record* (store meta ``run:<session>:<branch>``):
the log that receives appends and the checkpoint the run started from. Rewinding or forking
ends the run, so a later run starts a new log from the target's journal: its steps replay up
to the target and execute afresh after it.

The parts, lower first:

- :mod:`.entries` - the journal entries, typed (one msgspec Struct per kind, the wire format)
- :mod:`.results` - what a run reports: results, pauses, tasks, ledger effects
- :mod:`.journal` - a branch's journal: read, verified, appended, and what it says
- :mod:`.compensation` - undoing recorded effects, newest first
- :mod:`.engine` - :class:`Durable`: steps, tools, gates, tasks and the run around them
- :mod:`.chaoshooks` - fault injection for ``stashpoint chaos``
- :mod:`.decisions` - a human's approve / reject / "it happened", and the run's status
"""

from __future__ import annotations

from ..errors import DivergenceError, StepFailed, ToolRejected
from .chaoshooks import ChaosHooks as ChaosHooks
from .decisions import decide as decide
from .decisions import run_status as run_status
from .decisions import tasks_at as tasks_at
from .decisions import user as _user
from .engine import Durable as Durable
from .engine import current_effect_key
from .entries import fingerprint as fingerprint
from .journal import Journal as Journal
from .journal import common_prefix as common_prefix
from .journal import end_run as end_run
from .journal import fold_tasks as fold_tasks
from .results import TASK_STATUSES, Decision, Effect, Pending, RunPaused, RunResult, Task

__all__ = [
    "TASK_STATUSES",
    "Decision",
    "DivergenceError",
    "Effect",
    "Pending",
    "RunPaused",
    "RunResult",
    "StepFailed",
    "Task",
    "ToolRejected",
    "current_effect_key",
]
__all__ += ["_user"]  # the session's edit and approval records name the same person
