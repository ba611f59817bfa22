"""When each node was last heard of, shared by the API replicas through the database
(PostgreSQL; on SQLite there is one replica and nothing to share).

An agent's heartbeats reach one replica (the one it talks to, which changes when a replica dies),
but every replica's liveness thread (`liveness.py`) judges every node. So each replica writes,
every `FLUSH_EVERY` seconds, one row per node it heard since its last write (`node_heard`: an
upsert that keeps the later time, one executemany, not a row per heartbeat), and reads the table
back in the same short transaction. A node's silence is then measured from the latest time any
replica heard it. Times are stored on the database's clock (`now() - age` of the receive time on
this replica's monotonic clock), so replicas' wall clocks never have to agree.
"""

from __future__ import annotations

import time

from sqlalchemy import Connection, text

from corral.server.context import Context

FLUSH_EVERY = 2.0  # seconds between a replica's writes (and reads) of the shared times
RECENT = 10.0  # a node heard by some replica this recently is spared `mark_unheard` at a start

DB_NOW = "extract(epoch from clock_timestamp())"
UPSERT = text(
    f"INSERT INTO node_heard (node, heard_at) VALUES (:node, {DB_NOW} - :age) "
    "ON CONFLICT (node) DO UPDATE SET heard_at = GREATEST(node_heard.heard_at, EXCLUDED.heard_at)"
)
AGES = text(f"SELECT node, {DB_NOW} - heard_at FROM node_heard")


def heard_recently(conn: Connection, seconds: float = RECENT) -> set[str]:
    """Nodes some replica heard within `seconds` (none on SQLite)."""
    if conn.dialect.name == "sqlite":
        return set()
    return {str(node) for node, age in conn.execute(AGES) if age <= seconds}


class SharedHeard:
    """This replica's side of `node_heard`: `tick()` from the liveness thread, every second."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.flushed = time.monotonic()  # heartbeats received after this are still to be written
        self.due = 0.0

    def tick(self) -> None:
        ctx = self.ctx
        if ctx.engines.is_sqlite:
            return
        now = time.monotonic()
        if now < self.due:
            return
        self.due = now + FLUSH_EVERY
        since, self.flushed = self.flushed, now
        status = ctx.node_status
        beats = list(status.heartbeats.items())
        rows = [{"node": n, "age": max(0.0, now - t)} for n, t in beats if t > since]
        with ctx.engines.reader.begin() as conn:
            if rows:
                conn.execute(UPSERT, rows)
            ages = conn.execute(AGES).all()
        status.heard_elsewhere({str(node): now - float(age) for node, age in ages})
