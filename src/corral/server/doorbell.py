"""Wake-ups between the API and the scheduler: one UDP datagram on loopback, no polling loop.

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

from sqlalchemy import Engine

from corral.server.cluster import get_setting, put_setting


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
