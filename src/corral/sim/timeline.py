"""The simulator's calendar (`Simulation`'s base): the event heap, and the periodic checkpoints
in a heap of their own.

Every event is `(time, kind, sequence, payload)`; at one instant the kinds play in their order:
ends, stops, node failures and repairs, checkpoints, then cycle wakes. A periodic checkpoint
changes only what a preemption would lose (`ClusterState.record_checkpoint`), and no cycle follows
one unless a cycle is due or the last cycle asked for a `fresh` wake; so the checkpoints wait in
their own heap, and those due before the next instant are applied on the way to it (`_fold`), in
their order (each keeps the sequence number it would have had among the events, so ties break
alike), instead of each being an instant `step` plays alone. The decisions are those of playing
each (`tests/sim/test_checkpoint_fold.py` compares, switch `FOLD_CHECKPOINTS`).
"""

from __future__ import annotations

import heapq

from corral.core.model import INFINITY, JobId
from corral.core.state import ClusterState
from corral.sim.options import SimOptions
from corral.sim.simjob import SimJob

_END, _STOP, _FAIL_NODE, _REPAIR, _CHECKPOINT, _CYCLE = 0, 1, 2, 3, 4, 9
# True: the periodic checkpoints wait in a calendar of their own and those due before the next
# instant are applied on the way to it (`_fold`), in their order, instead of each being an instant
# `step` plays alone. False: each is a _CHECKPOINT event (tests compare: `test_checkpoint_fold`)
FOLD_CHECKPOINTS = True


class Timeline:
    """The event heap and the checkpoints' calendar of one replay; `Simulation` sets the fields."""

    events: list[tuple[float, int, int, object]]
    _checkpoints: list[tuple[float, int, JobId, int]]  # (time, sequence as in `events`, job, attempt)
    _n: int  # the last sequence number given
    arrivals: list[SimJob]
    _arrived: int
    _cycle_due: bool
    state: ClusterState
    jobs: dict[str, SimJob]
    options: SimOptions
    _checkpoint_wakes: dict[tuple[str, int], float]
    _fresh_due: tuple[str, float] | None

    def _push(self, t: float, kind: int, payload: object) -> None:
        self._n += 1
        heapq.heappush(self.events, (t, kind, self._n, payload))

    def next_time(self) -> float:
        """The instant `step` plays next: the next arrival or event (infinity when none is left)."""
        i = self._arrived
        t = self.arrivals[i].trace.submit_time if i < len(self.arrivals) else INFINITY
        t = min(t, self.events[0][0]) if self.events else t
        return self._played(t) if self._checkpoints and self._checkpoints[0][0] < t else t

    def _played(self, t: float) -> float:
        """The instant `step` plays next when a checkpoint is due before `t`, the next arrival or
        event: `t` (the checkpoints are folded into it), or the checkpoint's, played alone when
        nothing comes after it or when a cycle is due (at a checkpoint, one may run)."""
        if t == INFINITY or (self._cycle_due and self.state.jobs):
            return self._checkpoints[0][0]
        return t

    def _fold(self, t: float) -> float:
        """Apply the checkpoints due before `t` in their order (no cycle may follow one: see
        `_played`); the instant to play: `t`, or a `fresh` cycle wake one of them queued earlier."""
        checkpoints = self._checkpoints
        while checkpoints and checkpoints[0][0] < t:
            at, _, job_id, attempt = checkpoints[0]
            wake = self._checkpoint(job_id, attempt, at, True)
            if wake < t:
                t = wake
        return t

    def _only_failures_due(self) -> bool:
        """Whether nothing but node failures is due (none at all included): no end, stop,
        checkpoint, repair or cycle wake. With nothing running and every node up, a cycle that
        started nothing never will: a failure only takes capacity away until its repair restores
        this very state, and what moves with the time alone asks for a cycle wake."""
        return not self._checkpoints and all(kind == _FAIL_NODE for _, kind, _, _ in self.events)

    def _next_checkpoint(self, job: SimJob, now: float, top: bool = False) -> None:
        """Queue the attempt's next periodic checkpoint (`SimJob.next_checkpoint`). The core learns
        of each (`ClusterState.record_checkpoint`): what a preemption would lose is then known to it.
        `top`: it replaces the one at the top of the calendar, which just fell."""
        at = job.next_checkpoint(now, self.options.preemption.default_interval)
        checkpoints = self._checkpoints
        if at is not None and FOLD_CHECKPOINTS:
            self._n += 1
            if top:
                heapq.heapreplace(checkpoints, (at, self._n, job.spec.id, job.attempt))
            else:
                heapq.heappush(checkpoints, (at, self._n, job.spec.id, job.attempt))
            return
        if top:
            heapq.heappop(checkpoints)
        if at is not None:
            self._push(at, _CHECKPOINT, (job.spec.id, job.attempt, None))

    def _checkpoint(self, job_id: JobId, attempt: int, now: float, top: bool = False) -> float:
        """A periodic checkpoint falls (a stale one, of an attempt that ended, is dropped): the
        core learns of it and the next is queued (`top`: in its place at the calendar's top); a
        `fresh` cycle wake when the last cycle asked for one (its time is returned; infinity when
        none was queued)."""
        running = self.state.running.get(job_id)
        if running is None or running.attempt != attempt:
            if top:
                heapq.heappop(self._checkpoints)
            return INFINITY
        self.state.record_checkpoint(job_id, now)
        self._next_checkpoint(self.jobs[job_id], now, top)
        # a cycle only if a waiting job takes victims by how little they would lose
        wakes = self._checkpoint_wakes
        spec = running.spec
        within = wakes.get((spec.queue, spec.priority)) if wakes else None
        if within is None:
            return INFINITY
        at = now + within / 2
        if self._fresh_due is not None and self._fresh_due[1] <= at:
            return INFINITY
        self._fresh_due = ("fresh", at)
        self._push(at, _CYCLE, self._fresh_due)
        return at
