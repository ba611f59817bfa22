"""Upgrading a database that already has attempts: 0009_attempt_nodes fills `attempt_nodes` from
the attempts' placements (running, 0-GPU, a gang, ended), so the answers of
server/allocations.py hold at once. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import insert, select

from corral.server.allocations import master_ports, placed_on
from corral.store import engine as store_engine
from corral.store import schema
from corral.store.engine import Engines, make_engines

MIGRATIONS = Path(store_engine.__file__).parent / "migrations"


def migrate(engines: Engines, revision: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engines.writer.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


@pytest.fixture
def engines(database_url: str) -> Iterator[Engines]:
    engines = make_engines(database_url)
    yield engines
    engines.dispose()


ATTEMPTS = [  # job, attempt, state, placement, master port
    ("gang", 1, "running", [("b", [0, 1]), ("a", [0, 1]), ("b", [2, 3])], 29500),
    ("cpu", 1, "starting", [("a", [])], 29500),
    ("one", 1, "ended", [("a", [4])], 29501),
    ("one", 2, "stopping", [("c", [0])], 29500),
]


def test_an_upgrade_fills_the_nodes_of_existing_attempts(engines: Engines) -> None:
    migrate(engines, "0008_evidence")
    with engines.writer.begin() as conn:
        for job in ("gang", "cpu", "one"):
            conn.execute(
                insert(schema.jobs).values(
                    id=job, queue="q", state="running", submit_time=0.0, spec="{}", request="{}"
                )
            )
        conn.execute(
            insert(schema.attempts),
            [
                {
                    "job_id": job,
                    "attempt": n,
                    "state": state,
                    "placement": json.dumps([{"node": node, "gpus": g} for node, g in placement]),
                    "master_port": port,
                    "started_at": 0.0,
                }
                for job, n, state, placement, port in ATTEMPTS
            ],
        )
    migrate(engines, "head")
    an = schema.attempt_nodes
    with engines.reader.connect() as conn:
        rows = {(r.job_id, r.attempt, r.node, bool(r.master)) for r in conn.execute(select(an))}
        assert rows == {
            ("gang", 1, "b", True),
            ("gang", 1, "a", False),
            ("cpu", 1, "a", True),
            ("one", 1, "a", True),
            ("one", 2, "c", True),
        }
        live = {n: {(p.job, p.attempt) for p in placed_on(conn, [n])} for n in "abc"}
        assert live == {"a": {("gang", 1), ("cpu", 1)}, "b": {("gang", 1)}, "c": {("one", 2)}}
        assert placed_on(conn, ["a"], states=None, job="one", attempt=1)[0].state == "ended"
        assert master_ports(conn, "abc") == {"a": {29500}, "b": {29500}, "c": {29500}}
