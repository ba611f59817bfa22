"""The `backlog` scenario of bench/core_bench.py: a full cluster and a long queue.

Every GPU of the cluster is busy with 20,000 running attempts (1, 2, 4 or 8 GPUs, time limits of
1-24 hours, started in the last hour) in two queues with equal quotas; 100,000 jobs wait (90 %
one GPU, the rest gangs of 1, 2, 4 or 8 replicas of 8 GPUs; time limits in whole minutes from
15 minutes to about 17 hours, so nearly every job's differs from its neighbours'). Timed:
- the first cycle (every job new: the feasibility check of 100,000 jobs, then the walk);
- the cycles that follow until one decides nothing (the fill leaves one queue below its quota,
  so the first cycles reclaim from the other, `max_nominations` per cycle: reported apart);
- a cycle in which nothing can start (nothing changed since the last one), five times (the
  median; a full garbage collection first, so that the figure is the cycle's own and not a
  collection of the 100,000 jobs just built);
- a cycle after 1 % of the running attempts ended (their GPUs are free: jobs start, gangs'
  reservations may change, backfill windows open).
`--quick` scales the jobs by 1/10 on the quick cluster.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from typing import Any

from core_fixtures import (
    HOUR,
    LEVELS,
    Jobs,
    Size,
    Timed,
    check_state,
    node_specs,
    random_mask,
    restore,
    timed_schedule,
)
from corral.core.model import QueueName, QueueSpec
from corral.core.plugins import Profile
from corral.core.state import ClusterState
from corral.policies.registry import load_policy

QUEUES = ("team-a", "team-b")


def fill_running(
    state: ClusterState, size: Size, rng: random.Random, jobs: Jobs, target: int, now: float
) -> int:
    """Every GPU busy: per node, attempts of 1, 2, 4 or 8 GPUs (about `target` in all)."""
    per_node = target / size.nodes  # attempts per node on average
    weights = (0.5, 0.3, 0.15, 0.05) if per_node >= 3.5 else (0.2, 0.3, 0.3, 0.2)
    restored = []
    for node in range(size.nodes):
        free = (1 << size.gpus) - 1
        while free:
            left = free.bit_count()
            sizes = [g for g in (1, 2, 4, 8) if g <= left]
            gpus = rng.choices(sizes, weights[: len(sizes)])[0]
            mask = random_mask(rng, free, size.gpus, gpus)
            free &= ~mask
            limit = 60.0 * rng.randint(60, 24 * 60)
            spec = jobs.make(
                f"r{len(restored)}", rng.choice(QUEUES), gpus, submit=now - HOUR, time_limit=limit
            )
            restored.append((spec, [(node, mask)], now - rng.uniform(0, HOUR)))
    restore(state, restored)
    return len(restored)


def submit_backlog(state: ClusterState, rng: random.Random, jobs: Jobs, count: int, now: float) -> None:
    for i in range(count):
        if rng.random() < 0.9:
            gpus, replicas = 1, 1
        else:
            gpus, replicas = 8, rng.choice((1, 2, 4, 8))
        state.submit(
            jobs.make(
                f"p{i}", QUEUES[i % 2], gpus, replicas, submit=now - rng.uniform(0, 10 * HOUR),
                time_limit=60.0 * rng.randint(15, 1000),
            )
        )  # fmt: skip


def settle(state: ClusterState, profile: Profile, now: float) -> list[Timed]:
    """Cycles until one decides nothing. The fill leaves one queue below its quota, so the first
    cycles reclaim (up to `max_nominations` per cycle; the victims never stop here): such a cycle
    is not one in which nothing can start, and is reported apart."""
    cycles: list[Timed] = []
    for k in range(100):
        timed = timed_schedule(state, profile, now + 0.5 + k / 1000)
        cycles.append(timed)
        result = timed.result
        if not (result.starts or result.preemptions or result.nominations):
            return cycles
    raise AssertionError("the backlog did not settle within 100 cycles")


def bench_backlog(size: Size, scale: float, rng: random.Random) -> dict[str, Any]:
    """20,000 running on a full cluster, 100,000 pending: a cycle where nothing can start, and one
    after 1 % of the running attempts end."""
    total = size.total_gpus
    quota = total // len(QUEUES)
    state = ClusterState.build(
        LEVELS, node_specs(size), [QueueSpec(QueueName(q), quota=quota, cohort="all") for q in QUEUES]
    )
    profile = load_policy("default")
    jobs, now = Jobs(), 36_000.0
    running = fill_running(state, size, rng, jobs, round(20_000 * scale), now)
    if any(state.index.avail):
        raise AssertionError("cluster not full after the fill")
    submit_backlog(state, rng, jobs, round(100_000 * scale), now)
    first = timed_schedule(state, profile, now)
    check_state(state)
    settling = settle(state, profile, now)
    gc.collect()
    cpu = time.process_time()
    idles = [timed_schedule(state, profile, now + 1.0 + k / 10) for k in range(5)]
    idle_cpu = (time.process_time() - cpu) / 5
    idle = idles[-1]
    check_state(state)
    gc.collect()
    ending = rng.sample(sorted(state.running), max(1, len(state.running) // 100))
    freed = sum(state.running[j].spec.gpus for j in ending)
    for job_id in ending:
        state.end(job_id, requeue=False, now=now + 2.0)
    t0, cpu = time.perf_counter(), time.process_time()
    after = timed_schedule(state, profile, now + 2.0)
    wall_after, cpu_after = time.perf_counter() - t0, time.process_time() - cpu
    check_state(state)
    figures: dict[str, Any] = {
        "nodes": size.nodes,
        "gpus": total,
        "running": running,
        "pending": len(state.jobs) + len(after.result.starts),
        "first_cycle_ms": first.total_s * 1000,
        "first_check_ms": first.check_s * 1000,
        "first_starts": len(first.result.starts),
        "settling_cycles": len(settling),
        "settling_preemptions": sum(len(t.result.preemptions) for t in settling),
        "settling_cycle_max_ms": max((t.total_s for t in settling), default=0.0) * 1000,
        "idle_cycle_ms": statistics.median(t.total_s for t in idles) * 1000,
        "idle_cycle_max_ms": max(t.total_s for t in idles) * 1000,
        "idle_cycle_cpu_ms": idle_cpu * 1000,  # CPU time: what a busy machine inflates less
        "idle_starts": len(idle.result.starts),
        "idle_considered": idle.result.considered,
        "ended": len(ending),
        "freed_gpus": freed,
        "after_end_cycle_ms": after.total_s * 1000,
        "after_end_wall_ms": wall_after * 1000,
        "after_end_cpu_ms": cpu_after * 1000,
        "after_end_starts": len(after.result.starts),
        "after_end_backfilled": sum(1 for s in after.result.starts if s.backfilled),
        "after_end_reservations": len(after.result.reservations),
        "after_end_nominations": len(after.result.nominations),
        "free_gpus_after": sum(state.index.avail),
    }
    failed = []
    if any(t.result.starts or t.result.preemptions for t in idles):
        failed.append("the idle cycle started or preempted something: it was not idle")
    if idle.result.considered != len(state.jobs) + len(after.result.starts):
        failed.append(f"the idle cycle reached {idle.result.considered} jobs, not every pending job")
    if not after.result.starts:
        failed.append("nothing started after 1 % of the running attempts ended")
    if failed:
        figures["failed_checks"] = failed
    return figures
