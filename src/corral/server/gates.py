"""What the scheduler keeps out of the core: array tasks beyond `%N`, and jobs whose dependency waits.

The core is never changed for these: a gated job is simply not submitted to `ClusterState`
until its gate opens. Each scheduler step, before the cycle, `Gates.open` (1) for every capped
array offers the core its next tasks while fewer than N of them are in the core (pending there
or live), so never more than N run at once; (2) when something ended or started since the
last check, judges the dependencies of waiting jobs from the database: those whose conditions
all hold go on to (1); those whose conditions can never hold are cancelled at once, with the
reason, in the step's own transaction (a cancel that makes another dependency impossible is
found by the next check, which the scheduler runs at once). Jobs that wait keep the reason
written at submit (`server/arrays.py`), updated when the condition they wait for changes.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, select, update

from corral.config.array_spec import met_at
from corral.core.model import JobId
from corral.core.state import ClusterState
from corral.server import dependencies
from corral.server.jobs import LIVE_STATES, spec_from_json
from corral.store import schema
from corral.store.engine import Engines, append_events

DEPENDENCY_CODE = "dependency"


@dataclass(slots=True)
class Parked:
    """A pending job kept out of the core, with what the core needs when it is let in."""

    job_id: str
    spec: str  # JSON, parsed on release
    attempt: int
    held: bool
    not_before: float
    array_id: str | None
    conditions: list[dependencies.Condition]
    reason: str = ""
    requeued_at: float | None = None  # when its last attempt ended (one that ran before)
    ran: float | None = None  # the seconds its attempts ran (its attained service, per GPU)


@dataclass
class Gates:
    parked: dict[str, Parked] = field(default_factory=dict)
    caps: dict[str, int] = field(default_factory=dict)  # array -> %N (0: none)
    offered: dict[str, set[str]] = field(default_factory=dict)  # capped array -> its tasks in the core
    slots: dict[str, deque[str]] = field(default_factory=dict)  # capped array -> tasks waiting for a slot
    waiting: set[str] = field(default_factory=set)  # jobs whose dependency is not known to hold
    recheck: bool = False
    # called first in the transaction that writes (the scheduler's lease fence, `leader.py`)
    fence: Callable[[Connection], None] | None = None

    # ---- what comes in ------------------------------------------------------------------------
    def load(self, conn: Connection, pending: list[Any]) -> list[Any]:
        """After a reload: park what must wait; returns the pending rows to put in the core."""
        self.parked.clear()
        self.offered.clear()
        self.slots.clear()
        self.waiting.clear()
        self.caps.clear()
        arrays = {r.array_id for r in pending if r.array_id}
        self._load_caps(conn, arrays)
        j = schema.jobs
        for r in conn.execute(
            select(j.c.id, j.c.array_id).where(j.c.array_id.in_(sorted(arrays)), j.c.state.in_(LIVE_STATES))
        ):
            if self.caps.get(r.array_id):
                self.offered.setdefault(r.array_id, set()).add(r.id)
        self.recheck = True
        return [r for r in pending if not self.holds_back(r)]

    def _load_caps(self, conn: Connection, arrays: set[str]) -> None:
        missing = sorted(a for a in arrays if a not in self.caps)
        if missing:
            a = schema.arrays
            found = dict(conn.execute(select(a.c.id, a.c.max_running).where(a.c.id.in_(missing))).all())
            self.caps.update({x: int(found.get(x, 0)) for x in missing})

    def note_submits(self, engines: Engines, rows: Sequence[Any]) -> None:
        """Learn the caps of arrays new to the scheduler (before `holds_back` of their tasks)."""
        arrays = {r.array_id for r in rows if r.array_id and r.array_id not in self.caps}
        if arrays:
            with engines.reader.connect() as conn:
                self._load_caps(conn, arrays)

    def holds_back(self, row: Any) -> bool:
        """Whether a pending job (a row with spec, attempt, held, not_before, array_id, dependency)
        waits outside the core; True parks it."""
        conditions = dependencies.load(row.dependency)
        capped = bool(row.array_id and self.caps.get(row.array_id))
        if not conditions and not capped:
            return False
        job = Parked(
            row.id, row.spec, row.attempt, bool(row.held), float(row.not_before or 0.0), row.array_id,
            conditions, row.reason, _float(getattr(row, "requeued_at", None)),
            _float(getattr(row, "ran", None)),
        )  # fmt: skip
        if conditions:
            self.parked[row.id] = job
            self.waiting.add(row.id)
            self.recheck = True
            return True
        return self._take_slot(job)

    def _take_slot(self, job: Parked) -> bool:
        """A capped array's task: True (parked) when its array has no slot free."""
        array = str(job.array_id)
        offered = self.offered.setdefault(array, set())
        if len(offered) < self.caps[array] and not self.slots.get(array):
            offered.add(job.job_id)
            return False
        self.parked[job.job_id] = job
        self.slots.setdefault(array, deque()).append(job.job_id)
        return True

    def forget(self, job_id: str) -> None:
        """A parked job was cancelled by someone else."""
        job = self.parked.pop(job_id, None)
        self.waiting.discard(job_id)
        if job is not None and job.array_id in self.slots:
            with contextlib.suppress(ValueError):
                self.slots[str(job.array_id)].remove(job_id)

    def set_held(self, job_id: str, held: bool) -> bool:
        """Hold or release a parked job; False when it is not parked here."""
        job = self.parked.get(job_id)
        if job is None:
            return False
        job.held = held
        return True

    # ---- letting jobs in ----------------------------------------------------------------------
    def open(self, state: ClusterState, engines: Engines, now: float) -> tuple[list[str], list[int]]:
        """Let in every job whose gate is open; cancel those whose dependency never holds.
        Returns (the jobs let in, the journal seqs written)."""
        released: list[str] = []
        seqs: list[int] = []
        if self.recheck and self.waiting:
            seqs = self._judge(state, engines, now, released)
        self.recheck = False
        for array, queue in self.slots.items():
            offered = self.offered.setdefault(array, set())
            offered.intersection_update(
                [j for j in offered if JobId(j) in state.jobs or JobId(j) in state.running]
            )
            while queue and len(offered) < self.caps[array]:
                job_id = queue.popleft()
                offered.add(job_id)
                self._release(state, self.parked.pop(job_id), released, now)
        return released, seqs

    def _release(self, state: ClusterState, job: Parked, released: list[str], eligible: float) -> None:
        """Into the core, waiting from when it became eligible (as Slurm's age factor counts from
        EligibleTime): its dependency met or its slot freed, or its last attempt's end if later;
        with the service its attempts received."""
        spec = spec_from_json(job.spec)
        queued_at = max(eligible, job.requeued_at or 0.0, spec.submit_time)
        attained = spec.gpus * max(0.0, job.ran) if job.ran is not None else 0.0
        pending = state.submit(spec, attempts=job.attempt, attained=attained, queued_at=queued_at)
        pending.held, pending.not_before = job.held, job.not_before
        released.append(job.job_id)

    def _judge(self, state: ClusterState, engines: Engines, now: float, released: list[str]) -> list[int]:
        jobs = [self.parked[j] for j in sorted(self.waiting)]
        with engines.reader.connect() as conn:
            known = dependencies.progress(conn, [c for job in jobs for c in job.conditions])
        never: list[tuple[str, str]] = []
        changed: list[tuple[str, str]] = []
        for job in jobs:
            verdict, sentence = dependencies.verdict(job.conditions, known)
            if verdict == dependencies.NEVER:
                never.append((job.job_id, sentence))
                self.forget(job.job_id)
            elif verdict == dependencies.MET:
                self.waiting.discard(job.job_id)
                del self.parked[job.job_id]
                if not (job.array_id and self.caps.get(job.array_id)) or not self._take_slot(job):
                    met = met_at(job.conditions, known)
                    self._release(state, job, released, now if met is None else min(met, now))
            elif sentence != job.reason:
                job.reason = sentence
                changed.append((job.job_id, sentence))
        if not never and not changed:
            return []
        with engines.writer.begin() as conn:
            if self.fence is not None:
                self.fence(conn)
            seqs = _write(conn, never, changed, now, engines.is_sqlite)
        self.recheck = bool(never)  # a cancel may make another dependency impossible
        return seqs


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _write(
    conn: Connection,
    never: list[tuple[str, str]],
    changed: list[tuple[str, str]],
    now: float,
    is_sqlite: bool,
) -> list[int]:
    j = schema.jobs
    events = []
    for job_id, reason in never:
        done = conn.execute(
            update(j)
            .where(j.c.id == job_id, j.c.state == "pending")
            .values(
                state="cancelled", end_time=now, version=j.c.version + 1, reason=reason,
                reason_code=DEPENDENCY_CODE, reason_at=None,
            )
        ).rowcount  # fmt: skip
        if done:
            events.append({"event": "cancel", "t": now, "job": job_id, "reason": reason})
    for job_id, reason in changed:
        conn.execute(update(j).where(j.c.id == job_id, j.c.state == "pending").values(reason=reason))
    return [e["seq"] for e in append_events(conn, events, is_sqlite)]
