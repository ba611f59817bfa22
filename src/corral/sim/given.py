"""A replay that also takes jobs one at a time, between its instants: the scenario tests (and any
tool that must put a cluster's current work into a replay) drive it step by step.

`add` queues one more arrival; `restore` starts a job at once on exactly the GPUs it holds, as a
cluster's current work. Both keep the engine's promises: one event log, one clock that never goes
back, and a quiet-cycle summary dropped as soon as a start happens outside a cycle.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from corral.core.model import JobSpec, NodeName
from corral.core.placement import to_placement
from corral.sim.engine import Simulation
from corral.sim.simjob import SimJob, trace_of

__all__ = ["GivenSimulation"]


class GivenSimulation(Simulation):
    """`Simulation` with jobs given one by one (`add`, `restore`) besides its trace."""

    def add(self, spec: JobSpec, duration: float, checkpoint_interval: float | None = None) -> None:
        """Submit one more job at `spec.submit_time`, which must not be before `next_time()`.

        Its spec is taken as given (queue, class and time limit already resolved); it arrives
        after the jobs already due at the same time.
        """
        job = SimJob(trace_of(spec, duration, checkpoint_interval), spec, duration)
        times = [a.trace.submit_time for a in self.arrivals[self._arrived :]]
        self.arrivals.insert(self._arrived + bisect_right(times, spec.submit_time), job)
        self.stats.jobs += 1

    def restore(
        self,
        spec: JobSpec,
        duration: float,
        placement: Sequence[tuple[NodeName, Sequence[int]]],
        started: float,
    ) -> None:
        """A job that already runs on exactly these GPUs since `started` (a cluster's current work).

        It is logged as submitted and started at `started`, which must not be before the instants
        already played, and ends `duration` seconds of work after it (or at its time limit).
        """
        state = self.state
        self._quiet = None  # a start outside a cycle
        job = SimJob(trace_of(spec, duration, None), spec, duration)
        self.jobs[spec.id] = job
        self.stats.jobs += 1
        self._submit(job, started)
        pending = state.remove_pending(spec.id)
        state.unchecked.remove(pending)
        masks = [(state.node_ids[node], sum(1 << g for g in gpus)) for node, gpus in placement]
        attempt = state.start(pending, masks, started)
        state.plan.commit()
        self._launch(spec.id, attempt.attempt, to_placement(state, masks), False, started)
