"""LISTEN/NOTIFY wake-ups on PostgreSQL (server/pg_wake.py): a ring from one process's connection
wakes a listener on another, as a submission on one replica wakes the leader's scheduler."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.server.doorbell import Doorbell, bell_for, doorbell_for
from corral.server.pg_wake import PgBell, PgDoorbell
from corral.store.engine import Engines, make_engines
from tests.server.scenario import database


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[Engines]:
    with database("postgresql", tmp_path) as url:
        engines = make_engines(url)
        try:
            yield engines
        finally:
            engines.dispose()


def test_a_ring_wakes_every_listener_of_its_channels(engines: Engines) -> None:
    scheduler, api_one, api_two = (doorbell_for(n, engines) for n in ("scheduler", "api", "api"))
    assert isinstance(scheduler, PgDoorbell)
    try:
        for bell in (scheduler, api_one, api_two):
            assert bell.wait(10)  # the first look, once listening
            assert not bell.wait(0.2)  # nothing rung since
        ring = bell_for(["scheduler", "api"], engines)  # what an API replica rings after a commit
        assert isinstance(ring, PgBell)
        ring.ring()
        assert scheduler.wait(10) and api_one.wait(10) and api_two.wait(10)
        only_api = bell_for(["api"], engines)  # what the scheduler rings
        only_api.ring()
        assert api_one.wait(10) and api_two.wait(10)
        assert not scheduler.wait(0.5)
    finally:
        for bell in (scheduler, api_one, api_two):
            bell.close()


def test_sqlite_keeps_the_datagram(tmp_path: Path) -> None:
    engines = make_engines(f"sqlite:///{tmp_path / 'corral.db'}")
    bell = doorbell_for("scheduler", engines)
    try:
        assert isinstance(bell, Doorbell)
    finally:
        bell.close()
        engines.dispose()
