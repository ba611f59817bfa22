"""Queue order by fair share: under-quota queues first, then borrowers by weighted share and usage."""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.fairshare import fair_share_key
from corral.core.jobs import QueueState
from corral.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class FairShareArgs:
    half_life: float | None = 86400.0

    def __post_init__(self) -> None:
        if self.half_life is not None and self.half_life <= 0:
            raise ValueError("half_life must be > 0 seconds (or null to ignore usage history)")


@dataclass(frozen=True, slots=True)
class FairShare:
    """Two tiers (DESIGN.md 6.3); `half_life` (seconds) decays usage history, None ignores it."""

    args: FairShareArgs = FairShareArgs()

    def key(self, queue: QueueState, state: ClusterState) -> tuple[object, ...]:
        return fair_share_key(state, queue, self.args.half_life)
