"""Reservations that rest on estimated ends (issue 16): when a queue's first blocked job holds
GPUs on them, and what bounds the cost of finding them.

A job without time limits in the way gets a reservation from the estimated ends of the running
jobs (`reserve.estimated_fit`). It holds GPUs:
- at once when the estimate its start rests on is *confident*: drawn on at least
  `CONFIDENT_DRAWN` past jobs of the same queue and size or finer (`estimates.BASES[:3]`);
  on Philly such estimates have a median absolute error of 314 s against 9,672-19,240 s for
  those drawn on fewer (docs/benchmarks.md, "Overload quality");
- otherwise once the job has waited `Profile.hold_after` (aging: a poor estimate holds GPUs
  only for a job that has waited long).

Cost: the search releases running attempts one by one, so it is remembered on the pending job
(`PendingJob.estimated_hold`) and searched again only after `REFRESH` seconds or once the start
it found has passed: at most one search per queue head per `REFRESH`, whatever the cycle rate.
A reused reservation may be up to `REFRESH` seconds stale; reservations are soft (they only keep
backfill off GPUs), and estimates are never limits: no job is stopped for outrunning one.
"""

from __future__ import annotations

from corral.core.estimates import BASES, Estimate
from corral.core.jobs import PendingJob
from corral.core.model import INFINITY
from corral.core.placement import Request
from corral.core.reserve import Reservation, estimated_fit
from corral.core.state import ClusterState

REFRESH = 1800.0  # seconds an estimated reservation is reused before it is searched again
# seconds running attempts keep estimated ends after no search wanted them (`ClusterState.want_estimates`)
ESTIMATES_KEPT = 2 * REFRESH
CONFIDENT_DRAWN = 100  # past jobs an estimate must draw on to hold GPUs at once
CONFIDENT_BASES = frozenset(BASES[:3])  # the queue and size, or finer keys


def confident(estimate: Estimate | None) -> bool:
    """Whether an estimate is firm enough to hold GPUs on at once."""
    return estimate is not None and estimate.drawn_on >= CONFIDENT_DRAWN and estimate.basis in CONFIDENT_BASES


def estimated_hold(
    state: ClusterState, job: PendingJob, req: Request, now: float
) -> tuple[Reservation | None, Estimate | None]:
    """The job's reservation from estimated ends (and the estimate its start rests on), searched
    at most once per `REFRESH` seconds while the start it found is still ahead."""
    state.want_estimates(now)  # (running attempts get estimated ends, if they had none)
    known = job.estimated_hold
    if known is not None:
        at, start, capacity, estimate = known
        if now - at < REFRESH and start > now:
            if start == INFINITY:
                return None, None
            return Reservation(job.spec.id, start, capacity), estimate
    found, estimate = estimated_fit(state, req, now)
    if found is None:
        job.estimated_hold = (now, INFINITY, (), None)
    else:
        job.estimated_hold = (now, found.start, found.capacity, estimate)
    return found, estimate
