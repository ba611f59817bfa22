"""Wake-ups across machines on PostgreSQL: LISTEN/NOTIFY (psycopg 3) in place of the UDP doorbell.

The doorbell of `doorbell.py` is a datagram on loopback: it cannot wake a scheduler on another
machine. On PostgreSQL every replica's API rings the channels `corral_scheduler` (the leader's
scheduler, wherever it runs) and `corral_api` (the long polls of every replica) after its
commits, and the scheduler rings `corral_api` after its own. A notification is only a hint, as
a datagram was: the journal and the outbox are read on every wake, and each waiter still polls
at its fallback period, so a notification lost while a listener reconnects costs that period.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import psycopg
from sqlalchemy.engine import make_url

log = logging.getLogger("corral.server")

RECONNECT_S = 1.0
CHANNEL_PREFIX = "corral_"


def conninfo(url: str) -> str:
    """libpq's form of a SQLAlchemy URL (`postgresql+psycopg://...` -> `postgresql://...`)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class PgDoorbell:
    """LISTEN on `corral_<name>` in a thread of its own; `wait` as `doorbell.Doorbell.wait`."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.channel = CHANNEL_PREFIX + name
        self.address = f"postgresql LISTEN {self.channel}"
        self._info = conninfo(url)
        self._rung = threading.Event()
        self._stop = threading.Event()
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self._thread = threading.Thread(target=self._listen, name=f"corral-listen-{name}", daemon=True)
        self._thread.start()

    def publish(self, _writer: object) -> None:
        """Nothing to publish: the channel's name is the address."""

    def wait(self, timeout: float) -> bool:
        rung = self._rung.wait(max(0.0, timeout))
        self._rung.clear()
        return rung

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._info, autocommit=True, connect_timeout=5) as conn:
                    self._conn = conn
                    conn.execute(f"LISTEN {self.channel}")
                    self._rung.set()  # rings may have been missed while not listening: look once
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            self._rung.set()
            except psycopg.Error as exc:
                if not self._stop.is_set():
                    log.warning("listening on %s: %s; again in %.0f s", self.channel, exc, RECONNECT_S)
            finally:
                self._conn = None
            self._stop.wait(RECONNECT_S)

    def close(self) -> None:
        self._stop.set()


class PgBell:
    """NOTIFY `corral_<name>` for each name; `ring()` never blocks (a thread sends, rings coalesce)."""

    def __init__(self, names: list[str], url: str) -> None:
        self.channels = [CHANNEL_PREFIX + n for n in names]
        self._info = conninfo(url)
        self._rung = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, name="corral-notify", daemon=True)
        self._thread.start()

    def ring(self) -> None:
        self._rung.set()

    def close(self) -> None:
        self._stop.set()
        self._rung.set()

    def _send(self) -> None:
        conn: psycopg.Connection[tuple[object, ...]] | None = None
        while True:
            self._rung.wait()
            self._rung.clear()
            if self._stop.is_set():
                if conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        conn.close()
                return
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self._info, autocommit=True, connect_timeout=5)
                conn.execute("; ".join(f"NOTIFY {c}" for c in self.channels))
            except psycopg.Error as exc:  # the receivers' fallback polls cover it
                log.warning("could not notify %s: %s", ", ".join(self.channels), exc)
                if conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        conn.close()
                conn = None
                self._rung.wait(RECONNECT_S)
