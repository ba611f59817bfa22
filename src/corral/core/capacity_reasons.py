"""What a cycle tells a job that capacity keeps out (`reasons.capacity`), with the cycle's memory
of what those sentences read: the reservations on the node classes a gang may use, remembered
per classes while the cycle's reservations stay as they are, and the free GPUs they hold,
remembered per classes while neither the reservations nor the state apart from reserved GPUs
change (`ClusterState.base_id`: a tried backfill gives it back; outside one, the reserved GPUs
are the reservations'). The sentences themselves are remembered by `reasons.Sentences`.
"""

from __future__ import annotations

from corral.core import reasons as why_text
from corral.core.decisions import Reason
from corral.core.jobs import PendingJob
from corral.core.placement import Miss, Request
from corral.core.reserve import Reservation
from corral.core.state import ClusterState

Held = list[tuple[str, float, tuple[int, ...]]]  # (job, start, nodes) of reservations, earliest first


class CapacityReasons:
    """The capacity sentences of one cycle at `now`; `reservations` is the cycle's own list (read,
    never changed here), `generation` (passed with each question) names its contents."""

    __slots__ = ("generation", "held_free_memo", "now", "reservations", "reserved_memo", "sentences", "state")

    def __init__(self, state: ClusterState, now: float, reservations: list[Reservation]) -> None:
        self.state = state
        self.now = now
        self.reservations = reservations
        self.generation = 0
        self.sentences = why_text.Sentences(state, now)
        # per node classes: (generation, reservations on them) and ((generation, base id), GPUs)
        self.reserved_memo: dict[tuple[int, ...], tuple[int, Held]] = {}
        self.held_free_memo: dict[tuple[int, ...], tuple[tuple[int, int], int]] = {}

    def reason(
        self, job: PendingJob, req: Request, placed: Miss, generation: int, runs: str | None = None
    ) -> Reason:
        """Why the job does not fit now (`reasons.capacity`; `runs`: see there)."""
        self.generation = generation
        limit = job.spec.time_limit
        ends_by = None if limit is None else self.now + limit
        held = self.reserved_for(req)
        if not held:
            return self.sentences.capacity(req, placed, held, generation, ends_by)
        return self.sentences.capacity(req, placed, held, generation, ends_by, self.held_free, runs)

    def reserved_for(self, req: Request) -> Held:
        """(job, start, nodes) of the cycle's reservations on nodes the gang may use, earliest
        first (remembered per classes: reservations are only added during a cycle)."""
        if not self.reservations:
            return []
        known = self.reserved_memo.get(req.classes)
        if known is not None and known[0] == self.generation:
            return known[1]
        allowed, node_class = set(req.classes), self.state.node_class
        held = [
            (r.job, r.start, tuple(n for n, _ in r.capacity if node_class[n] in allowed))
            for r in self.reservations
        ]
        found = sorted(h for h in held if h[2])
        self.reserved_memo[req.classes] = (self.generation, found)
        return found

    def held_free(self, req: Request, held: why_text.Reservations) -> int:
        """`reasons.held_free_gpus`, remembered per classes (see the module)."""
        key = (self.generation, self.state.base_id)
        known = self.held_free_memo.get(req.classes)
        if known is not None and known[0] == key:
            return known[1]
        found = why_text.held_free_gpus(self.state, req, held)
        self.held_free_memo[req.classes] = (key, found)
        return found
