"""A replica's scheduler process: leader or standby (`leader.py`).

Every `corral server` replica starts one. It tries the leader lease every `STANDBY_POLL`
seconds; once it holds it, it builds its state from the database and schedules
(`Scheduler.run`) until it is deposed (the lease is lost, a commit is refused by the fence),
then stands by again with nothing kept: a later takeover rebuilds everything from the database.
A database that goes away (PostgreSQL failing over, a network cut) makes it step down and try
again, never exit, so its supervisor never restarts it in a loop.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.exc import SQLAlchemyError

from corral.server.leader import STANDBY_POLL, Holder, Lease, replica_id
from corral.server.scheduler import Scheduler
from corral.store.engine import Engines, make_engines, side_engine

log = logging.getLogger("corral.scheduler")


def standby_message(other: Holder, is_sqlite: bool) -> str:
    """What a standby says about the leader it waits behind."""
    left = max(0.0, other.expires_at - other.now)
    said = (
        f"standby: the scheduler of replica {other.holder} leads (epoch {other.epoch}, lease good for "
        f"{left:.0f} s more); this one schedules nothing and takes over if that lease lapses"
    )
    if is_sqlite:
        said += (
            ". On SQLite the control plane is one machine: a second `corral server` on the same database "
            "does not schedule. Run several replicas on PostgreSQL (docs/runbook.md, High availability)"
        )
    return said


class Replica:
    """Leader or standby, until `stop` is set."""

    def __init__(self, engines: Engines, lease: Lease, policy: str = "default") -> None:
        self.engines, self.lease, self.policy = engines, lease, policy
        self.stop = threading.Event()
        self.scheduler: Scheduler | None = None
        self._said: tuple[str, int] | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.once()
                self.stop.wait(STANDBY_POLL)
        finally:
            self.lease.release()
            self.lease.close()

    def once(self) -> None:
        """One try at the lease; schedules until deposed when it is taken."""
        try:
            if not self.lease.try_acquire():
                self._standby()
                return
            self._said = None
            self.scheduler = Scheduler(self.engines, self.policy, lease=self.lease)
            self.scheduler.stop = self.stop
            try:
                self.scheduler.run()  # returns when deposed (or stopped)
            finally:
                self.scheduler.doorbell.close()
                self.scheduler.api_bell.close()
                self.scheduler = None
        except SQLAlchemyError as exc:  # the database is away: stand by, try again
            what = exc.__class__.__name__
            log.warning("the database did not answer (%s); standing by and trying again", what)
            log.debug("database error", exc_info=True)
        self.lease.step_down("left the scheduling loop")

    def _standby(self) -> None:
        other = self.lease.other
        if other is None:
            return
        key = (other.holder, other.epoch)
        if key != self._said:  # said once per leader, not every poll
            self._said = key
            message = standby_message(other, self.engines.is_sqlite)
            (log.error if self.engines.is_sqlite else log.info)(message)


def main(url: str, policy: str = "default", holder: str | None = None) -> None:
    """Entry point of `corral scheduler` (the server starts it as its own process)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s scheduler %(levelname)s %(message)s")
    engines = make_engines(url)
    lease = Lease(side_engine(url), holder or replica_id())
    Replica(engines, lease, policy).run()
