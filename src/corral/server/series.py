"""GPUs in use and waiting per queue over time, from the jobs and attempts tables (dashboard charts).

A job's GPUs are allocated from each attempt's start to its end (or now). It waits (pending
demand) from its submission to its first start, from an attempt that ended with a `preempt`,
`lost` or `restart` to the next start, and until now (or its end, if it was cancelled while
waiting) when it is pending. Each series is the average over equal buckets: GPU-seconds in the
bucket divided by its length, so the area under a chart is GPU-time, as in DESIGN.md 6.7.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, or_, select

from corral.store import schema

REQUEUED = ("preempt", "lost", "restart")
_REPLICAS = re.compile(r'"replicas":\s*(\d+)')
_PER_REPLICA = re.compile(r'"gpus_per_replica":\s*(\d+)')


@dataclass(frozen=True, slots=True)
class Interval:
    """`gpus` GPUs of queue `queue` from `start` to `end` (seconds, Unix time)."""

    queue: str
    start: float
    end: float
    gpus: int


@dataclass(frozen=True, slots=True)
class Window:
    since: float
    step: float
    points: int

    @property
    def until(self) -> float:
        return self.since + self.step * self.points

    def starts(self) -> list[float]:
        return [round(self.since + i * self.step, 3) for i in range(self.points)]


def averages(intervals: Iterable[Interval], window: Window) -> dict[str, list[float]]:
    """Per queue, the average level in each bucket of `window` (O(intervals + buckets))."""
    n, since, step = window.points, window.since, window.step
    whole: dict[str, list[float]] = {}  # difference array: weight of buckets fully covered
    part: dict[str, list[float]] = {}  # GPU-seconds of partly covered buckets
    for iv in intervals:
        a, b = max(iv.start, since), min(iv.end, window.until)
        if b <= a or iv.gpus <= 0:
            continue
        if iv.queue not in whole:
            whole[iv.queue], part[iv.queue] = [0.0] * (n + 1), [0.0] * (n + 1)
        full, some = whole[iv.queue], part[iv.queue]
        i = min(n - 1, int((a - since) // step))
        j = min(n, int((b - since) // step))
        if i == j:
            some[i] += iv.gpus * (b - a)
            continue
        some[i] += iv.gpus * (since + (i + 1) * step - a)
        some[j] += iv.gpus * (b - (since + j * step))
        full[i + 1] += iv.gpus
        full[j] -= iv.gpus
    out: dict[str, list[float]] = {}
    for queue, full in whole.items():
        level, some, row = 0.0, part[queue], []
        for k in range(n):
            level += full[k]
            row.append(round(level + some[k] / step, 3))
        out[queue] = row
    return out


def _gpus(spec: str) -> int:
    replicas, per = _REPLICAS.search(spec), _PER_REPLICA.search(spec)
    if replicas is None or per is None:  # never with the server's own spec JSON, but be exact
        data = json.loads(spec)
        return int(data["replicas"]) * int(data["gpus_per_replica"])
    return int(replicas.group(1)) * int(per.group(1))


def intervals(
    conn: Connection, since: float, until: float, now: float
) -> tuple[list[Interval], list[Interval]]:
    """(allocated, pending) intervals of every job that overlaps [since, until)."""
    j, a = schema.jobs, schema.attempts
    overlaps = and_(j.c.submit_time < until, or_(j.c.end_time.is_(None), j.c.end_time > since))
    jobs = {
        r.id: r
        for r in conn.execute(
            select(j.c.id, j.c.queue, j.c.state, j.c.submit_time, j.c.end_time, j.c.spec).where(overlaps)
        )
    }
    runs: dict[str, list[Any]] = {}
    for r in conn.execute(
        select(a.c.job_id, a.c.attempt, a.c.started_at, a.c.ended_at, a.c.end_kind)
        .join(j, j.c.id == a.c.job_id)
        .where(overlaps)
        .order_by(a.c.job_id, a.c.attempt)
    ):
        runs.setdefault(r.job_id, []).append(r)
    allocated: list[Interval] = []
    pending: list[Interval] = []
    for job_id, job in jobs.items():
        gpus = _gpus(job.spec)
        for run in runs.get(job_id, ()):
            allocated.append(Interval(job.queue, run.started_at, run.ended_at or now, gpus))
        pending.extend(Interval(job.queue, s, e, gpus) for s, e in waits(job, runs.get(job_id, ()), now))
    return allocated, pending


def waits(job: Any, runs: Sequence[Any], now: float) -> list[tuple[float, float]]:
    """The spans a job waited: before its first attempt, between a requeue and the next start, and now."""
    out: list[tuple[float, float]] = []
    waiting_since: float | None = job.submit_time
    for run in runs:
        if waiting_since is not None:
            out.append((waiting_since, run.started_at))
        waiting_since = run.ended_at if run.ended_at is not None and run.end_kind in REQUEUED else None
    if waiting_since is not None and job.state == "pending":
        out.append((waiting_since, now))
    elif waiting_since is not None and job.end_time is not None:  # cancelled (or rejected) while waiting
        out.append((waiting_since, job.end_time))
    return [(s, e) for s, e in out if e > s]


def choose_window(since: float | None, until: float | None, points: int, now: float) -> Window:
    """`points` buckets from `since` (default: an hour ago) to `until` (default: now), at least 1 s each."""
    end = now if until is None else until
    start = end - 3600.0 if since is None else since
    span = max(end - start, float(points))
    step = math.ceil(span / points * 1000) / 1000
    return Window(end - step * points, step, points)


def series(conn: Connection, window: Window, now: float, visible: set[str] | None) -> dict[str, Any]:
    """`GET /v1/usage/series`: per visible queue, GPUs allocated and waiting; the whole cluster's."""
    allocated, pending = intervals(conn, window.since, window.until, now)
    used, waiting = averages(allocated, window), averages(pending, window)
    used_now, waiting_now = levels_at(allocated, now), levels_at(pending, now)
    zero = [0.0] * window.points
    cluster = [round(sum(col), 3) for col in zip(*used.values(), strict=True)] if used else zero
    names = sorted(set(used) | set(waiting) | set(used_now) | set(waiting_now))
    return {
        "since": window.since,
        "step": window.step,
        "t": window.starts(),
        "cluster": {"allocated": cluster, "allocated_now": sum(used_now.values())},
        "queues": [
            {
                "name": q,
                "allocated": used.get(q, zero),
                "pending": waiting.get(q, zero),
                "allocated_now": used_now.get(q, 0),
                "pending_now": waiting_now.get(q, 0),
            }
            for q in names
            if visible is None or q in visible
        ],
    }


def levels_at(spans: Iterable[Interval], t: float) -> dict[str, int]:
    """Per queue, the GPUs of the intervals that hold at `t` (those still open end at `t`)."""
    out: dict[str, int] = {}
    for iv in spans:
        if iv.start <= t <= iv.end and iv.end > iv.start:
            out[iv.queue] = out.get(iv.queue, 0) + iv.gpus
    return out
