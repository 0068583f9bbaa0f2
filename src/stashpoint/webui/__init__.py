"""The local web UI: a time-travel debugger over one store, served on loopback.

Pages: the sessions; one session's graph of checkpoints (branches as lanes, HEAD and labels
marked, filtered and paged, new checkpoints shown as they come); a checkpoint (its
conversation as a chat, its state as a tree, its files with a viewer, the run's tasks,
journal and side-effect ledger); any two checkpoints compared (files, conversation, state);
and the actions that change history, each confirmed first: rewind, fork, label, edit,
approve and reject.

``starlette`` routes the requests and ``uvicorn`` serves them: ``pip install 'stashpoint[ui]'``.
The security rules are in :mod:`stashpoint.webui.security`.
"""

from __future__ import annotations

from .app import create_app
from .security import LOOPBACK, new_token

__all__ = ["LOOPBACK", "create_app", "new_token"]
