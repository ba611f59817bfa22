"""The leader lease and its fence (server/leader.py) on SQLite and PostgreSQL, in one process:
who takes it, when an epoch rises, and that a deposed holder's transaction is refused."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from corral.server.leader import Deposed, Lease, role
from corral.server.replica import standby_message
from corral.store import schema
from corral.store.engine import Engines, make_engines, side_engine, upgrade

MADE: list[Lease] = []


@pytest.fixture
def engines(database_url: str) -> Iterator[Engines]:
    engines = make_engines(database_url)
    upgrade(engines)
    try:
        yield engines
    finally:
        for made in MADE:
            made.close()
        MADE.clear()
        engines.dispose()


def lease(engines: Engines, holder: str, seconds: float = 10.0, margin: float = 3.0) -> Lease:
    made = Lease(side_engine(engines.url), holder, lease=seconds, margin=margin)
    MADE.append(made)
    return made


def test_one_holder_and_takeover_raises_the_epoch(engines: Engines) -> None:
    a, b = lease(engines, "a", seconds=1.0, margin=0.5), lease(engines, "b")
    assert a.try_acquire() and a.epoch == 1
    assert not b.try_acquire()  # a holds it, live
    assert b.other is not None and b.other.holder == "a" and b.other.epoch == 1
    assert "replica a leads (epoch 1" in standby_message(b.other, engines.is_sqlite)
    with engines.reader.connect() as conn:
        assert role(conn, "a")["scheduler"] == "leader"
        assert role(conn, "b") == {"scheduler": "standby", "epoch": 1, "leader": "a"}
    a.step_down("test")  # a stops renewing: its lease lapses after a second
    time.sleep(1.1)
    assert b.try_acquire() and b.epoch == 2
    b.release()  # a clean stop ends the lease at once
    assert a.try_acquire() and a.epoch == 3
    a.release()


def test_a_deposed_leader_commits_nothing(engines: Engines) -> None:
    # `a` trusts its own clock for ever (margin below zero): only the database's epoch stops it
    a, b = lease(engines, "a", seconds=1.0, margin=-1000.0), lease(engines, "b")
    assert a.try_acquire()
    a._stop.set()  # no renewals: as if paused or cut off
    with engines.writer.begin() as conn:
        a.fence(conn)  # still the leader: passes
    time.sleep(1.1)
    assert b.try_acquire() and b.epoch == 2
    assert a.valid()  # by its own clock it still leads ...
    t = schema.settings
    with pytest.raises(Deposed, match="epoch 2 replaced epoch 1"), engines.writer.begin() as conn:
        conn.execute(t.insert().values(key="stale", value="from a"))
        a.fence(conn)  # ... but the database says otherwise, in the same transaction
    with engines.reader.connect() as conn:  # rolled back with the fence
        assert conn.execute(select(func.count()).select_from(t).where(t.c.key == "stale")).scalar() == 0
    assert not a.valid() and a.epoch == 0  # stepped down
    assert not a.renew()
    b.release()


def test_a_leader_that_cannot_renew_stops_by_its_own_clock(engines: Engines) -> None:
    a = lease(engines, "a", seconds=1.0, margin=0.5)
    assert a.try_acquire()
    a._stop.set()  # renewals stop (the database is unreachable for it, say)
    with engines.writer.begin() as conn:
        a.fence(conn)
    time.sleep(0.6)  # past lease - margin, before the database's expiry
    with pytest.raises(Deposed, match="not renewed in time"), engines.writer.begin() as conn:
        a.fence(conn)


def test_renewal_keeps_the_lease(engines: Engines) -> None:
    a, b = lease(engines, "a", seconds=1.0, margin=0.2), lease(engines, "b")
    assert a.try_acquire()
    a._stop.set()  # renewed by hand below, not by the thread
    for _ in range(4):
        time.sleep(0.3)
        assert a.renew()
        assert not b.try_acquire()
    assert a.valid() and a.epoch == 1
    a.release()
