"""Candidate victims by when their attained service reaches a level (issue 15).

A policy that preempts only jobs above an attained-service level (`las`: a waiting job takes
running ones in a higher level) ranks, in each search, the candidates whose service at `now`
(GPU-seconds of earlier attempts plus GPUs x the time this one has run) is at least the level's
floor. In an overloaded cluster most candidates are below it, and a ranking that visited them
all was the larger part of a cycle. The service of a running attempt grows at a known rate, so
the time it reaches a floor is known when it becomes a candidate: `Reaching` keeps, per floor
asked about, the candidates sorted by that time (from the first question on, as they join and
leave `Occupancy.members`), and `reaching(floor, now)` gives those that may have reached it: a
sorted prefix, with a second of margin so that float rounding never leaves one out (the plugin
still checks each one exactly). It never leaves out a candidate at or above the floor; what it
returns beyond them the plugin drops, so a ranking from it is the ranking of every candidate.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

from corral.core.jobs import RunningAttempt
from corral.core.model import JobId

USE_INDEX = True  # False: every ranking visits every candidate (tests compare)
_MARGIN = 1.0  # seconds: an attempt reaching the floor this much after `now` is still returned
INFINITY = float("inf")


def use_index() -> bool:
    """Whether rankings read the index (the switch is read here, where tests set it)."""
    return USE_INDEX


def reaches_at(attempt: RunningAttempt, floor: float, attained: float) -> float:
    """When the attempt's service (`attained` by earlier attempts + GPUs x the time since its
    start) reaches `floor` GPU-seconds (-inf: it had before it started; inf: never, without GPUs)."""
    gpus = attempt.job.spec.gpus
    if attained >= floor:
        return -INFINITY
    if gpus <= 0:
        return INFINITY
    return attempt.start + (floor - attained) / gpus


class Reaching:
    """Per floor asked about, the candidates sorted by when their service reaches it."""

    __slots__ = ("_attempts", "_by_floor")

    def __init__(self) -> None:
        # the candidates (`Occupancy.members`), each with its job's service before it started
        self._attempts: dict[JobId, tuple[RunningAttempt, float]] = {}
        # floor -> (time the service reaches it, job id) of every candidate, sorted
        self._by_floor: dict[float, list[tuple[float, JobId]]] = {}

    def join(self, attempt: RunningAttempt) -> None:
        job = attempt.job
        job_id, attained = job.spec.id, job.attained
        self._attempts[job_id] = (attempt, attained)
        for floor, entries in self._by_floor.items():
            insort(entries, (reaches_at(attempt, floor, attained), job_id))

    def leave(self, attempt: RunningAttempt) -> None:
        job_id = attempt.job.spec.id
        attained = self._attempts.pop(job_id)[1]  # as at `join`: the same times
        for floor, entries in self._by_floor.items():
            del entries[bisect_left(entries, (reaches_at(attempt, floor, attained), job_id))]

    def count(self, floor: float, now: float) -> int:
        """How many `reaching(floor, now)` returns, without building the list."""
        return bisect_right(self._entries(floor), now + _MARGIN, key=_time)

    def _entries(self, floor: float) -> list[tuple[float, JobId]]:
        entries = self._by_floor.get(floor)
        if entries is None:
            entries = self._by_floor[floor] = sorted(
                (reaches_at(a, floor, attained), job_id) for job_id, (a, attained) in self._attempts.items()
            )
        return entries

    def reaching(self, floor: float, now: float) -> list[RunningAttempt]:
        """Every candidate whose service may have reached `floor` by `now` (a superset of those
        that have: a second of margin), in the order they reach it."""
        entries = self._entries(floor)
        attempts = self._attempts
        end = bisect_right(entries, now + _MARGIN, key=_time)
        return [attempts[entries[i][1]][0] for i in range(end)]

    def first_after(self, floor: float, t: float) -> float:
        """The earliest time after `t` at which a candidate's service reaches `floor` (INFINITY:
        none, or no ranking asked about that floor yet: then no ranking read who reached it;
        keeping one more floor here would cost every candidate's join and leave from then on)."""
        entries = self._by_floor.get(floor)
        if entries is None:
            return INFINITY
        i = bisect_right(entries, t, key=_time)
        return entries[i][0] if i < len(entries) else INFINITY


def _time(entry: tuple[float, JobId]) -> float:
    return entry[0]
