"""Every store meta key stashpoint uses, and the few an encrypted store keeps in plaintext.

Store meta is a small key-value space beside the records (:class:`~stashpoint.stores.base.MetaKV`).
Its names live here so that a reader sees them all at once, and so that encryption can seal
*every* value by default (:mod:`stashpoint.stores.encrypted`): a feature that adds a key is
sealed without having to know about encryption. Only the keys in :data:`PLAINTEXT` stay
readable, each for a reason given beside it: they are read before the key is known or
compared by a backend inside a transaction, and none holds application state.

Prefixes end with their separator; the full key adds a session, branch or directory, and
the function beside a prefix builds it, so no other module spells a key.
"""

from __future__ import annotations

import json

__all__ = [
    "BLOBS_URL",
    "CHECKOUT",
    "COMPENSATE",
    "DURABILITY",
    "ENCRYPTION",
    "FORMAT",
    "GC_EPOCH",
    "GC_LOGS",
    "GC_PACKS",
    "IMPORT",
    "INTEGRITY",
    "LANGGRAPH_PENDING",
    "MIRROR_BEHIND",
    "MIRROR_FAILED",
    "PLAINTEXT",
    "REF_AUTH",
    "RESTORE_JOURNAL",
    "RUN",
    "SEALED_ALWAYS",
    "SESSION_VALUES",
    "STORE_ID",
    "UPKEEP",
    "UPKEEP_LAST",
    "WORKSPACE",
    "checkout_key",
    "compensation_key",
    "import_key",
    "is_plaintext",
    "langgraph_pending_key",
    "restore_journal_key",
    "run_key",
    "workspace_key",
]

# -- plaintext in an encrypted store ------------------------------------------------------
GC_EPOCH = "gc_epoch"
"""Bumped whenever GC condemns blobs; backends compare it inside a commit's transaction."""
ENCRYPTION = "encryption"
"""The encryption marker (cipher, key id): read to find out which key opens the store."""
DURABILITY = "durability"
"""The store's default durability level: read while opening, before the cipher exists."""
STORE_ID = "store_id"
"""A random id naming the store (an S3 blob prefix is claimed with it before opening)."""
BLOBS_URL = "blobs_url"
"""Where the store keeps its blobs (``s3://…``): needed to open the store at all."""
FORMAT = "format"
"""The store's format version (:mod:`stashpoint.stores.formats`): read while opening, to tell
a store in an older format (read as it is, written after ``stashpoint upgrade``) or a newer one
(refused) from a current one. Written last by an upgrade, so it is the upgrade's commit."""

INTEGRITY = "integrity"
"""The id (not the key) of the key a keyed hash chain is sealed with: read while opening, to
tell a missing or wrong key from damaged records."""

REF_AUTH = "integrity:refs"
"""A keyed store's MAC'd marker (``refs1.<mac>`` over the store id and the key's id): every
head and label carries a MAC (:mod:`stashpoint.stores.refauth`), and the ``integrity`` marker
and store id are authentic. Read while opening, below encryption; holds only a MAC."""

PLAINTEXT: frozenset[str] = frozenset(
    {GC_EPOCH, ENCRYPTION, DURABILITY, STORE_ID, BLOBS_URL, FORMAT, INTEGRITY, REF_AUTH}
)
"""The only meta keys whose values an encrypted store keeps in plaintext."""

# -- sealed in an encrypted store ---------------------------------------------------------
RUN = "run:"
"""``run:<session>:<branch>``: a durable run's record (:func:`run_key`)."""
COMPENSATE = "compensate:"
"""``compensate:<session>:<branch>``: a durable run's compensation plan."""
LANGGRAPH_PENDING = "langgraph:pending:"
"""``langgraph:pending:<session>``: the LangGraph saver's pending writes."""
CHECKOUT = "checkout:"
"""``checkout:<session>:<directory>``: the branch a working directory has checked out."""
RESTORE_JOURNAL = "restore-journal:"
"""``restore-journal:<directory>``: an interrupted restore's journal."""
WORKSPACE = "workspace:"
"""``workspace:["session", "branch"]``: the directory a branch restores into."""
IMPORT = "import:"
"""``import:<session>``: a bundle import in progress."""
MIRROR_BEHIND = "mirror:behind"
"""JSON ``{"mirror", "since", "error"}`` while a mirror lags."""
MIRROR_FAILED = MIRROR_BEHIND + ":"
"""``mirror:behind:<token>``: one more key per failed copy to the mirror."""
GC_PACKS = "gc:packs"
"""Packs a collection is rewriting (a crash leaves this note for the next run)."""
GC_LOGS = "gc:logs"
"""Logs found unreferenced, with when (deleted after the grace period)."""
UPKEEP = "upkeep"
"""The store's automatic-upkeep settings."""
UPKEEP_LAST = "upkeep:last"
"""When automatic upkeep last ran."""


def run_key(session: str, branch: str) -> str:
    return f"{RUN}{session}:{branch}"


def compensation_key(session: str, branch: str) -> str:
    return f"{COMPENSATE}{session}:{branch}"


def langgraph_pending_key(session: str) -> str:
    return f"{LANGGRAPH_PENDING}{session}"


SESSION_VALUES = {LANGGRAPH_PENDING: langgraph_pending_key}
"""Per-session application values (:meth:`stashpoint.Store.session_value`): name -> key."""


def checkout_key(session: str, directory: object) -> str:
    return f"{CHECKOUT}{session}:{directory}"


def restore_journal_key(directory: object) -> str:
    return f"{RESTORE_JOURNAL}{directory}"


def workspace_key(session: str, branch: str) -> str:
    # JSON, not "a:b": session names like "lg:thread" hold colons themselves.
    return WORKSPACE + json.dumps([session, branch], ensure_ascii=False)


def import_key(session: str) -> str:
    return f"{IMPORT}{session}"


SEALED_ALWAYS = (RUN, COMPENSATE, LANGGRAPH_PENDING)
"""Prefixes every encrypted store has sealed since encryption exists: a plaintext value under
one of them is refused (anything else may be plaintext written by an older version)."""


def is_plaintext(key: str) -> bool:
    """Whether an encrypted store keeps this key's value readable (see :data:`PLAINTEXT`)."""
    return key in PLAINTEXT
