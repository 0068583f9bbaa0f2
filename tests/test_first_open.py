"""Two processes opening a new store at once: the settings a store records on its first open
(its id, which its heads' MACs are made with) are the first writer's, and every opener uses
the one recorded.

The other process runs at the worst moment: after this one found no setting and before it
records its own (a wrapper around the real backend starts it there, once)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import stashpoint
from stashpoint import metakeys
from stashpoint._store import Store
from stashpoint.errors import EncryptionKeyError
from stashpoint.stores.base import MetadataStore
from stashpoint.stores.forwarding import ForwardingStore
from stashpoint.stores.sqlite import SqliteStore

from .test_postgres import pg_url  # noqa: F401  # the fixture: a fresh schema per test

KEY = bytes(range(32))
"""An integrity key: a keyed store's head MACs are made with its id."""

_OTHER = """
import sys, stashpoint
with stashpoint.open(sys.argv[1], key=bytes(range(32))) as store:
    store.session("other").checkpoint({"by": "the other process"})
"""

OTHER_KEY = bytes(range(1, 33))
"""The other process's encryption key."""

_OTHER_ENCRYPTED = """
import sys, stashpoint
with stashpoint.open(sys.argv[1], encryption_key=bytes(range(1, 33))) as store:
    store.session("other").checkpoint({"by": "the other process"})
"""


class _OtherOpensMeanwhile(ForwardingStore):
    """The real backend; the first write of ``key`` is preceded by another process opening
    the same store and checkpointing in it."""

    def __init__(
        self, inner: MetadataStore, key: str, store: str | Path, code: str = _OTHER
    ) -> None:
        super().__init__(inner)
        self.key, self.store, self.code, self.ran = key, store, code, False

    def _other(self, key: str) -> None:
        if key == self.key and not self.ran:
            self.ran = True
            subprocess.run([sys.executable, "-c", self.code, str(self.store)], check=True)

    def set_meta(self, key: str, value: str | None) -> None:
        self._other(key)
        super().set_meta(key, value)

    def swap_meta(self, key: str, expected: str | None, value: str | None) -> bool:
        self._other(key)
        return super().swap_meta(key, expected, value)


def test_a_store_opened_by_two_processes_at_once_keeps_one_id(tmp_path: Path) -> None:
    home = tmp_path / "store"
    home.mkdir()
    meta = _OtherOpensMeanwhile(SqliteStore(home / "store.db"), metakeys.STORE_ID, home)
    mine = Store(meta, blob_dir=home / "blobs", home=home, key=KEY)
    try:
        assert meta.ran
        mine.session("mine").checkpoint({"by": "this process"})
        mine_id = mine.id
    finally:
        mine.close()
    with stashpoint.open(home, key=KEY) as store:
        assert store.id == mine_id
        # Both processes' heads verify: each signed them with the id the store has.
        assert store.session("other").state() == {"by": "the other process"}
        assert store.session("mine").state() == {"by": "this process"}


def test_an_empty_shared_store_is_encrypted_under_one_key(pg_url: str) -> None:  # noqa: F811
    """A store without local blobs has no lock to hold it alone while it is marked encrypted:
    the second process to mark it replaced the first one's key id, and everything the first
    one had written became unreadable with its own key. The second one is refused instead."""
    from stashpoint.stores.postgres import PostgresStore

    meta = _OtherOpensMeanwhile(
        PostgresStore(pg_url), metakeys.ENCRYPTION, pg_url, _OTHER_ENCRYPTED
    )
    with pytest.raises(EncryptionKeyError, match="wrong key"):
        Store(meta, encryption_key=KEY)
    assert meta.ran
    with stashpoint.open(pg_url, encryption_key=OTHER_KEY) as store:
        assert store.session("other").state() == {"by": "the other process"}
