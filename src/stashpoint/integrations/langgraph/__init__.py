"""LangGraph: a checkpoint saver on any stashpoint store.

    from stashpoint.integrations.langgraph import StashpointSaver

    saver = StashpointSaver(".stashpoint", workspace="repo/", restore_on_time_travel=True)
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "ticket-42"}}
    graph.invoke(inputs, config, durability="sync")
    saver.restore_files(past.config)           # time travel: repo/ as it was there
    graph.invoke(None, past.config, durability="sync")

How LangGraph's model maps onto stashpoint's:

- **Thread -> session.** LangGraph thread ``T`` is the stashpoint session ``lg:T``. Every
  ``put`` is one stashpoint checkpoint (kind ``auto``) sealed into that session's hash chain,
  with the files of the workspace directory when the saver has one (root namespace only).
  The record's ``meta["langgraph"]`` names the LangGraph checkpoint (id, parent, namespace);
  versions, ``versions_seen``, metadata and the parent's writes are the state value
  ``langgraph`` (``stashpoint show`` prints them).
- **Parents -> branches.** A namespace's history is branch ``main`` (subgraph namespace ``N``:
  ``ns:N``). A put whose parent is the head of its branch extends it; a put from an older
  checkpoint (time travel, ``update_state`` on the past) starts branch
  ``<base>@<checkpoint id>`` at the parent's record. ``stashpoint --session lg:T log --graph``
  draws LangGraph's own tree; ``stashpoint diff`` compares any two LangGraph checkpoints.
- **Messages -> conversation.** The ``messages`` channel (``conversation_channel``) is the
  stashpoint conversation: an append-only log shared by a line of history, one entry per
  message, so a step that adds k messages stores O(k) bytes, not the whole list again
  (LangGraph's SQLite saver re-stores it at every step). Other channels are state values,
  content-addressed: a channel that did not change costs nothing. Every value goes through
  the saver's ``serde`` (LangGraph's serializer, encryption included); the bytes are stored
  zstd-compressed with a fixed dictionary of LangChain's message envelope.
- **Pending writes.** ``put_writes`` is durable at once, in one store-level key per thread
  (``langgraph:pending:<session>``, with a MAC from the store's hasher: keyed when the store
  is), with LangGraph's rules (special channels replace, others keep the first write).
  The key is changed by compare-and-set, so savers in several processes writing to one
  thread at once lose none of each other's writes; a saver alone on its thread makes one
  store round trip per ``put_writes`` (two on an encrypted store). When the next checkpoint
  of that line is put, the writes move into it; a write that is the very messages the new
  checkpoint appended is kept as a reference to them, so a step's messages are stored once,
  not twice.
- **Deleting.** stashpoint records are never removed (their digests chain). ``delete_thread``,
  ``delete_for_runs`` and ``prune`` hide checkpoints from LangGraph and mark their records
  pruned, so ``stashpoint gc`` frees what only they used; a branch whose head goes first gets
  an empty ``langgraph: removed`` checkpoint as its head (heads are never pruned).
  ``stashpoint verify`` keeps passing. ``copy_thread`` copies checkpoints and writes, not
  workspace snapshots. Retention (``stashpoint prune``) hides what it prunes the same way.
  ``prune(strategy="keep_latest")`` refuses a thread with a ``DeltaChannel`` (as LangGraph's
  PostgresSaver does): its value is rebuilt from the checkpoints it would hide.
- **Files.** With ``workspace=``, each root-namespace checkpoint snapshots that directory as
  its superstep left it, in every durability mode: LangGraph's default (``"async"``) saves a
  checkpoint while the next step already runs, so the directory is scanned at the superstep's
  end, on the graph's thread (:meth:`StashpointSaver.get_next_version` says why there), and
  the put stores that scan. A replay's first checkpoint (``source: fork``) is a copy of its
  parent, files included.
  :meth:`StashpointSaver.restore_files` puts back the files of any checkpoint, after a safety
  checkpoint of what is there now (branch ``langgraph-files``): call it before a replay,
  ``graph.invoke(None, past_config)``, since LangGraph starts the replay's first node while it
  saves. With ``restore_on_time_travel=True``, the saves that start a new line from a past
  checkpoint before any node runs (a new input there with ``durability="sync"``,
  ``update_state`` there) first rewind the files to that checkpoint's, on the new branch
  (undoable like any rewind). Reading never touches files.

Reads verify every record and chain link they use and every message against its running
hash, once per saver: the saver keeps the decoded messages of the last conversation logs it
read (logs are append-only), so after a first read ``list`` and ``get_tuple`` decode only
messages added since; the messages a put appends join that view (chained and checked against
the new record's hash), so the ``get_tuple`` that starts the next run does not fetch them
back. Tuples share those message objects (and, within one ``list`` call, the decoded values
common to several checkpoints): treat them as read-only. A ``put`` finds the
messages already stored by content: each message's fields are compared with a copy taken when
it was stored or first read by ``get_tuple`` (one ``list ==`` in C, ~2,200 CPU
instructions a LangChain message: at 2,000 messages, ~3x the rest of a put), so a
node that changes a message in place and returns it (``msg.content = "edited"; return
{"messages": [msg]}``) has the change stored, as LangGraph's own savers do; only the changed
message and those after it are serialized again. (A message changed in place also changes
what earlier tuples of this saver show in this process: they share the object; a new saver
reads what was stored.) ``list`` takes no copies: no put compares with most checkpoints it
returns (a run starts with ``get_tuple``); a message it handed out is copied from its stored
bytes, not from the object, which someone may have changed since. Other channels are
serialized again whenever their version moves, as in LangGraph's own savers.

One process should write a thread at a time (LangGraph's own model): records are protected
by the store's compare-and-set, the pending-writes key by a re-read before each update.

The package, one concern a module: :mod:`.saver` (the class and LangGraph's interface),
:mod:`.records` (a checkpoint's layout in a record, serializing), :mod:`.threads` (the index
of a thread), :mod:`.reading`, :mod:`.writing`, :mod:`.pending` (pending writes),
:mod:`.files` (workspace scans and restores), :mod:`.removing`, :mod:`.async_api` and
:mod:`.framework` (the LangGraph names it uses, imported once).

Needs ``pip install 'stashpoint[langgraph]'``.
"""

from __future__ import annotations

from ...langgraph_format import _pack as _pack  # importable here, as before the split
from .saver import FILES_BRANCH, StashpointSaver

__all__ = ["FILES_BRANCH", "StashpointSaver"]
