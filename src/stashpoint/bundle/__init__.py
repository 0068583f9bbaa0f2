"""Portable bundles: a session, or one checkpoint with its ancestry, as one file.

Why a framed format of our own and not a tar: a bundle is never extracted to disk. It is read
entry by entry with bounded sizes, every byte is checked against a digest, and only then is
anything written - into a store, through the interfaces a checkpoint uses. Container entries are
named by digest or id, so ``../x``, absolute paths, links, hard links and device files have no
meaning there; the names that *could* do harm live in workspace tree objects, and every name of
every tree is checked (unsafe, duplicate, case-fold or Unicode-normalisation collisions, ``.git``)
before the import writes a byte.

A single-checkpoint bundle carries the records of all its ancestors *and their contents*: every
record in a store is verified with its contents (``stashpoint verify``), so a record imported
without them would read as damage. Content-addressing keeps this small when history is
incremental (measured in ``bench/bench_bundle.py``).

Cheap checks come first, because a hostile bundle's cost is in what it declares: reading
checks every entry's declared size and count against :class:`Limits`, decodes and verifies the
small entries (manifest, records, logs, trees, chunk lists: bounded by ``max_meta``), then
checks names, references (an object nothing refers to is refused here) and what each
checkpoint would restore - all before a blob is decompressed. Blobs are then decompressed and
hashed 1 MiB at a time, so memory never follows a declared size.

Errors: :class:`IntegrityError` (exit 2) when a digest, a declared size or count, the framing or
a reference does not match - the file is damaged or forged; :class:`UsageError` (exit 1) when an
intact bundle asks for something refused: unsafe names or kinds, collisions, duplicate or
unreferenced entries, limits (decompression bombs), ids that exist here with other contents,
branches whose history diverged (import those with ``as_session``), another HMAC key.

The package, bottom to top: :mod:`.format` (the container and the records in it, and that
layout), :mod:`.limits` (what a bundle may cost), :mod:`.check` (what can be checked without
the target store), :mod:`.read` (a file read and checked whole), :mod:`.export` and
:mod:`.importing` (into a store, resumably). Every name is importable from here.
"""

from __future__ import annotations

# Names outside __all__ that callers import from here (as they did before the package was
# split); ``X as X`` marks each as re-exported for mypy.
from .check import log_refs as log_refs
from .check import parse_tree as parse_tree
from .export import ExportReport, export_bundle
from .export import _Exporter as _Exporter
from .format import BLOB as BLOB
from .format import CHUNKS as CHUNKS
from .format import END as END
from .format import FORMAT as FORMAT
from .format import LOG as LOG
from .format import (
    MAGIC,
    VERSION,
    BundleWriter,
    LogEntry,
    Manifest,
    RawEntry,
    RecordEntry,
    iter_entries,
)
from .format import MANIFEST as MANIFEST
from .format import RAW as RAW
from .format import RECORD as RECORD
from .format import TREE as TREE
from .format import ZSTD as ZSTD
from .format import decode_payload as decode_payload
from .format import iter_content as iter_content
from .format import manifest_keyed as manifest_keyed
from .importing import KILL_ENV as KILL_ENV
from .importing import Clash, ImportReport, import_bundle
from .importing import _PendingImport as _PendingImport
from .importing import kill_point as kill_point
from .limits import TRUSTED as TRUSTED
from .limits import Limits
from .read import Bundle, read_bundle
from .read import BundleSource as BundleSource
from .read import read_bundle_from as read_bundle_from

__all__ = [
    "MAGIC",
    "VERSION",
    "Bundle",
    "BundleWriter",
    "Clash",
    "ExportReport",
    "ImportReport",
    "Limits",
    "LogEntry",
    "Manifest",
    "RawEntry",
    "RecordEntry",
    "export_bundle",
    "import_bundle",
    "iter_entries",
    "read_bundle",
]
