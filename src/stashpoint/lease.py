"""Leases: one worker owns a session at a time, across processes and machines.

A worker acquires the session's lease for ``ttl`` seconds and a thread renews it every
``ttl / 3``. Each acquisition after an expiry gets a larger *fencing token*; every write the
worker makes carries its token and the store checks it in the write's own transaction, so a
worker that stalled past its lease (a GC pause, a frozen VM, a network partition) and was taken
over cannot write again, however late its commit arrives. Writes without a token are refused
while someone holds a live lease. Expiry is judged by the store's clock (PostgreSQL, Redis), so
workers' clocks need not agree.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
import weakref
from typing import TYPE_CHECKING

from .errors import LeaseHeld, LeaseLost, StoreError, UsageError
from .stores.base import Fence, LeaseInfo, lease_held

if TYPE_CHECKING:
    from .session import Session
    from .stores.base import Leases

__all__ = ["DEFAULT_TTL", "Lease", "LeaseHolder", "acquire", "for_session"]

DEFAULT_TTL = 30.0


def default_owner() -> str:
    """``host:pid:nonce``: what an operator needs to find the worker that holds a session.
    The nonce makes each acquisition its own owner, so two leases taken in one process (two
    threads, a web server) or by two containers with the same host name and pid exclude each
    other instead of sharing one token."""
    import socket  # here: a session imports this module, and most never take a lease

    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """A held lease; renewed in the background until :meth:`release` (or ``with`` ends)."""

    def __init__(
        self,
        meta: Leases,
        info: LeaseInfo,
        ttl: float,
        *,
        renew: bool = True,
        asked: float | None = None,
    ) -> None:
        self.meta = meta
        self.session = info.session
        self.owner = info.owner
        self.token = info.token
        self.ttl = ttl
        self.fence = Fence(info.session, info.token)
        self._lost: str | None = None
        self._stop = threading.Event()
        self._renewed = time.monotonic() if asked is None else asked
        """When the last acquisition or renewal that succeeded was *sent*: the store's expiry
        (its clock, at or after that moment, plus ttl) cannot come sooner than ttl after it."""
        self._thread: threading.Thread | None = None
        _LIVE.add(self)
        if renew:
            self._thread = threading.Thread(
                target=self._renew_loop, name=f"stashpoint-lease-{self.session}", daemon=True
            )
            self._thread.start()

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless this worker still holds the lease.

        For what the store cannot fence in the write's own transaction: a step body, a side
        effect, a label. Within ttl of the last renewal that succeeded no other worker can
        hold it, so that needs no round trip; past it (a renewal thread that stalled, or
        none), the lease is renewed now, which asks the store."""
        if self._lost is not None:
            raise LeaseLost(self._lost)
        if time.monotonic() - self._renewed >= self.ttl:
            self.renew()

    def mark_lost(self, reason: str) -> None:
        """The store refused a write of ours: every later :meth:`check` refuses too."""
        if self._lost is None:
            self._lost = reason

    def renew(self) -> None:
        """Extend the lease now; :class:`LeaseLost` if another worker took it over."""
        asked = time.monotonic()
        if not self.meta.renew_lease(self.fence, self.ttl):
            self._lost = (
                f"the lease on session {self.session!r} (token {self.token}) was taken over by "
                "another worker after it expired"
            )
            raise LeaseLost(self._lost)
        self._renewed = asked

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except LeaseLost:
                return
            except StoreError:
                if time.monotonic() - self._renewed > self.ttl:
                    self._lost = (
                        f"could not renew the lease on session {self.session!r} for longer "
                        "than its ttl (store unreachable)"
                    )
                    return

    def release(self) -> None:
        """Stop renewing and give the lease up (a no-op if it was lost)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._lost is None:
            try:
                self.meta.release_lease(self.fence)
            except StoreError:
                pass  # it expires by itself
            self._lost = f"the lease on session {self.session!r} was released"

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Lease(session={self.session!r}, owner={self.owner!r}, token={self.token})"


def acquire(
    meta: Leases,
    session: str,
    *,
    ttl: float = DEFAULT_TTL,
    owner: str | None = None,
    wait: float = 0.0,
    renew: bool = True,
) -> Lease:
    """Take the session's lease; with ``wait`` keep trying that long (until the holder releases
    it or it expires) before raising :class:`LeaseHeld`."""
    if ttl <= 0:
        raise UsageError("a lease's ttl must be positive")
    owner = owner or default_owner()
    deadline = time.monotonic() + wait
    while True:
        try:
            asked = time.monotonic()
            info = meta.acquire_lease(session, owner, ttl)
            return Lease(meta, info, ttl, renew=renew, asked=asked)
        except LeaseHeld as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            pause = min(left, max(0.01, exc.expires_in), 1.0) * random.uniform(0.5, 1.0)
            time.sleep(pause)


_LIVE: weakref.WeakSet[Lease] = weakref.WeakSet()


def _forget_in_child() -> None:
    """A forked child does not hold its parent's leases: its writes would carry the parent's
    token and its release would free the parent's session. It has to take its own."""
    for lease in list(_LIVE):
        lease._lost = (
            f"the lease on session {lease.session!r} belongs to the parent process (pid "
            f"{os.getppid()}); a forked child takes its own"
        )
        lease._thread = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


# -- a session holding a lease ------------------------------------------------------------
def for_session(
    meta: Leases, name: str, lease: Lease | bool | float | None
) -> tuple[Lease | None, bool]:
    """The lease a session opened with ``lease=`` holds, and whether it took it (then it
    releases it on close): a :class:`Lease` given (it must cover that session), one taken
    now (``True``: the default ttl; a number: that ttl), or none."""
    if isinstance(lease, Lease):
        if lease.session != name:
            raise UsageError(f"that lease covers session {lease.session!r}, not {name!r}")
        return lease, False
    if lease is None or lease is False:
        return None, False
    ttl = DEFAULT_TTL if lease is True else float(lease)
    return acquire(meta, name, ttl=ttl), True


def check_may_write(self: Session) -> None:
    """Refuse to start work the store would refuse to record: with a lease, one that was
    lost (:class:`LeaseLost`); without one, while another worker holds a live lease on the
    session (:class:`LeaseHeld`). Called before a durable run starts (so no step body or
    side effect runs outside the lease) and before writes the store does not fence
    itself (labels, run records)."""
    if self.lease is not None:
        self.lease.check()
        return
    info = self.store.meta.lease_info(self.name)
    if info is not None and info.expires_in > 0:
        raise lease_held(self.name, info.owner, info.expires_in)


def close(self: Session) -> None:
    """Release the lease this session took (if any); the session is unusable for writes
    after that. Sessions without a lease hold nothing that needs closing."""
    if self.lease is not None and self._owns_lease:
        self.lease.release()


def __enter__(self: Session) -> Session:
    return self


def __exit__(self: Session, *exc: object) -> None:
    self.close()


class LeaseHolder:
    """The methods above, as :class:`~stashpoint.Session` has them."""

    check_may_write = check_may_write
    close = close
    __enter__ = __enter__
    __exit__ = __exit__
