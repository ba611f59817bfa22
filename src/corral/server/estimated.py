"""Run-time estimates where users look (issue 16): the job object of `GET /v1/jobs/{id}`, the
jobs list and `corral submit --json` carry a pending or running job's estimate.

The scheduler learns run times in its own process (`server/learned.py`, then every job that
ends); the API process keeps its own copy of the same history: the newest `learned.LIMIT` jobs
that finished or failed, read once, then the jobs that finished or failed since, read at most
every `REFRESH` seconds when a job object is built (an indexed range on `jobs.end_time`). So the
API gives what `corral.core.estimates` gives on the same history, at the time of reading: a
pending job's estimate of its whole run time, given what its earlier attempts ran; a running
job's, given what it has run so far (the median of the past runs longer than that), and from it
its estimated end. The `start` event's `estimate` is the one the scheduler queued the job with,
which may be older. Estimates are never limits: no job is stopped for outrunning one.

Fields (extra fields of the job object, DESIGN.md 4.7; `null` when they do not apply):
`estimate` (seconds in all), `estimate_drawn_on`, `estimate_basis` (as in `start` events),
`estimated_end` (Unix time; a starting or running job) and `reserved_start` (Unix time; a
pending job the scheduler reserved GPUs for: its reason's time). A job array's object
(`GET /v1/jobs/{array id}`) carries a task's estimate and its running tasks' latest estimated end
(`array_fields`).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, func, select

from corral.core.estimates import Estimate, Estimator
from corral.core.model import JobSpec
from corral.server.jobs import NO_ESTIMATE, spec_from_json
from corral.server.learned import LIMIT
from corral.store import schema

REFRESH = 2.0  # seconds: newly finished jobs are read at most this often
ESTIMATED = ("pending", "starting", "running")  # the states whose jobs carry an estimate
ENDING = ("starting", "running")  # ... and an estimated end
LEARNED_FROM = ("finished", "failed")  # the jobs the scheduler learns from (`learned.learned`)
_CHUNK = 500  # job ids per `IN (...)`


class History:
    """The API process's estimator, brought up to date with the jobs that finished since it last
    looked (`estimator`). Thread-safe: the API's handlers run in a thread pool."""

    def __init__(self, limit: int = LIMIT, refresh: float = REFRESH) -> None:
        self.limit = limit
        self.refresh = refresh
        self.lock = threading.Lock()
        self._estimator: Estimator | None = None
        self._looked = -math.inf  # monotonic time of the last read
        self._through = -math.inf  # the newest `end_time` learned
        self._at_through: set[str] = set()  # the jobs learned that ended at `_through`

    def current(self) -> Estimator | None:
        """The estimator if no read is due (call it holding `lock`)."""
        if self._estimator is not None and time.monotonic() - self._looked < self.refresh:
            return self._estimator
        return None

    def estimator(self, conn: Connection) -> Estimator:
        """The estimator, after reading the jobs that finished since the last read (at most every
        `refresh` seconds). Call it holding `lock`, and estimate under the same hold."""
        current = self.current()
        if current is not None:
            return current
        now = time.monotonic()
        first = self._estimator is None
        estimator = self._estimator if self._estimator is not None else Estimator()
        j = schema.jobs
        q = select(j.c.id, j.c.spec, j.c.end_time)
        q = q.where(j.c.state.in_(LEARNED_FROM), j.c.end_time.is_not(None))
        if first:  # the newest `limit`, learned oldest first (the estimator keeps the newest)
            newest = conn.execute(q.order_by(j.c.end_time.desc()).limit(self.limit)).all()
            rows: list[Any] = list(reversed(newest))
        else:
            if self._through > -math.inf:
                q = q.where(j.c.end_time >= self._through)
            rows = list(conn.execute(q.order_by(j.c.end_time)).all())
            rows = [r for r in rows if r.id not in self._at_through]
        ran = _ran(conn, [r.id for r in rows])
        for r in rows:
            if r.id in ran:
                estimator.observe(spec_from_json(r.spec), max(0.0, ran[r.id]))
            if r.end_time > self._through:
                self._through, self._at_through = r.end_time, set()
            self._at_through.add(r.id)
        self._estimator, self._looked = estimator, now
        return estimator


def _ran(conn: Connection, ids: Sequence[str]) -> dict[str, float]:
    """Job -> the seconds its ended attempts ran, in all (jobs without one are absent)."""
    a = schema.attempts
    out: dict[str, float] = {}
    for i in range(0, len(ids), _CHUNK):
        found = conn.execute(
            select(a.c.job_id, func.sum(a.c.ended_at - a.c.started_at))
            .where(a.c.job_id.in_(ids[i : i + _CHUNK]), a.c.ended_at.is_not(None))
            .group_by(a.c.job_id)
        ).all()
        out.update((job, float(seconds)) for job, seconds in found if seconds is not None)
    return out


def _attempts(conn: Connection, rows: Sequence[Any]) -> tuple[dict[str, float], dict[str, float]]:
    """For the jobs that may have run (a pending job with attempts, a live one): job -> seconds its
    ended attempts ran, and job -> its live attempt's start."""
    a = schema.attempts
    ids = [r.id for r in rows if r.state in ENDING or (r.state == "pending" and r.attempt)]
    before: dict[str, float] = {}
    started: dict[str, float] = {}
    for i in range(0, len(ids), _CHUNK):
        found = conn.execute(
            select(a.c.job_id, a.c.started_at, a.c.ended_at).where(a.c.job_id.in_(ids[i : i + _CHUNK]))
        ).all()
        for r in found:
            if r.ended_at is None:
                started[r.job_id] = float(r.started_at)
            else:
                ran = max(0.0, float(r.ended_at) - float(r.started_at))
                before[r.job_id] = before.get(r.job_id, 0.0) + ran
    return before, started


def estimate_fields(
    conn: Connection, history: History, rows: Sequence[Any], now: float | None = None
) -> dict[str, dict[str, Any]]:
    """Job id -> its estimate fields (`NO_ESTIMATE`'s keys), for the rows (of `schema.jobs`) of jobs
    that are pending, starting or running; other rows are absent (their fields are `NO_ESTIMATE`)."""
    wanted = [r for r in rows if r.state in ESTIMATED]
    if not wanted:
        return {}
    now = time.time() if now is None else now
    before, started = _attempts(conn, wanted)
    out: dict[str, dict[str, Any]] = {}
    memo: dict[tuple[Any, ...], Estimate | None] = {}  # pending jobs that never ran share by keys
    with history.lock:
        estimator = history.estimator(conn)
        for r in wanted:
            ran = before.get(r.id, 0.0)
            start = started.get(r.id) if r.state in ENDING else None
            attained = ran + max(0.0, now - start) if start is not None else ran
            if attained == 0.0:
                data = json.loads(r.spec)
                key = (data["queue"], data["user"], data["name"], data["replicas"] * data["gpus_per_replica"])
                key += tuple(data["gpu_model"])
                if key not in memo:
                    memo[key] = estimator.estimate(spec_from_json(r.spec))
                found = memo[key]
            else:
                found = estimator.estimate(spec_from_json(r.spec), attained)
            out[r.id] = fields(found, r, ran, start)
    return out


def array_fields(conn: Connection, history: History, array_id: str) -> dict[str, Any]:
    """A job array's estimate fields: `estimate`, `estimate_drawn_on` and `estimate_basis` of one
    of its tasks that has not run (the tasks share one spec but for their index), and
    `estimated_end`: the latest estimated end of its starting or running tasks (None when none
    runs). An array holds no reservation of its own (`reserved_start` None: its tasks' objects
    carry theirs). `NO_ESTIMATE` when no task is pending or running."""
    j = schema.jobs
    live = conn.execute(select(j).where(j.c.array_id == array_id, j.c.state.in_(ENDING))).all()
    waiting = conn.execute(
        select(j).where(j.c.array_id == array_id, j.c.state == "pending").order_by(j.c.seq).limit(1)
    ).first()
    if not live and waiting is None:
        return dict(NO_ESTIMATE)
    found = estimate_fields(conn, history, live)
    ends = [f["estimated_end"] for f in found.values() if f["estimated_end"] is not None]
    some = waiting if waiting is not None else live[0]
    with history.lock:  # a task that never ran: what a pending task is told
        whole = history.estimator(conn).estimate(spec_from_json(some.spec))
    out = fields(whole, _NEW)
    out["estimated_end"] = max(ends) if ends else None
    return out


def fields(found: Estimate | None, row: Any, ran: float = 0.0, start: float | None = None) -> dict[str, Any]:
    """The job object's estimate fields: `found` (its whole run time, given it has run), `ran`:
    what its ended attempts ran, `start`: its live attempt's start (a running job)."""
    reserved = row.reason_at if row.state == "pending" and row.reason_code == "reserved" else None
    if found is None:
        return dict(NO_ESTIMATE, reserved_start=reserved)
    return {
        "estimate": round(found.seconds, 3),
        "estimate_drawn_on": found.drawn_on,
        "estimate_basis": found.basis,
        "estimated_end": round(start + found.seconds - ran, 3) if start is not None else None,
        "reserved_start": reserved,
    }


def new_job_fields(conn: Connection, history: History, spec: JobSpec) -> dict[str, Any]:
    """The estimate fields of a job just submitted (pending, never run)."""
    with history.lock:
        found = history.estimator(conn).estimate(spec)
    return _new_fields(found)


def new_job_fields_now(history: History, spec: JobSpec) -> dict[str, Any] | None:
    """`new_job_fields` without waiting: None when the history is due a read or busy."""
    if not history.lock.acquire(blocking=False):
        return None
    try:
        estimator = history.current()
        if estimator is None:
            return None
        found = estimator.estimate(spec)
    finally:
        history.lock.release()
    return _new_fields(found)


def _new_fields(found: Estimate | None) -> dict[str, Any]:
    return dict(NO_ESTIMATE) if found is None else fields(found, _NEW)


class _New:
    state, reason_code, reason_at = "pending", "", None


_NEW = _New()
