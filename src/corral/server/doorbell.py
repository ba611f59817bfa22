"""Wake-ups between the API and the scheduler: one UDP datagram on loopback, no polling loop
(SQLite: one machine). On PostgreSQL, where replicas run on several machines, LISTEN/NOTIFY
instead (`pg_wake.py`); `doorbell_for` and `bell_for` choose.

Each process binds a datagram socket and publishes its address in the `settings` table
(`doorbell.scheduler`, `doorbell.api`). After a commit that the other side should act on, a
writer rings: a lost datagram costs at most the receiver's fallback timeout (1 s), never
correctness, because the journal in the database is the truth and is read on every wake.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from typing import Protocol

from sqlalchemy import Engine

from corral.server.cluster import get_setting, put_setting
from corral.server.pg_wake import PgBell, PgDoorbell
from corral.store.engine import Engines


class Doorbell:
    """A socket to be woken on, published under `settings[doorbell.<name>]`."""

    def __init__(self, name: str, host: str = "127.0.0.1") -> None:
        self.name = name
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.setblocking(False)
        host, port = self.sock.getsockname()
        self.address = f"{host}:{port}"

    def publish(self, writer: Engine) -> None:
        with writer.begin() as conn:
            put_setting(conn, f"doorbell.{self.name}", self.address)

    def wait(self, timeout: float) -> bool:
        """Block until rung or `timeout`; drains every pending ring. True when rung."""
        ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not ready:
            return False
        with contextlib.suppress(BlockingIOError):
            while True:
                self.sock.recv(64)
        return True

    def close(self) -> None:
        self.sock.close()


class Bell:
    """Rings another process's doorbell, re-reading its address now and then (it moves on restart)."""

    def __init__(self, name: str, reader: Engine) -> None:
        self.name = name
        self.reader = reader
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self._target: tuple[str, int] | None = None
        self._read_at = 0.0

    def ring(self) -> None:
        now = time.monotonic()
        if self._target is None or now - self._read_at > 2.0:
            self._read_at = now
            with self.reader.connect() as conn:
                value = get_setting(conn, f"doorbell.{self.name}")
            if value is not None:
                host, port = value.rsplit(":", 1)
                self._target = (host, int(port))
        if self._target is not None:
            with contextlib.suppress(OSError):
                self.sock.sendto(b"!", self._target)

    def close(self) -> None:
        self.sock.close()


class Waker(Protocol):
    """What a process waits on: `Doorbell`, or `pg_wake.PgDoorbell` on PostgreSQL."""

    address: str

    def publish(self, writer: Engine) -> None: ...
    def wait(self, timeout: float) -> bool: ...
    def close(self) -> None: ...


class Ringer(Protocol):
    def ring(self) -> None: ...
    def close(self) -> None: ...


def doorbell_for(name: str, engines: Engines) -> Waker:
    """The doorbell `name` of this process: a datagram on loopback on SQLite (one machine), a
    PostgreSQL channel on PostgreSQL (any machine of the control plane)."""
    if engines.is_sqlite:
        return Doorbell(name)
    return PgDoorbell(name, engines.url)


def bell_for(names: list[str], engines: Engines) -> Ringer:
    """Rings the doorbells `names`. On SQLite only the first (the other process on this machine);
    on PostgreSQL all of them, on every replica."""
    if engines.is_sqlite:
        return Bell(names[0], engines.reader)
    return PgBell(names, engines.url)
