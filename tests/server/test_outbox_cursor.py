"""The outbox cursor behind the agents' long polls: one read per wake, only the polls of nodes
with a new order woken (`corral.server.context.OutboxCursor`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import insert

from corral.server.context import OutboxCursor
from corral.store import schema
from corral.store.engine import make_engines, upgrade


async def read_done(cursor: OutboxCursor) -> None:
    """Until the read in flight (in a worker thread) has been applied."""
    while cursor._busy:
        await asyncio.sleep(0)


def test_a_wake_reads_once_and_wakes_only_the_nodes_with_new_orders(tmp_path: Path) -> None:
    engines = make_engines(f"sqlite:///{tmp_path / 'corral.db'}")
    upgrade(engines)

    def order(node: str) -> None:
        with engines.writer.begin() as conn:
            conn.execute(insert(schema.outbox).values(node=node, body="{}"))

    async def scenario() -> None:
        cursor = OutboxCursor(engines.reader, exact=True)
        reads = 0
        read = cursor._read

        def counted(after: int) -> list[tuple[str, int]]:
            nonlocal reads
            reads += 1
            return read(after)

        cursor._read = counted  # type: ignore[method-assign]
        order("a")
        assert cursor.has_after("a", 0) and cursor.has_after("b", 0)  # nothing read yet: read the table
        a, b = cursor.mark("a"), cursor.mark("b")  # the first poll starts the reads
        await read_done(cursor)
        assert a.is_set() and not b.is_set()
        assert cursor.has_after("a", 0) and not cursor.has_after("a", 1) and not cursor.has_after("b", 0)
        a = cursor.mark("a")
        order("b")
        before = reads
        cursor.poke()
        cursor.poke()  # a second wake while the first read runs: coalesced
        await read_done(cursor)
        assert b.is_set() and not a.is_set()
        assert cursor.newest == {"a": 1, "b": 2} and reads - before <= 2
        cursor.close()

    try:
        asyncio.run(scenario())
    finally:
        engines.dispose()
