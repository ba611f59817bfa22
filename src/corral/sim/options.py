"""What a replay is asked to do (`SimOptions`) and what it did besides its event log (`SimStats`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.sim.jobmodel import PreemptionCost, Slowdown

__all__ = ["SimOptions", "SimStats"]


@dataclass(frozen=True, slots=True)
class SimOptions:
    min_interval: float = 0.0  # seconds between cycles at the least
    slowdown: Slowdown = field(default_factory=Slowdown)
    preemption: PreemptionCost = field(default_factory=PreemptionCost)
    node_mtbf: float | None = None  # mean seconds between failures of one node
    node_repair: float = 3600.0
    seed: int = 0
    # tell the jobs of an instant with arrivals alone without a cycle where the last cycle shows it
    # would decide nothing and tell them what it told their keys (`core/quiet.py`): same decisions
    skip_quiet: bool = True


@dataclass(slots=True)
class SimStats:
    """What the run did, besides the event log."""

    end_time: float = 0.0
    cycles: int = 0  # every cycle, those told without running (`skipped`) included
    skipped: int = 0
    jobs: int = 0
    time_limit_rules: dict[str, int] = field(
        default_factory=lambda: {"trace": 0, "queue default": 0, "none": 0}
    )
