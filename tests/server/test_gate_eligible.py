"""A job let in by its gate waits from when it became eligible, not from its submission (as
Slurm's age factor counts from EligibleTime): from when its dependency came to hold, read from
the targets' rows (so a scheduler restart gives the same time), or when its array's slot freed;
and a requeued job keeps its last attempt's end and its attained service (`server/gates.py`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import insert

from corral.core.model import JobId
from corral.server import scheduler_db as db
from corral.server.gates import Gates
from corral.server.jobs import spec_json
from corral.store import schema
from corral.store.engine import Engines, make_engines, upgrade
from tests.helpers import job, nodes, state_of


def _dependency(*on: tuple[str, str, bool]) -> str:
    return json.dumps({"text": ",".join(f"{k}:{t}" for k, t, _ in on), "on": [list(c) for c in on]})


@pytest.fixture
def engines(database_url: str) -> Iterator[Engines]:
    engines = make_engines(database_url)
    upgrade(engines)
    rows = [
        # targets: one finished at 1,100; one running since 400; an array whose last task ended at 2,900
        dict(id="t1", state="finished", start_time=100.0, end_time=1100.0),
        dict(id="t2", state="running", start_time=400.0),
        dict(id="a1_0", array_id="a1", state="finished", start_time=200.0, end_time=2000.0),
        dict(id="a1_1", array_id="a1", state="cancelled", end_time=2900.0),  # never started
        # waiting jobs, all submitted at 0
        dict(id="w1", state="pending", dependency=_dependency(("afterok", "t1", False))),
        dict(
            id="w2",
            state="pending",
            dependency=_dependency(("after", "t2", False), ("afterany", "t1", False)),
        ),
        dict(id="w3", state="pending", dependency=_dependency(("afterany", "a1", True))),
        dict(id="w4", state="pending", attempt=1, dependency=_dependency(("afterok", "t1", False))),
        dict(id="w5", state="pending", dependency=_dependency(("afterok", "t2", False))),
    ]
    with engines.writer.begin() as conn:
        conn.execute(insert(schema.arrays).values(id="a1", spec="0-1", tasks=2, team="t", created_at=0.0))
        for row in rows:
            spec = spec_json(job(str(row["id"]), submit=0.0))
            conn.execute(
                insert(schema.jobs).values(queue="default", submit_time=0.0, spec=spec, request="{}", **row)
            )
        # w4 ran once, from 3,000 to 3,500, and was requeued
        conn.execute(
            insert(schema.attempts).values(
                job_id="w4", attempt=1, state="ended", placement="[]", started_at=3000.0, ended_at=3500.0
            )
        )
    yield engines
    engines.dispose()


def test_a_job_let_in_by_its_dependency_waits_from_when_it_held(engines: Engines) -> None:
    for restart in range(2):  # a restart reads the same times back
        state = state_of(nodes(1, 2))
        gates = Gates()
        with engines.reader.connect() as conn:
            into_core = gates.load(conn, list(db.pending_jobs(conn)))
        assert into_core == []  # all five wait behind a dependency
        released, _ = gates.open(state, engines, now=10_000.0 + restart)
        assert sorted(released) == ["w1", "w2", "w3", "w4"]  # w5 waits for t2 to finish
        queued = {j: state.jobs[JobId(j)].queued_at for j in released}
        assert queued["w1"] == 1100.0  # t1's end
        assert queued["w2"] == 1100.0  # the later of t2's start (400) and t1's end
        assert queued["w3"] == 2900.0  # the array's last task ended (cancelled, never started)
        assert queued["w4"] == 3500.0  # its requeue is later than t1's end
        assert state.jobs[JobId("w4")].attained == 500.0  # 1 GPU x 500 s, kept
        assert state.jobs[JobId("w1")].attained == 0.0
        assert set(gates.parked) == {"w5"}


def test_an_array_task_let_in_by_a_free_slot_waits_from_then() -> None:
    state = state_of(nodes(1, 2))
    gates = Gates(caps={"a2": 1})

    class Row:
        def __init__(self, job_id: str) -> None:
            self.id, self.attempt, self.held, self.not_before = job_id, 0, False, 0.0
            self.spec = spec_json(job(job_id, submit=0.0))
            self.array_id, self.dependency, self.reason = "a2", "", ""

    assert not gates.holds_back(Row("a2_0"))  # the first takes the one slot
    state.submit(job("a2_0", submit=0.0))
    assert gates.holds_back(Row("a2_1"))
    state.remove_pending(JobId("a2_0"))  # left the core (as when it is cancelled)
    released, _ = gates.open(state, None, now=700.0)  # type: ignore[arg-type]  # no dependency to judge
    assert released == ["a2_1"]
    assert state.jobs[JobId("a2_1")].queued_at == 700.0
