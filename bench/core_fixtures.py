"""Shared builders of the core benchmarks (bench/core_bench.py): the cluster shape, seeded jobs,
restored running attempts, timed cycles and latency figures."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from corral.core import invariants
from corral.core import rejections as rejections_module
from corral.core.cycle import schedule
from corral.core.decisions import CycleResult
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, Topology
from corral.core.plugins import Profile
from corral.core.state import ClusterState

PRIORITY = {"low": 0, "normal": 100, "high": 1000, "urgent": 10000}
HOUR = 3600.0
LEVELS = ("spine", "leaf")


# ---- shared builders ------------------------------------------------------------------------
@dataclass(frozen=True)
class Size:
    """Cluster shape: spines x leaves per spine x nodes per leaf, GPUs per node."""

    spines: int
    leaves: int
    per_leaf: int
    gpus: int = 8

    @property
    def nodes(self) -> int:
        return self.spines * self.leaves * self.per_leaf

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus


FULL = Size(5, 20, 50)  # 5,000 nodes x 8 GPUs = 40,000 GPUs
QUICK = Size(5, 2, 50)  # 500 nodes x 8 GPUs = 4,000 GPUs (leaves keep 50 nodes so leaf packs still fit)


def node_specs(size: Size) -> list[NodeSpec]:
    specs = []
    i = 0
    for s in range(size.spines):
        for leaf in range(size.leaves):
            labels = {"spine": f"s{s}", "leaf": f"s{s}l{leaf}"}
            for _ in range(size.per_leaf):
                specs.append(NodeSpec(NodeName(f"n{i:05d}"), size.gpus, "H100-80GB", 80.0, labels=labels))
                i += 1
    return specs


class Jobs:
    """Makes job specs with increasing submission sequence numbers."""

    def __init__(self) -> None:
        self.seq = 0

    def make(
        self,
        job_id: str,
        queue: str,
        gpus: int,
        replicas: int = 1,
        *,
        priority: str = "normal",
        submit: float = 0.0,
        time_limit: float | None = None,
        pack: str | None = None,
        required: bool = False,
    ) -> JobSpec:
        self.seq += 1
        return JobSpec(
            JobId(job_id),
            QueueName(queue),
            replicas=replicas,
            gpus_per_replica=gpus,
            priority=PRIORITY[priority],
            priority_class=priority,
            submit_time=submit,
            seq=self.seq,
            time_limit=time_limit,
            topology=Topology(pack, required),
        )


def restore(state: ClusterState, specs: Iterable[tuple[JobSpec, list[tuple[int, int]], float]]) -> None:
    """Start attempts on exact placements, as an adapter restoring running work does."""
    pending = []
    for spec, placement, start in specs:
        pending.append((state.submit(spec), placement, start))
    restored = {id(job) for job, _, _ in pending}
    state.unchecked[:] = [job for job in state.unchecked if id(job) not in restored]
    for job, placement, start in pending:
        state.remove_pending(job.spec.id)
        state.start(job, placement, start)
    state.plan.commit()


def random_mask(rng: random.Random, free: int, gpus_on_node: int, count: int) -> int:
    """`count` GPUs chosen at random among the free bits of a node."""
    bits = [i for i in range(gpus_on_node) if free >> i & 1]
    return sum(1 << i for i in rng.sample(bits, count))


check_state = invariants.check


# `schedule()` first checks that newly submitted jobs can ever fit (DESIGN.md 4.8), then runs the
# phases. To show the lead where the time goes, that check is run (by the same function, on the
# same jobs) just before `schedule()`, which then finds nothing unchecked; the cycle's time is
# the sum of the two. Without the function (an older tree, `--src`) the cycle is timed as one call.
_CHECK: Callable[[ClusterState, CycleResult], None] | None = getattr(
    rejections_module, "reject_never_fitting", None
)


@dataclass
class Timed:
    result: CycleResult
    check_s: float  # feasibility check of newly submitted jobs
    phases_s: float  # everything else in schedule()

    @property
    def total_s(self) -> float:
        return self.check_s + self.phases_s


def timed_schedule(state: ClusterState, profile: Profile, now: float) -> Timed:
    """One scheduling cycle, timed in two parts that add up to one `schedule()` call."""
    check_s = 0.0
    checked = CycleResult(now)
    if _CHECK is not None:
        t0 = time.perf_counter()
        _CHECK(state, checked)
        check_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = schedule(state, profile, now)
    phases_s = time.perf_counter() - t0
    result.rejections[:0] = checked.rejections
    return Timed(result, check_s, phases_s)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def latency_figures(prefix: str, seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        f"{prefix}_p50_ms": statistics.median(ms),
        f"{prefix}_p90_ms": percentile(ms, 90),
        f"{prefix}_p99_ms": percentile(ms, 99),
        f"{prefix}_max_ms": max(ms),
        f"{prefix}_mean_ms": statistics.fmean(ms),
    }
