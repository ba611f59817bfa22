"""A small event-driven driver for multi-cycle tests: arrivals, completions, preemption deadlines.

It plays the adapter's part (as the simulator does): runs a cycle after every batch of events,
ends finished attempts, and stops preempted victims at their deadline (requeued).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from corral.core.cycle import schedule
from corral.core.decisions import CycleResult
from corral.core.model import JobId, JobSpec
from corral.core.plugins import Profile
from corral.core.state import ClusterState
from tests.helpers import check_no_double_allocation


@dataclass
class Driver:
    state: ClusterState
    profile: Profile
    now: float = 0.0
    work: dict[str, float] = field(default_factory=dict)  # remaining work per job (seconds)
    finished: dict[str, float] = field(default_factory=dict)
    starts: list[tuple[float, str, list[str]]] = field(default_factory=list)
    preemptions: list[tuple[float, str, str]] = field(default_factory=list)
    results: list[CycleResult] = field(default_factory=list)
    _events: list[tuple[float, int, str, str]] = field(default_factory=list)
    _n: int = 0

    def submit(self, spec: JobSpec, duration: float, at: float | None = None) -> None:
        self.work[spec.id] = duration
        self._push(self.now if at is None else at, "submit", spec)

    def _push(self, t: float, kind: str, payload: object) -> None:
        self._n += 1
        heapq.heappush(self._events, (t, self._n, kind, payload))  # type: ignore[arg-type]

    def run(self, until: float) -> None:
        self.cycle()
        while self._events and self._events[0][0] <= until:
            t = self._events[0][0]
            self.now = t
            while self._events and self._events[0][0] == t:
                _, _, kind, payload = heapq.heappop(self._events)
                self._apply(kind, payload)
            self.cycle()
        self.now = max(self.now, until)

    def _apply(self, kind: str, payload: object) -> None:
        state = self.state
        if kind == "submit":
            assert isinstance(payload, JobSpec)
            state.submit(payload)
        elif kind == "end":
            job_id, attempt = payload  # type: ignore[misc]
            running = state.running.get(JobId(job_id))
            if running is None or running.attempt != attempt:
                return
            state.end(JobId(job_id), requeue=False, now=self.now)
            self.finished[job_id] = self.now
        elif kind == "stop":
            job_id, attempt = payload  # type: ignore[misc]
            running = state.running.get(JobId(job_id))
            if running is None or running.attempt != attempt:
                return
            self.work[job_id] -= self.now - running.start  # checkpoint at the signal: no work lost
            state.end(JobId(job_id), requeue=True, now=self.now)

    def cycle(self) -> CycleResult:
        result = schedule(self.state, self.profile, self.now)
        self.results.append(result)
        for s in result.starts:
            nodes = list(dict.fromkeys(r.node for r in s.placement))
            self.starts.append((self.now, s.job, nodes))
            self._push(self.now + self.work[s.job], "end", (s.job, s.attempt))
        for p in result.preemptions:
            self.preemptions.append((self.now, p.job, p.by))
            self._push(p.deadline, "stop", (p.job, p.attempt))
        check_no_double_allocation(self.state)
        return result
