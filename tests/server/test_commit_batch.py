"""Starts and endings written many at once (`corral.server.commit.Batch.groups`): when one item's
guard fails, the others are still written, and the failing one is dropped as if alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, insert, select

from corral.core.decisions import Start
from corral.core.model import JobId, NodeName, ReplicaPlacement
from corral.server.commit import Batch, EndItem, StartItem
from corral.server.endings import Ending
from corral.store import schema
from corral.store.engine import Engines, make_engines, upgrade


@pytest.fixture
def engines(database_url: str) -> Iterator[Engines]:
    engines = make_engines(database_url)
    upgrade(engines)
    with engines.writer.begin() as conn:
        for name, state in (("a", "up"), ("b", "down")):
            conn.execute(
                insert(schema.nodes).values(name=name, state=state, gpus=8, address=f"10.0.0.{name}")
            )
        for i in range(1, 6):
            conn.execute(
                insert(schema.jobs).values(
                    id=f"j{i}",
                    queue="q",
                    state="pending",
                    held=i == 3,
                    submit_time=0.0,
                    spec="{}",
                    request="{}",
                )
            )
    yield engines
    engines.dispose()


def start(job: str, node: str, *gpus: int) -> StartItem:
    return StartItem(
        Start(JobId(job), 1, (ReplicaPlacement(NodeName(node), gpus),)), 0, {"command": ["x"]}, ""
    )


def rows(engines: Engines, table: Any) -> list[Any]:
    with engines.reader.connect() as conn:
        return list(conn.execute(select(table)).all())


def test_a_stale_start_is_dropped_alone(engines: Engines) -> None:
    items = [
        start("j1", "a", 0, 1),
        start("j2", "a", 2),
        start("j3", "a", 3),  # held
        start("j4", "b", 0),  # its node is down
        start("j5", "a", 1),  # a GPU j1 holds: the unique index refuses it
    ]
    with engines.writer.begin() as conn:
        batch = Batch(conn, engines.is_sqlite, 100.0)
        written = batch.groups(batch.starts, items, lambda i: f"start {i.start.job}")
    assert written == [True, True, False, False, False]
    assert len(batch.dropped) == 3
    jobs = {r.id: r for r in rows(engines, schema.jobs)}
    assert [jobs[j].state for j in ("j1", "j2", "j3", "j4", "j5")] == ["starting"] * 2 + ["pending"] * 3
    assert jobs["j1"].start_time == 100.0 and jobs["j1"].attempt == 1
    live = sorted((r.job_id, r.gpu) for r in rows(engines, schema.allocations) if r.live == 1)
    assert live == [("j1", 0), ("j1", 1), ("j2", 2)]
    events = rows(engines, schema.events)
    assert [(e.kind, e.job) for e in events] == [("start", "j1"), ("start", "j2")]
    assert batch.own_seqs == [e.seq for e in events]  # nothing of the rolled-back savepoints
    orders = [json.loads(r.body) for r in rows(engines, schema.outbox)]
    assert [(o["job"], o["master_port"]) for o in orders] == [("j1", 29500), ("j2", 29501)]
    assert orders[0]["addresses"] == {"a": "10.0.0.a"}


def test_endings_written_together_and_a_stale_one_dropped(engines: Engines) -> None:
    with engines.writer.begin() as conn:
        batch = Batch(conn, engines.is_sqlite, 100.0)
        assert batch.groups(batch.starts, [start("j1", "a", 0), start("j2", "a", 1)], str) == [True, True]
    ends = [
        EndItem("j1", 1, Ending("finish", "finished", "", 0)),
        EndItem("j2", 1, Ending("restart", "pending", "worker exited with 1", 1, 0, 130.0)),
        EndItem("j2", 2, Ending("finish", "finished", "", 0)),  # no such attempt
    ]
    with engines.writer.begin() as conn:
        batch = Batch(conn, engines.is_sqlite, 120.0)
        assert batch.groups(batch.ends, ends, lambda e: f"end {e.job}") == [True, True, False]
    jobs = {r.id: r for r in rows(engines, schema.jobs)}
    assert (jobs["j1"].state, jobs["j1"].end_time, jobs["j1"].reason_code) == ("finished", 120.0, "finish")
    assert (jobs["j2"].state, jobs["j2"].restarts, jobs["j2"].not_before) == ("pending", 1, 130.0)
    assert jobs["j2"].end_time is None and jobs["j2"].exit_code == 1
    with engines.reader.connect() as conn:
        live = conn.execute(select(func.count()).where(schema.allocations.c.live == 1)).scalar()
    assert live == 0
    kinds = [(e.kind, e.job, json.loads(e.body).get("exit_code")) for e in rows(engines, schema.events)]
    assert kinds[2:] == [("finish", "j1", 0), ("restart", "j2", 1)]


def test_a_guard_seen_only_in_a_row_count_drops_that_start_alone(engines: Engines) -> None:
    calls: list[int] = []
    with engines.writer.begin() as conn:
        batch = Batch(conn, engines.is_sqlite, 100.0)

        def starts(items: Any) -> None:
            calls.append(len(items))
            batch.starts(items)

        written = batch.groups(starts, [start("j1", "a", 0), start("j3", "a", 1), start("j2", "a", 2)], str)
    assert written == [True, False, True] and calls == [3, 1, 1, 1]  # j3 is held
    assert sorted(r.job_id for r in rows(engines, schema.allocations)) == ["j1", "j2"]
