"""A pending job read back after a scheduler restart waits as it did in memory before: from its
last attempt's end (aging, e.g. `tiresias`' `starve`, counts from there), with the service its
attempts received (`scheduler_db.pending_jobs`, `in_force.queue_pending`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import insert

from corral.core.model import JobId
from corral.policies.registry import load_policy
from corral.server import scheduler_db as db
from corral.server.in_force import queue_pending
from corral.store import schema
from corral.store.engine import Engines, make_engines, upgrade
from tests.helpers import job, nodes, occupy, run, state_of


@pytest.fixture
def engines(database_url: str) -> Iterator[Engines]:
    engines = make_engines(database_url)
    upgrade(engines)
    with engines.writer.begin() as conn:
        for i, (state, attempt) in enumerate((("pending", 0), ("pending", 2), ("running", 1)), start=1):
            conn.execute(
                insert(schema.jobs).values(
                    id=f"j{i}", queue="default", state=state, attempt=attempt, submit_time=0.0,
                    spec="{}", request="{}",
                )
            )  # fmt: skip
        for attempt, started, ended in ((1, 100.0, 1100.0), (2, 2000.0, 2500.0)):
            conn.execute(
                insert(schema.attempts).values(
                    job_id="j2", attempt=attempt, state="ended", placement="[]", started_at=started,
                    ended_at=ended,
                )
            )  # fmt: skip
        conn.execute(
            insert(schema.attempts).values(
                job_id="j3", attempt=1, state="running", placement="[]", started_at=3000.0
            )
        )
    yield engines
    engines.dispose()


def test_a_requeued_job_read_back_waits_from_its_last_attempts_end(engines: Engines) -> None:
    with engines.reader.connect() as conn:
        rows = {r.id: r for r in db.pending_jobs(conn)}
    assert set(rows) == {"j1", "j2"}
    assert (rows["j1"].requeued_at, rows["j1"].ran) == (None, None)  # never ran
    assert (rows["j2"].requeued_at, rows["j2"].ran) == (2500.0, 1500.0)
    profile = load_policy("tiresias", {"tiresias": {"starve": 5000.0, "thresholds": [2000.0]}})
    state = state_of(nodes(1, 2))
    occupy(state, "busy", "n00", [0, 1], priority="urgent", now=0.0)
    fresh = queue_pending(state, job("j1", gpus=2, submit=0.0), rows["j1"])
    served = queue_pending(state, job("j2", gpus=2, submit=0.0), rows["j2"])
    assert (fresh.queued_at, fresh.attained) == (0.0, 0.0)
    assert (served.queued_at, served.attained) == (2500.0, 3000.0)  # 2 GPUs x 1,500 s: level 1
    assert run(state, 6000.0, profile).next_wake == 7500.0  # promoted 5,000 s after its requeue
    state.end(JobId("busy"), requeue=False, now=6000.0)
    assert [s.job for s in run(state, 6000.0, profile).starts] == ["j1"]  # j2 is behind, level 1
