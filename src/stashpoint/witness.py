"""The rollback witness: the newest state of each branch this user has seen, kept outside the
store.

Every record in a store can be genuine and every ref MAC valid, and the store still be *old*:
an attacker (or a careless restore) can put back an earlier copy of the whole store, or drop
its newest checkpoints and move the heads back with the rows they had then. Nothing inside the
store can tell; something outside it can. Each head carries a sequence number that grows with
every move (:mod:`stashpoint.stores.refauth`); the witness remembers, per store id, the
highest sequence number (and its head, and the head's record digest when known) this user has
seen for each branch, in ``$STASHPOINT_WITNESS_DIR`` or
``$XDG_STATE_HOME/stashpoint/witness/<store id>.json`` (default ``~/.local/state/…``). It is
updated when a store opened with :func:`stashpoint.open` closes, and MAC'd with the store's
key when there is one.

Reading a head older than the witness is :class:`~stashpoint.errors.RollbackError` ("store
rolled back from seq N to M"), unless the user accepts it (``accept_rollback=True``, CLI
``--accept-rollback``, or ``STASHPOINT_ACCEPT_ROLLBACK=1``): the witness then follows the
store back. The same sequence number with another head is damage (a forged or forked tip),
never lag. A witness records a keyed store as keyed: opening it later without its key is
refused. ``STASHPOINT_WITNESS=off`` disables the witness.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import IntegrityError, MirrorWarning, RollbackError, StoreError

if TYPE_CHECKING:
    from .stores.refauth import AuthenticatedRefs, Observer

__all__ = ["ACCEPT_ENV", "DIR_ENV", "Lag", "MirrorWitness", "Witness", "witness_dir"]

DIR_ENV = "STASHPOINT_WITNESS_DIR"
ACCEPT_ENV = "STASHPOINT_ACCEPT_ROLLBACK"
OFF_ENV = "STASHPOINT_WITNESS"
_DOMAIN = b"stashpoint-witness-v1\0"


def witness_dir() -> Path | None:
    """Where witnesses live (None: disabled by ``STASHPOINT_WITNESS=off``)."""
    if os.environ.get(OFF_ENV, "").lower() in ("off", "0", "no", "false"):
        return None
    explicit = os.environ.get(DIR_ENV)
    if explicit:
        return Path(explicit)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "stashpoint" / "witness"


def accept_from_env() -> bool:
    return os.environ.get(ACCEPT_ENV, "").lower() in ("1", "yes", "true", "on")


class Lag(NamedTuple):
    """One branch whose head in the store differs from what the witness saw."""

    session: str
    branch: str
    seen_seq: int
    seen_head: str
    seq: int | None
    """The store's sequence number now (None: the branch is gone)."""
    head: str | None
    rolled_back: bool
    """True: older than the witness (rollback); False: same sequence, another head (damage)."""

    @property
    def message(self) -> str:
        return self.text()

    def text(self, mirror: str | None = None) -> str:
        """What happened, as this user's witness saw it, or as the mirror at ``mirror`` has it."""
        where = f"branch {self.branch!r} of session {self.session!r}"
        saw, when = (
            ("this user saw", "when this user last saw it")
            if mirror is None
            else ("the mirror has", f"in the mirror {mirror}")
        )
        if not self.rolled_back:
            return (
                f"{where} is at sequence {self.seq} with head {self.head}, but {saw} "
                f"head {self.seen_head} at that sequence: a forged or forked tip"
            )
        if self.seq is None:
            return (
                f"store rolled back from seq {self.seen_seq}: {where} (head {self.seen_head} "
                f"{when}) is gone"
            )
        return (
            f"store rolled back from seq {self.seen_seq} to {self.seq}: {where} was at head "
            f"{self.seen_head} {when}, and is at {self.head} now"
        )

    def judge(self, accept: bool, mirror: str | None = None) -> None:
        """Raise for a forged or forked tip (always) and for a rollback (unless accepted)."""
        if not self.rolled_back:
            raise IntegrityError(self.text(mirror), checkpoint=self.head)
        if not accept:
            raise RollbackError(
                f"{self.text(mirror)}; if you restored this store on purpose, accept it with "
                f"--accept-rollback (or {ACCEPT_ENV}=1)",
                seen=self.seen_seq,
                now=self.seq,
            )


class Witness:
    """One store's witness file: checked as heads are read, updated when the store closes."""

    def __init__(
        self, store_id: str, key: bytes | None, directory: Path, *, accept: bool = False
    ) -> None:
        self.store_id = store_id
        self.key = key
        self.path = directory / f"{store_id}.json"
        self.accept = accept
        self.accepted: list[Lag] = []
        """Rollbacks accepted while this store was open (the witness follows them back)."""
        self.heads: dict[tuple[str, str], tuple[int, str, str | None]] = {}
        """(session, branch) -> (seq, head, record digest or None) as last seen."""
        self.keyed = False
        self._load()
        if self.keyed and key is None:
            raise IntegrityError(
                f"store {store_id} was keyed when this user last opened it, and is opened "
                "without a key now: its integrity markers were removed, or the key is missing "
                f"(witness {self.path})"
            )

    def _mac(self, body: dict[str, Any]) -> str:
        assert self.key is not None
        data = _DOMAIN + json.dumps(body, sort_keys=True).encode()
        return hmac.new(self.key, data, hashlib.sha256).hexdigest()

    def _load(self) -> None:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise IntegrityError(f"the rollback witness {self.path} is unreadable: {exc}") from None
        body = {k: v for k, v in raw.items() if k != "mac"}
        self.keyed = bool(raw.get("keyed"))
        if (
            self.keyed
            and self.key is not None
            and not hmac.compare_digest(str(raw.get("mac", "")), self._mac(body))
        ):
            raise IntegrityError(
                f"the rollback witness {self.path} does not match its MAC under this "
                "store's key: it was altered (delete it to start over)"
            )
        for name, (seq, head, digest) in raw.get("heads", {}).items():
            session, _, branch = name.partition("\n")
            self.heads[(session, branch)] = (int(seq), str(head), digest)

    # -- checks -----------------------------------------------------------------------------
    def lag(self, session: str, branch: str, head: str | None, seq: int | None) -> Lag | None:
        seen = self.heads.get((session, branch))
        if seen is None:
            return None
        if seq is None or seq < seen[0]:
            return Lag(session, branch, seen[0], seen[1], seq, head, rolled_back=True)
        if seq == seen[0] and head != seen[1]:
            return Lag(session, branch, seen[0], seen[1], seq, head, rolled_back=False)
        return None

    def observe(self, session: str, branch: str, head: str, seq: int) -> None:
        """A head was read: refuse one older than the witness (unless accepted)."""
        lag = self.lag(session, branch, head, seq)
        if lag is None:
            return
        lag.judge(self.accept)
        self.accepted.append(lag)
        self.heads[(session, branch)] = (seq, head, None)

    def observe_session(self, session: str, branches: set[str]) -> None:
        """All branches of a session were read: one the witness saw must not be gone."""
        for s, b in list(self.heads):
            if s == session and b not in branches:
                lag = self.lag(s, b, None, None)
                assert lag is not None
                if not self.accept:
                    raise RollbackError(
                        f"{lag.message}; accept it with --accept-rollback (or {ACCEPT_ENV}=1)",
                        seen=lag.seen_seq,
                        now=None,
                    )
                self.accepted.append(lag)
                del self.heads[(s, b)]

    # -- saving -----------------------------------------------------------------------------
    def save(
        self,
        seen: dict[tuple[str, str], tuple[str, int]],
        digests: dict[tuple[str, str], str],
    ) -> None:
        """Merge what this store object saw (never moving a branch back, unless accepted)."""
        changed = bool(self.accepted) or (self.key is not None and not self.keyed)
        for ref, (head, seq) in seen.items():
            if seq <= 0:
                continue
            old = self.heads.get(ref)
            if old is None or seq > old[0]:
                self.heads[ref] = (seq, head, digests.get(ref))
                changed = True
            elif seq == old[0] and old[2] is None and ref in digests:
                self.heads[ref] = (seq, head, digests[ref])
                changed = True
        if not changed:
            return
        body: dict[str, Any] = {
            "store": self.store_id,
            "keyed": self.key is not None,
            "heads": {f"{s}\n{b}": list(v) for (s, b), v in sorted(self.heads.items())},
        }
        if self.key is not None:
            body["mac"] = self._mac(body)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                json.dump(body, f, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


class MirrorWitness:
    """A mirror store as a second witness of the primary's heads (chained to ``then``, the
    local witness, if any).

    A mirror copies each head with the primary's own sequence number, after the primary has
    it. So the mirror is never legitimately *ahead* of the primary: a primary head whose
    sequence number is below the mirror's is a primary that went back in time (restored from
    an older copy, its newest rows dropped), and the same sequence number with another head is
    a forged or forked tip. A primary ahead of its mirror is lag: the mirror catches up on a
    later write. Unlike the local witness this one needs no earlier visit by this user: any
    machine that opens the store with its mirror sees it.

    A head read here races with writers: between our read of the primary and our read of the
    mirror, another process may move the primary and copy the move. So a mirror that looks
    ahead is compared with the primary read again, after it: a writer copies to the mirror
    only what the primary already has, so a genuine primary has caught up by then.
    """

    def __init__(
        self,
        primary: AuthenticatedRefs,
        mirror: AuthenticatedRefs,
        label: str,
        then: Observer | None,
        *,
        accept: bool = False,
    ) -> None:
        self.primary = primary
        self.mirror = mirror
        self.label = label
        self.then = then
        self.accept = accept
        self.accepted: list[Lag] = []

    def lag(self, session: str, branch: str, head: str, seq: int) -> Lag | None:
        """How the primary's head (``head`` at ``seq``) compares with the mirror's: None when
        it is the mirror's or ahead of it (or there is nothing to compare)."""
        for _attempt in range(2):
            try:
                theirs = self.mirror.head_seq(session, branch)
            except (StoreError, IntegrityError) as exc:
                warnings.warn(
                    f"the mirror {self.label} cannot witness branch {branch!r} of session "
                    f"{session!r}: {exc}",
                    MirrorWarning,
                    stacklevel=4,
                )
                return None
            if theirs is None or theirs[1] <= 0 or seq <= 0:
                return None  # not copied yet, or refs from before sequence numbers
            if seq > theirs[1] or (seq == theirs[1] and head == theirs[0]):
                return None
            again = self.primary.head_seq(session, branch)  # moved on meanwhile?
            if again is None:
                return Lag(session, branch, theirs[1], theirs[0], None, None, rolled_back=True)
            if (again[1], again[0]) == (seq, head):
                return Lag(session, branch, theirs[1], theirs[0], seq, head, seq < theirs[1])
            head, seq = again
        return None

    def observe(self, session: str, branch: str, head: str, seq: int) -> None:
        if self.then is not None:
            self.then.observe(session, branch, head, seq)
        lag = self.lag(session, branch, head, seq)
        if lag is None:
            return
        lag.judge(self.accept, self.label)
        self.accepted.append(lag)

    def observe_session(self, session: str, branches: set[str]) -> None:
        # A branch the mirror has and the primary lacks is a deletion not copied yet, or a
        # rollback: only ``verify --mirror`` tells them apart (it reports both).
        if self.then is not None:
            self.then.observe_session(session, branches)
