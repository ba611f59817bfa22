"""Who uses a database: a lease every server and scheduler process holds for its whole life, so
that an offline operation (`corral admin restore`) refuses to run while any of them does.

SQLite: an OS lock (`flock`) on `<database>.lock` beside the database file, shared by the
processes that use it and taken exclusively by a restore; the kernel drops it when a process
ends, `kill -9` included, so a crash never leaves a stale lock behind. PostgreSQL: a
session-level advisory lock, shared or exclusive in the same way, held on a connection of its
own (the server forgets it when that connection closes).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from corral.core.errors import CorralError

__all__ = ["DatabaseInUse", "Lease", "exclusive", "hold", "lock_path"]

IN_USE_LOCK = 73_010_100  # PostgreSQL advisory lock key: shared by servers, exclusive for a restore


class DatabaseInUse(CorralError):
    """The database is used by a server (for a restore) or being restored (for a server)."""


def lock_path(url: str) -> Path:
    """The lock file of a SQLite database: `corral.db` -> `corral.db.lock`."""
    database = make_url(url).database
    if not database:
        raise ValueError(f"no database file in {url}")
    return Path(database + ".lock")


class Lease:
    """A held lock on a database (a file descriptor, or a PostgreSQL connection); `close()` frees it."""

    def __init__(self, fd: int | None = None, conn: Connection | None = None) -> None:
        self._fd, self._conn = fd, conn

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
        if self._conn is not None:
            engine = self._conn.engine
            self._conn.close()
            engine.dispose()
            self._conn = None


def _take(url: str, shared: bool) -> Lease | None:
    """The lock, or None when someone holds it in a conflicting mode."""
    if url.startswith("sqlite"):
        path = lock_path(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return Lease(fd=fd)
    engine = create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    conn = engine.connect()
    how = "pg_try_advisory_lock_shared" if shared else "pg_try_advisory_lock"
    if not conn.exec_driver_sql(f"SELECT {how}({IN_USE_LOCK})").scalar():
        conn.close()
        engine.dispose()
        return None
    return Lease(conn=conn)


def hold(url: str) -> Lease:
    """The shared lease of a server or scheduler process; DatabaseInUse while a restore runs."""
    lease = _take(url, shared=True)
    if lease is None:
        raise DatabaseInUse(f"the database {_shown(url)} is being restored; start the server when it is done")
    return lease


@contextmanager
def exclusive(url: str) -> Iterator[None]:
    """The database to oneself for an offline operation; DatabaseInUse while a server uses it."""
    lease = _take(url, shared=False)
    if lease is None:
        raise DatabaseInUse(f"the database {_shown(url)} is in use by a running corral server or scheduler")
    try:
        yield
    finally:
        lease.close()


def _shown(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def hold_database(url: str) -> Lease:
    """The process's lease on its database (store/inuse.py); exits with the reason while a restore runs."""
    try:
        return hold(url)
    except DatabaseInUse as exc:
        raise SystemExit(f"corral: {exc}") from None
