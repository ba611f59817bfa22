"""The core benchmarks' scenario 4, victim selection (`preempt`, `preempt_one_queue`), and 5,
`backlog` (bench/core_backlog.py); bench/core_bench.py runs them."""

from __future__ import annotations

import random
import time
from typing import Any

from core_fixtures import (
    HOUR,
    LEVELS,
    Jobs,
    Size,
    check_state,
    latency_figures,
    node_specs,
    random_mask,
    restore,
    timed_schedule,
)
from corral.core.model import QueueName, QueueSpec
from corral.core.state import ClusterState
from corral.policies.registry import load_policy


# ---- 4. preempt -----------------------------------------------------------------------------------
def fill_full(
    state: ClusterState, size: Size, rng: random.Random, jobs: Jobs, shares: tuple[float, float]
) -> int:
    """Every GPU busy with low-priority preemptible jobs: a few multi-node gangs, then 1-8 GPU jobs."""
    restored = []
    taken = [False] * size.nodes
    leaves = size.spines * size.leaves
    n_gangs = max(2, size.nodes // 70)
    for g in range(n_gangs):
        replicas = rng.choice((2, 2, 4, 4, 8))
        leaf = rng.randrange(leaves)
        base = leaf * size.per_leaf
        idle = [n for n in range(base, base + size.per_leaf) if not taken[n]]
        if len(idle) < replicas:
            continue
        chosen = rng.sample(idle, replicas)
        for n in chosen:
            taken[n] = True
        spec = jobs.make(
            f"lg{g}",
            rng.choices(("prod", "research"), shares)[0],
            size.gpus,
            replicas,
            priority="low",
            submit=0.0,
            time_limit=rng.choice((8 * HOUR, 24 * HOUR, None)),
        )
        restored.append((spec, [(n, (1 << size.gpus) - 1) for n in chosen], rng.uniform(0, 300)))
    i = 0
    for node in range(size.nodes):
        if taken[node]:
            continue
        queue = rng.choices(("prod", "research"), shares)[0]
        free = (1 << size.gpus) - 1
        while free:
            left = free.bit_count()
            gpus = rng.choice([g for g in (1, 2, 4, 8) if g <= left])
            mask = random_mask(rng, free, size.gpus, gpus)
            free &= ~mask
            spec = jobs.make(
                f"low{i}",
                queue,
                gpus,
                priority="low",
                submit=0.0,
                time_limit=rng.choice((HOUR, 4 * HOUR, 24 * HOUR, None)),
            )
            restored.append((spec, [(node, mask)], rng.uniform(0, 300)))
            i += 1
    restore(state, restored)
    return len(restored)


def bench_preempt(size: Size, scale: float, rng: random.Random) -> dict[str, Any]:
    """A full cluster of low-priority jobs in two queues (70 % prod, 30 % research, each near its
    quota); 100 urgent 8 x 8 gangs in prod, victims chosen one gang at a time."""
    return preempt_scenario(size, scale, rng, (0.7, 0.3))


def bench_preempt_one_queue(size: Size, scale: float, rng: random.Random) -> dict[str, Any]:
    """As `preempt`, with every victim in the urgent gangs' own queue: priority preemption only."""
    return preempt_scenario(size, scale, rng, (1.0, 0.0))


def preempt_scenario(
    size: Size, scale: float, rng: random.Random, shares: tuple[float, float]
) -> dict[str, Any]:
    n_urgent = max(10, round(100 * scale))
    total = size.total_gpus
    state = ClusterState.build(
        LEVELS,
        node_specs(size),
        [
            QueueSpec(QueueName("prod"), quota=int(total * shares[0])),
            QueueSpec(QueueName("research"), quota=int(total * shares[1])),
        ],
    )
    jobs = Jobs()
    t0 = time.perf_counter()
    running = fill_full(state, size, rng, jobs, shares)
    t_fill = time.perf_counter() - t0
    if any(state.index.avail):
        raise AssertionError("cluster not full after the fill")
    profile = load_policy("default")
    latencies: list[float] = []
    without_check: list[float] = []
    settle: list[float] = []
    nominated_latencies: list[float] = []
    victims_total = 0
    missing: list[str] = []
    for k in range(n_urgent):
        now = 1000.0 + 10 * k
        spec = jobs.make(f"urgent{k}", "prod", 8, 8, priority="urgent", submit=now, time_limit=4 * HOUR)
        state.submit(spec)
        timed = timed_schedule(state, profile, now)
        result = timed.result
        latencies.append(timed.total_s)
        without_check.append(timed.phases_s)
        nominated = [n for n in result.nominations if n.job == spec.id]
        if nominated:
            nominated_latencies.append(timed.total_s)
        if not nominated:
            missing.append(f"{spec.id}: {result.reasons.get(spec.id)}")
            if spec.id in state.jobs:
                state.remove_pending(spec.id)
            continue
        victims_total += len(result.preemptions)
        # the adapter: victims stop (they leave, so one job stays pending), then the gang starts
        for p in result.preemptions:
            state.end(p.job, requeue=False, now=now + 5)
        timed = timed_schedule(state, profile, now + 5)
        after = timed.result
        settle.append(timed.total_s)
        if [s.job for s in after.starts] != [spec.id]:
            raise AssertionError(
                f"nominated {spec.id} did not start once its victims stopped: {after.reasons.get(spec.id)}"
            )
        if [r.node for r in after.starts[0].placement] != [r.node for r in nominated[0].placement]:
            raise AssertionError(f"{spec.id} started away from its nomination")
    check_state(state)
    figures: dict[str, Any] = {
        "nodes": size.nodes,
        "gpus": total,
        "running_low_jobs": running,
        "fill_s": t_fill,
        "urgent_gangs": n_urgent,
        "nominated": n_urgent - len(missing),
        "victims": victims_total,
        "missing_nominations": missing[:5],
    }
    figures.update(latency_figures("select", latencies))
    figures.update(latency_figures("select_without_check", without_check))
    if nominated_latencies:
        figures.update(latency_figures("select_nominated", nominated_latencies))
    figures.update(latency_figures("start_nominated", settle) if settle else {})
    if missing:  # the figures stay useful; the run is marked failed
        figures["failed_checks"] = [
            f"{len(missing)} of {n_urgent} urgent gangs got no nomination; first: {missing[0]}"
        ]
    return figures


def bench_backlog(size: Size, scale: float, rng: random.Random) -> dict[str, Any]:
    """A full cluster and 100,000 pending jobs (bench/core_backlog.py)."""
    from core_backlog import bench_backlog as backlog

    return backlog(size, scale, rng)
