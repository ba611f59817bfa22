"""How simulated jobs run: slowdown when a gang is spread wider than it needs, and preemption costs.

Defaults are our assumptions, chosen inside the range the literature reports: Tiresias
(NSDI'19, section 2.2) and Gandiva (OSDI'18) measured that spreading a distributed training job
over more machines than needed slows communication-heavy models (VGG-like) severely and
compute-heavy ones (ResNet-like) little. Each extra span crossed multiplies the run time by
`1 + penalty`: crossing NVLink domains inside a node (PCIe) 5 %, spreading over several nodes
15 %, and every further network level 10 %. Change them with `--slowdown` to match your
workloads; set them to zero to ignore topology.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Slowdown:
    """Run-time multiplier for a placement that spans more than the tightest possible."""

    nvlink: float = 0.05  # a single node's gang over several NVLink domains
    nodes: float = 0.15  # several nodes instead of one
    level: float = 0.10  # each further network level crossed (leaf -> spine -> cluster)

    def __post_init__(self) -> None:
        if min(self.nvlink, self.nodes, self.level) < 0:
            raise ValueError("slowdown penalties must be >= 0")

    def factor(self, span: int, ideal: int) -> float:
        """Multiplier for a placement of span index `span` when `ideal` was possible.

        Span indices: 0 one NVLink domain, 1 one node, 2 the innermost level, ... (topology order).
        """
        factor = 1.0
        for crossed in range(ideal + 1, span + 1):
            if crossed == 1:
                factor *= 1.0 + self.nvlink
            elif crossed == 2:
                factor *= 1.0 + self.nodes
            else:
                factor *= 1.0 + self.level
        return factor


@dataclass(frozen=True, slots=True)
class PreemptionCost:
    """What a preemption costs a job beyond its checkpoint grace.

    `restart_overhead`: seconds of extra run time to restart and load a checkpoint (default 30 s,
    the order of a framework start plus a checkpoint load). Work since the job's last periodic
    checkpoint (the trace's `checkpoint_interval`, in seconds of work) is lost; a job with no
    interval loses everything it did, unless `default_interval` gives one to every job whose trace
    row has none (`corral simulate --checkpoint-interval`: "what if our jobs checkpointed?").
    """

    restart_overhead: float = 30.0
    default_interval: float | None = None

    def __post_init__(self) -> None:
        if self.restart_overhead < 0 or (self.default_interval is not None and self.default_interval <= 0):
            raise ValueError("restart overhead must be >= 0 and a checkpoint interval > 0 seconds")

    def saved(self, progress: float, interval: float | None) -> float:
        """Progress (seconds of work) kept after a preemption at `progress`."""
        interval = interval or self.default_interval
        if not interval:
            return 0.0
        return (progress // interval) * interval
