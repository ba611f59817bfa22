"""Engines for SQLite and PostgreSQL, the migrations, and the journal append both writers share.

SQLite (DESIGN.md 6.4): WAL, `synchronous=NORMAL` (an acknowledged commit survives `kill -9`
of any process; `--durability full` also survives power loss), foreign keys, a busy timeout,
and `BEGIN IMMEDIATE` for every write transaction so writers queue for the lock up front
instead of failing on upgrade. Reads use a separate pool with deferred transactions.
PostgreSQL: read committed; every transaction on the writer engine takes a transaction-scoped
advisory lock first, so writers serialise as on SQLite: `events.seq` order is commit order (a
reader tailing by `seq` never skips a late commit), and no writer can hold row locks while it
waits for the journal's lock (two writers doing so in opposite orders deadlocked).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event

JOURNAL_LOCK = 73_010_001  # pg_advisory_xact_lock key for journal appends
BUSY_TIMEOUT_MS = 30_000
WRITER_IDLE_MS = 5_000  # PostgreSQL ends a writer session idle inside a transaction this long
READER_IDLE_MS = 120_000  # a reader's (the scheduler's snapshot of a big cluster takes seconds)
PG_CONNECT_TIMEOUT_S = 5


@dataclass(frozen=True)
class Engines:
    """One writer engine (a single connection) and one reader engine, on the same database."""

    url: str
    writer: Engine
    reader: Engine

    @property
    def is_sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    def dispose(self) -> None:
        self.writer.dispose()
        self.reader.dispose()


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def make_engines(url: str, durability: str = "normal") -> Engines:
    """Engines for `url` (`sqlite:///PATH` or `postgresql+psycopg://...`), schema not touched."""
    if url.startswith("sqlite"):
        if url in ("sqlite://", "sqlite:///:memory:"):
            raise ValueError("an in-memory SQLite database cannot be shared; give a file path")
        sync = {"normal": "NORMAL", "full": "FULL"}[durability]
        keep_private(url)
        writer = create_engine(url, pool_size=1, max_overflow=0)
        reader = create_engine(url, pool_size=8, max_overflow=8)
        for engine, immediate in ((writer, True), (reader, False)):
            _sqlite_hooks(engine, sync, immediate)
        return Engines(url, writer, reader)
    if url.startswith("postgresql"):
        # a writer cut off mid-transaction holds the journal's lock (every writer's, on every
        # replica) until the server ends its session: at most WRITER_IDLE_MS after its last word
        writer = create_engine(
            url, pool_size=2, max_overflow=2, pool_pre_ping=True, connect_args=_pg_args(WRITER_IDLE_MS)
        )
        reader = create_engine(
            url, pool_size=8, max_overflow=8, pool_pre_ping=True, connect_args=_pg_args(READER_IDLE_MS)
        )

        @event.listens_for(writer, "begin")
        def _journal_lock_first(conn: Connection) -> None:
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({JOURNAL_LOCK})")

        return Engines(url, writer, reader)
    raise ValueError(
        f"unsupported database URL {url.split(':', 1)[0]!r}: use sqlite:///PATH or postgresql+psycopg://..."
    )


def _pg_args(idle_ms: int) -> dict[str, Any]:
    return {
        "connect_timeout": PG_CONNECT_TIMEOUT_S,
        "options": f"-c idle_in_transaction_session_timeout={idle_ms}",
    }


def side_engine(url: str, timeout_s: int = 3) -> Engine:
    """A small engine of its own (the leader lease, `server/leader.py`): short transactions that
    must not wait behind the writer's connection, nor hang on a database that went away."""
    if url.startswith("sqlite"):
        engine = create_engine(url, pool_size=1, max_overflow=1)
        _sqlite_hooks(engine, "NORMAL", True)
        return engine
    options = f"-c statement_timeout={timeout_s * 1000} -c idle_in_transaction_session_timeout=5000"
    return create_engine(
        url,
        pool_size=1,
        max_overflow=1,
        pool_pre_ping=True,
        connect_args={"connect_timeout": timeout_s, "options": options},
    )


def keep_private(url: str) -> None:
    """A SQLite database and its `-wal` and `-shm` files readable by this process's user only
    (0600; SQLite gives the journal files the database file's mode): made so when new, narrowed
    when an older version left them 0644 (DESIGN.md 6.6)."""
    path = Path(url.split(":///", 1)[1].split("?", 1)[0])
    if not path.parent.is_dir():
        return  # SQLite says what is wrong with the path
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for each in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(OSError):
            if os.stat(each).st_uid == os.geteuid():
                os.chmod(each, 0o600)


def _sqlite_hooks(engine: Engine, synchronous: str, immediate: bool) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def upgrade(engines: Engines) -> None:
    """Bring the schema to the newest Alembic revision (idempotent; safe at every start)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    with engines.writer.begin() as conn:
        if not engines.is_sqlite:
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({JOURNAL_LOCK + 1})")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def append_events(
    conn: Connection, entries: Iterable[Mapping[str, Any]], is_sqlite: bool
) -> list[dict[str, Any]]:
    """Append journal entries in one go; assigns `seq` and a `t` that never decreases.

    An entry whose `t` is older than the last line's (a submission timed before a commit that
    won the lock) gets a `t` just after it rather than equal to it: at equal `t` the log orders
    endings, submissions, starts (DESIGN.md 4.6), and a tie made by clamping could break that.

    Each entry is an event of DESIGN.md 4.6 (without `seq`; `t` defaults to now) or an internal
    `x.` kind. Returns the entries as stored, `seq` and `t` filled in.
    """
    rows = [dict(e) for e in entries]
    if not rows:
        return rows
    if not is_sqlite:
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({JOURNAL_LOCK})")
    last = conn.exec_driver_sql("SELECT seq, t FROM events ORDER BY seq DESC LIMIT 1").first()
    seq, t_floor = (last[0], last[1]) if last is not None else (0, 0.0)
    now = time.time()
    values = []
    for row in rows:
        seq += 1
        t = float(row.get("t", now))
        if t < t_floor:  # just after the last line, never tied with it: equal t orders kinds (4.6)
            t = math.nextafter(t_floor, math.inf)
        t_floor = t
        row["seq"], row["t"] = seq, t
        body = {"seq": seq, "t": t, **{k: v for k, v in row.items() if k not in ("seq", "t")}}
        values.append({"seq": seq, "t": t, "kind": row["event"], "job": row.get("job"), "body": dumps(body)})
    insert_rows(conn, "events", values)
    return rows


def insert_rows(conn: Connection, table: str, rows: list[dict[str, Any]]) -> None:
    """executemany of plain INSERTs in the driver's own paramstyle: the hot writes (submissions,
    their events) skip SQLAlchemy's statement construction and cache-key work (tens of µs each)."""
    columns = tuple(rows[0])
    key = (conn.dialect.name, table, columns)
    sql = _INSERTS.get(key)
    if sql is None:
        style = ":{}" if conn.dialect.name == "sqlite" else "%({})s"
        quoted = ", ".join(f'"{c}"' for c in columns)
        sql = f'INSERT INTO "{table}" ({quoted}) VALUES ({", ".join(style.format(c) for c in columns)})'
        _INSERTS[key] = sql
    conn.exec_driver_sql(sql, rows)


_INSERTS: dict[tuple[str, str, tuple[str, ...]], str] = {}
