"""Fixtures for the control plane: every test here runs on SQLite and on PostgreSQL.

PostgreSQL comes from `CORRAL_TEST_DATABASE_URL` (`.ci/run` starts one with
`scripts/postgres.sh`); each test gets a fresh database on it. Without the variable the
PostgreSQL half is skipped with that reason (CI always sets it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.harness import PG_ENV, ROOT, Server, drop_postgres, fresh_postgres

LAB = ROOT / "examples" / "lab.yaml"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'corral.db'}"
        return
    admin = os.environ.get(PG_ENV)
    if not admin:
        pytest.skip(f'{PG_ENV} is not set: start one with `eval "$(bash scripts/postgres.sh start)"`')
    url, name = fresh_postgres(admin)
    try:
        yield url
    finally:
        drop_postgres(admin, name)


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[Server]:
    """A running `corral server` on the lab cluster (examples/lab.yaml), nodes not yet registered."""
    srv = Server(database_url, tmp_path / "data", LAB)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
