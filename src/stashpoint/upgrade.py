"""``stashpoint upgrade``: convert a store from format 1 to the current format.

Format 1 stores open read-only (:mod:`stashpoint.stores.formats`); this is the one step that
writes the new format: every head and label is given its sequence number (and, when the hash
chain is keyed, its MAC under the key given now: trust on first use, as a keyed store's first
keyed open did before), a keyed store its markers, and the format key last. The backend does
it crash-safely (:mod:`stashpoint.stores.migrate`): a ``kill -9`` at any instant leaves a store
that opens as format 1 or 2, and running the upgrade again finishes it.

Before writing anything, each branch head's record is read and checked against its digest
with the key given: a keyed store upgraded without its key (format 1 did not record that it
was keyed) would otherwise get refs signed by nobody, and a damaged one would be blessed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import metakeys
from ._store import Store
from .errors import IntegrityError
from .stores import formats
from .stores.migrate import Plan, Ref, convert, refs_of
from .stores.refauth import parse_seq

__all__ = ["UpgradeReport", "check_upgraded", "upgrade"]


@dataclass
class UpgradeReport:
    url: str
    format_before: int
    format_after: int
    heads: int = 0
    labels: int = 0
    signed: int = 0
    """Refs given an ``auth`` (those an interrupted run gave one already are kept)."""
    keyed: bool = False
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.url,
            "format_before": self.format_before,
            "format_after": self.format_after,
            "heads": self.heads,
            "labels": self.labels,
            "signed": self.signed,
            "keyed": self.keyed,
            "dry_run": self.dry_run,
        }


def upgrade(
    store: Store,
    *,
    dry_run: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> UpgradeReport:
    """Convert ``store`` (opened as usual, with its keys) to the current format.

    A store in the current format is left alone. ``dry_run``: check and count, write nothing.
    ``progress(done, total)`` is called per ref. The ``store`` object still reads the old
    format afterwards: close it and open the store again."""
    signer = store.refs.signer
    report = UpgradeReport(
        store.url, store.format, formats.CURRENT, keyed=signer.keyed, dry_run=dry_run
    )
    if store.format >= formats.CURRENT:
        report.format_after = store.format
        return report
    backend = store.backend
    refs = refs_of(backend)
    report.heads = sum(r.kind == "head" for r in refs)
    report.labels = len(refs) - report.heads
    _check_records(store, refs)

    def sign(ref: Ref) -> str | None:
        if ref.auth is not None and parse_seq(ref.auth) > 0:
            signer.check(ref.kind, ref.session, ref.name, ref.target, ref.auth)
            return None  # given by an interrupted run (checked: IntegrityError if altered)
        return signer.auth(ref.kind, ref.session, ref.name, ref.target, 1)

    if dry_run:
        report.signed = sum(sign(r) is not None for r in refs)
        report.format_after = store.format
        return report
    plan = Plan(sign)
    if backend.get_meta(metakeys.STORE_ID) is None:
        plan.meta.append((metakeys.STORE_ID, store.id))  # the id the MACs were made with
    if signer.keyed:
        from .crypto import integrity_key_id

        assert signer.key is not None
        kid = integrity_key_id(signer.key)
        if store.cipher is None and backend.get_meta(metakeys.INTEGRITY) is None:
            plan.meta.append((metakeys.INTEGRITY, kid))
        plan.meta.append((metakeys.REF_AUTH, signer.marker(kid)))
    report.signed = convert(backend, plan, progress)
    return report


def _check_records(store: Store, refs: list[Ref]) -> None:
    for ref in refs:
        if ref.kind != "head":
            continue
        try:
            store.get(ref.target, check_parent=False)
        except IntegrityError as exc:
            raise IntegrityError(
                f"{exc}; nothing was upgraded. If the store's hash chain is keyed, give its key "
                "(STASHPOINT_INTEGRITY_KEY or STASHPOINT_INTEGRITY_KEY_FILE, or key=); "
                "otherwise see `stashpoint verify`",
                checkpoint=ref.target,
            ) from exc


def check_upgraded(store: Store) -> int:
    """Read every head and label of an upgraded store through the authenticated ref layer
    (IntegrityError if one fails its MAC); the number of refs read."""
    if store.format < formats.CURRENT:
        raise IntegrityError(f"store {store.url} still opens as format {store.format}")
    n = 0
    for session in store.meta.sessions():
        n += len(store.refs.branches(session)) + len(store.refs.labels(session))
    return n
