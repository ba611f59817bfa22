"""Waiting jobs' reasons are soft state written after the decisions (issue 15): a cycle's starts,
and the start orders agents read, commit in a transaction of their own, never behind the reasons
of a long backlog; the reasons follow in later transactions of the reason writer's thread
(server/reason_writer.py), fenced by the leader lease like every decision, and a later cycle's
starts commit while a long write of reasons is still under way. Through the API in process and
a real `Scheduler` on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY
from sqlalchemy import event, func, select

from corral.server.leader import Deposed, Lease
from corral.server.reason_writer import Queued
from corral.store import schema
from corral.store.engine import side_engine
from tests.scenarios.test_scenarios_server import ServerScenario

CLUSTER = {"nodes": [{"name": "n01", "gpus": 8, "gpu_model": "H100-80GB"}]}


@pytest.fixture
def scenario(database_url: str, tmp_path: Path) -> Iterator[ServerScenario]:
    path = tmp_path / "one_node.yaml"
    path.write_text(yaml.safe_dump({"cluster": CLUSTER, "steps": []}))
    made = ServerScenario(path, database_url)
    try:
        made.start()
        yield made
    finally:
        made.close()


class Transactions:
    """The statements of each transaction the scheduler's writer commits, in commit order."""

    def __init__(self, scenario: ServerScenario) -> None:
        self.engine = scenario.scheduler.engines.writer
        self.committed: list[list[str]] = []
        self.open: dict[int, list[str]] = {}
        event.listen(self.engine, "before_cursor_execute", self._statement)
        event.listen(self.engine, "commit", self._commit)

    def _statement(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        self.open.setdefault(id(conn), []).append(" ".join(statement.split()).upper())

    def _commit(self, conn: Any) -> None:
        self.committed.append(self.open.pop(id(conn), []))

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._statement)
        event.remove(self.engine, "commit", self._commit)

    def index(self, prefix: str) -> list[int]:
        """The transactions holding a statement that starts with `prefix`."""
        return [i for i, t in enumerate(self.committed) if any(s.startswith(prefix) for s in t)]


def submit(scenario: ServerScenario, sid: str, gpus: int) -> None:
    scenario.submit({"id": sid, "gpus_per_replica": gpus, "time_limit": "1h"})


def stored_reason(scenario: ServerScenario, sid: str) -> tuple[str, int]:
    """The job's reason code, and how many lines its reason history holds."""
    with scenario.engines.reader.connect() as conn:
        code = conn.execute(select(schema.jobs.c.reason_code).where(schema.jobs.c.id == scenario.ids[sid]))
        r = schema.reasons
        count = conn.execute(select(func.count()).select_from(r).where(r.c.job_id == scenario.ids[sid]))
        return code.scalar_one(), count.scalar_one()


def test_starts_commit_before_and_apart_from_the_reasons(scenario: ServerScenario) -> None:
    submit(scenario, "first", 8)
    submit(scenario, "second", 8)  # waits for the first: a reason to write in the same step
    seen = Transactions(scenario)
    try:
        scenario.scheduler.step(force=True)
        assert scenario.scheduler.reason_writer.flush()
    finally:
        seen.close()
    starts = seen.index("INSERT INTO OUTBOX")  # the start order the agent reads
    reasons = seen.index("INSERT INTO REASONS")  # the waiting job's first reason, to its history
    assert len(starts) == 1 and len(reasons) == 1, seen.committed
    assert starts[0] < reasons[0], "the reasons were committed with or before the start order"
    assert not any(s.startswith("INSERT INTO REASONS") for s in seen.committed[starts[0]])
    assert not any(s.startswith("INSERT INTO OUTBOX") for s in seen.committed[reasons[0]])
    assert scenario.job("first")["state"] == "starting"
    waiting = scenario.job("second")
    assert waiting["reason_code"] == "reserved", waiting  # the next to start when the first ends
    assert waiting["reason"].startswith("needs 8 GPUs; 0 GPUs are free in the cluster"), waiting


def test_a_deposed_scheduler_writes_no_reason(scenario: ServerScenario) -> None:
    url = scenario.engines.url
    # `a` trusts its own clock for ever (margin below zero): only the database's epoch stops it
    a = Lease(side_engine(url), "a", lease=1.0, margin=-1000.0)
    b = Lease(side_engine(url), "b")
    try:
        assert a.try_acquire()
        scheduler = scenario.scheduler
        scheduler.lease = a
        submit(scenario, "first", 8)
        scheduler.step(force=True)  # the start and then the reasons, both fenced: a leads
        assert scheduler.reason_writer.flush()
        assert scenario.job("first")["state"] == "starting"
        a._stop.set()  # no renewals: as if paused or cut off
        time.sleep(1.1)
        assert b.try_acquire() and b.epoch == 2
        submit(scenario, "later", 8)  # nothing to decide for it: only its reason to write
        scheduler.step(force=True)  # its reason queued; the writer's fence refuses it
        with pytest.raises(Deposed, match="epoch 2 replaced epoch 1"):
            scheduler.reason_writer.flush()
        with pytest.raises(Deposed, match="epoch 2 replaced epoch 1"):
            scheduler.step(force=True)  # and the scheduler stops deciding
        assert stored_reason(scenario, "later") == ("", 0)  # nothing written by the deposed `a`
    finally:
        for lease in (a, b):
            lease.close()


def stored_reasons(scenario: ServerScenario) -> dict[str, tuple[str, str, str]]:
    """Every job's state, reason code and sentence, as stored."""
    j = schema.jobs
    with scenario.engines.reader.connect() as conn:
        rows = conn.execute(select(j.c.id, j.c.state, j.c.reason_code, j.c.reason)).all()
    return {r.id: (r.state, r.reason_code, r.reason) for r in rows}


def test_a_start_commits_while_a_long_write_of_reasons_is_under_way(scenario: ServerScenario) -> None:
    scheduler, writer = scenario.scheduler, scenario.scheduler.reason_writer
    submit(scenario, "first", 8)
    scheduler.step(force=True)
    assert writer.flush() and scenario.job("first")["state"] == "starting"
    scenario.poll_orders()  # its agent reports it running
    submit(scenario, "next", 8)  # the next to start, when the first ends
    scenario.submit({"id": "many", "gpus_per_replica": 1, "time_limit": "1h", "array": "0-599"})
    writer.rows = 50  # 601 reasons: 13 transactions
    taken, go = threading.Event(), threading.Event()
    chunks: list[list[str]] = []
    write = writer._write

    def held_up(chunk: Sequence[Queued]) -> None:  # the first chunk waits, taken and not yet written
        taken.set()
        assert go.wait(30)
        chunks.append([row.change.job for row in chunk])
        write(chunk)

    writer._write = held_up  # type: ignore[method-assign]
    rows_before = REGISTRY.get_sample_value("corral_reason_rows_total") or 0.0
    scheduler.step(force=True)  # nothing starts: 601 waiting jobs' first reasons to write
    assert taken.wait(30)
    assert writer.queued() == 601 - 50
    stored = stored_reasons(scenario)
    nxt = scenario.ids["next"]
    assert stored[nxt] == ("pending", "", ""), stored[nxt]  # none written yet
    scenario.exited("first", 0, told_to_stop=False)
    scheduler.step(force=True)  # the first ends and the next starts: committed, the reasons still queued
    assert scenario.job("first")["state"] == "finished"
    assert scenario.job("next")["state"] == "starting"
    assert writer.queued() > 0 and not chunks  # the write of reasons still under way: none written
    go.set()
    assert writer.flush()
    assert any(nxt in chunk for chunk in chunks)  # its waiting reason of the cycle before was written ...
    assert stored_reason(scenario, "next") == ("", 0)  # ... to nothing: it had started (no history line)
    stored = stored_reasons(scenario)
    waiting = {job: row for job, row in stored.items() if row[0] == "pending"}
    assert len(waiting) == 600  # `next` took the node
    for job, (_, code, message) in waiting.items():
        known = scheduler.reasons.known[job]
        assert (code, message) == (known[0], known[1]) and code, (job, code, message)
    written = (REGISTRY.get_sample_value("corral_reason_rows_total") or 0.0) - rows_before
    assert written >= len(waiting)
