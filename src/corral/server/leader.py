"""The scheduler's leader lease: exactly one scheduler decides at a time, among any number of
`corral server` replicas on one database.

One row (`leader`, id 1) says who holds the lease (`holder`: the replica's id), under which
`epoch`, and until when (`expires_at`, on the database's clock, so the replicas' clocks never
have to agree). Every scheduler process of every replica runs `Lease`:

- **acquire** (a short transaction of its own, every `STANDBY_POLL` s while standby): when the
  row is missing, expired, or held by this same replica (its previous scheduler process died),
  take it with `epoch + 1`. On PostgreSQL a takeover first takes the journal's advisory lock,
  which every writer transaction holds from its start (`store/engine.py`): so a takeover
  never falls between a scheduler commit's fence check and its commit.
- **renew** (every `RENEW_EVERY` s while leader, in its own thread): `expires_at = now + LEASE`
  where holder and epoch are still ours; a renewal that finds another epoch means deposed.
- **fence** (`Lease.fence`, called at the start of every transaction the scheduler writes
  decisions in): the row's epoch must still be ours, read in that same transaction (under the
  journal's lock, or SQLite's write lock); otherwise `Deposed` is raised, the transaction rolls
  back and nothing of it lands. It also refuses, before touching the row, when the lease is
  past its local deadline: a leader that could not renew stops deciding by itself, `MARGIN` s
  before the database would let another take over, whatever its clock says of the database's.

The local deadline is measured on the monotonic clock from the *start* of the last renewal
that succeeded: the database set the expiry to its own `now + LEASE` at some moment after
that start, so `start + LEASE - MARGIN` is always before the expiry the others see.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, text, update

from corral.server import metrics
from corral.store import schema
from corral.store.engine import JOURNAL_LOCK

log = logging.getLogger("corral.scheduler")

LEASE = 10.0  # seconds a renewal is good for (on the database's clock)
RENEW_EVERY = 2.5  # seconds between renewals: four chances per lease
MARGIN = 3.0  # the leader stops deciding this long before the lease it last got ends
STANDBY_POLL = 2.0  # seconds between a standby's tries (takeover within LEASE + this of a death)


class Deposed(Exception):
    """This scheduler no longer holds the lease: what it was about to write is not written."""


@dataclass(frozen=True)
class Holder:
    """The lease row as read."""

    holder: str
    epoch: int
    expires_at: float
    since: float
    now: float  # the database's clock when read

    @property
    def live(self) -> bool:
        return self.expires_at > self.now


def replica_id(data_dir: str = "") -> str:
    """A replica's name in the lease: its host and data directory, the same across restarts, so a
    replica restarted after a crash takes its own lease back at once (the fence refuses anything
    its previous process might still try); random when there is no data directory."""
    where = data_dir or f"pid {os.getpid()}:{secrets.token_hex(3)}"
    return f"{socket.gethostname()}:{where}"


def db_now(conn: Connection) -> float:
    """The database's clock (Unix seconds); SQLite's is this machine's, which is the same thing."""
    if conn.dialect.name == "sqlite":
        return time.time()
    return float(conn.execute(text("SELECT extract(epoch from clock_timestamp())")).scalar_one())


def read_holder(conn: Connection) -> Holder | None:
    lead = schema.leader
    row = conn.execute(
        select(lead.c.holder, lead.c.epoch, lead.c.expires_at, lead.c.since).where(lead.c.id == 1)
    ).first()
    if row is None:
        return None
    return Holder(row.holder, row.epoch, row.expires_at, row.since, db_now(conn))


class Lease:
    """This scheduler process's side of the lease (see the module's text)."""

    def __init__(self, engine: Engine, holder: str, lease: float = LEASE, margin: float = MARGIN) -> None:
        self.engine = engine
        self.holder = holder
        self.lease, self.margin = lease, margin
        self.epoch = 0  # the epoch this process holds (0: none)
        self.deadline = 0.0  # monotonic time after which this process decides nothing
        self.other: Holder | None = None  # who held it at the last failed try
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    # ---- standby ----------------------------------------------------------------------------
    def try_acquire(self) -> bool:
        """Take the lease if nobody live holds it (or only this replica's dead process): True when taken."""
        started = time.monotonic()
        with self.engine.begin() as conn:
            if conn.dialect.name != "sqlite":  # no scheduler commit is between its fence and its commit
                conn.execute(text(f"SELECT pg_advisory_xact_lock({JOURNAL_LOCK})"))
            found = read_holder(conn)
            now = db_now(conn)
            if found is not None and found.live and found.holder != self.holder:
                self.other = found
                return False
            lead = schema.leader
            epoch = 1 if found is None else found.epoch + 1
            values: dict[str, Any] = {
                "holder": self.holder,
                "epoch": epoch,
                "expires_at": now + self.lease,
                "since": now,
            }
            if found is None:
                conn.execute(insert(lead).values(id=1, **values))
            else:
                conn.execute(update(lead).where(lead.c.id == 1, lead.c.epoch == found.epoch).values(**values))
        with self._lock:
            self.epoch = epoch
            self.deadline = started + self.lease - self.margin
        self.other = None
        metrics.LEADER_TAKEOVERS.inc()
        log.warning("leader lease taken: epoch %d (holder %s)", epoch, self.holder)
        self._stop = threading.Event()  # this epoch's: the thread of an earlier one keeps its own, set
        self._renewer = threading.Thread(
            target=self._renew_loop, args=(epoch, self._stop), name="corral-lease", daemon=True
        )
        self._renewer.start()
        return True

    # ---- leader -----------------------------------------------------------------------------
    def valid(self) -> bool:
        """This process may decide: it holds an epoch and its local deadline has not passed."""
        return self.epoch > 0 and time.monotonic() < self.deadline

    def renew(self) -> bool:
        """Extend the lease; False when it is no longer ours (deposed)."""
        epoch = self.epoch
        if epoch == 0:
            return False
        started = time.monotonic()
        lead = schema.leader
        with self.engine.begin() as conn:
            now = db_now(conn)
            changed = conn.execute(
                update(lead)
                .where(lead.c.id == 1, lead.c.holder == self.holder, lead.c.epoch == epoch)
                .values(expires_at=now + self.lease)
            ).rowcount
        if changed != 1:
            self.step_down(f"the lease's epoch is no longer {epoch}", epoch)
            return False
        with self._lock:
            if self.epoch == epoch:
                self.deadline = started + self.lease - self.margin
        metrics.LEASE_RENEWALS.inc()
        return True

    def _renew_loop(self, epoch: int, stop: threading.Event) -> None:
        """Renew `epoch` until `stop` (this epoch's own event: a later epoch has its own thread)."""
        while not stop.wait(RENEW_EVERY) and self.epoch == epoch:
            try:
                if not self.renew():
                    return
            except Exception as exc:  # the database is away: keep trying until the deadline
                metrics.LEASE_RENEW_FAILURES.inc()
                log.warning("could not renew the leader lease: %s", exc)
            if not self.valid():
                self.step_down("the lease could not be renewed in time", epoch)
                return

    def fence(self, conn: Connection) -> None:
        """In a transaction about to write decisions: raise `Deposed` unless the lease is still ours."""
        epoch = self.epoch
        if not self.valid():
            self._refused(f"the lease (epoch {epoch}) was not renewed in time", epoch)
        lead = schema.leader
        found = conn.execute(select(lead.c.epoch, lead.c.holder).where(lead.c.id == 1)).first()
        if found is None or found.epoch != epoch or found.holder != self.holder:
            newer = found.epoch if found is not None else 0
            self._refused(f"epoch {newer} replaced epoch {epoch}", epoch)

    def _refused(self, why: str, epoch: int) -> None:
        metrics.STALE_COMMITS_REFUSED.inc()
        self.step_down(why, epoch)
        raise Deposed(why)

    def step_down(self, why: str, epoch: int | None = None) -> None:
        """Decide nothing more (under `epoch` only, when given: a later one of this process stays)."""
        with self._lock:
            if self.epoch == 0 or (epoch is not None and epoch != self.epoch):
                return
            log.error("stepping down as leader (epoch %d): %s", self.epoch, why)
            self.epoch = 0
            self.deadline = 0.0
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        self.engine.dispose()

    def release(self) -> None:
        """On a clean stop: end the lease now, so that a standby takes over at its next try."""
        epoch = self.epoch
        self.step_down("stopping")
        if epoch == 0:
            return
        lead = schema.leader
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    update(lead)
                    .where(lead.c.id == 1, lead.c.holder == self.holder, lead.c.epoch == epoch)
                    .values(expires_at=0.0)
                )
        except Exception as exc:  # it ends by itself
            log.warning("could not release the leader lease: %s", exc)


def role(conn: Connection, replica: str) -> dict[str, Any]:
    """What `/healthz` says of the scheduler: this replica's role, the epoch, who leads."""
    found = read_holder(conn)
    if not replica:
        said = "none"  # this replica runs no scheduler (`--no-scheduler`)
    elif found is not None and found.live and found.holder == replica:
        said = "leader"
    else:
        said = "standby"
    out: dict[str, Any] = {"scheduler": said, "epoch": found.epoch if found is not None else 0}
    out["leader"] = found.holder if found is not None and found.live else None
    return out
