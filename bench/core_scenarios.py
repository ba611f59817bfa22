"""The core benchmarks' scenarios 1-3: placements/s, gang decision latency, a full cycle
(bench/core_bench.py runs them; docs/benchmarks.md explains each)."""

from __future__ import annotations

import dataclasses
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
from corral.core.model import JobId, JobSpec, QueueName, QueueSpec
from corral.core.state import ClusterState
from corral.policies.registry import load_policy


# ---- 1. placements ----------------------------------------------------------------------------
def bench_placements(size: Size, scale: float, rng: random.Random) -> dict[str, Any]:
    """50,000 pending 1-GPU jobs in 4 queues on 5,000 x 8 GPUs; one cycle."""
    n_jobs = round(50_000 * scale)
    quota = size.total_gpus // 4
    t0 = time.perf_counter()
    state = ClusterState.build(
        LEVELS, node_specs(size), [QueueSpec(QueueName(f"q{i}"), quota=quota) for i in range(4)]
    )
    t_build = time.perf_counter() - t0
    jobs = Jobs()
    specs = [
        jobs.make(
            f"j{i}",
            f"q{rng.randrange(4)}",
            1,
            submit=rng.uniform(0, 600),
            time_limit=rng.choice([HOUR, 4 * HOUR, 24 * HOUR, None]),
        )
        for i in range(n_jobs)
    ]
    t0 = time.perf_counter()
    for spec in specs:
        state.submit(spec)
    t_submit = time.perf_counter() - t0
    profile = load_policy("default")
    timed = timed_schedule(state, profile, 600.0)
    result, wall = timed.result, timed.total_s
    check_state(state)
    starts = len(result.starts)
    expected = min(n_jobs, size.total_gpus)
    if starts != expected:
        raise AssertionError(f"expected {expected} starts, got {starts}")
    return {
        "nodes": size.nodes,
        "gpus": size.total_gpus,
        "pending": n_jobs,
        "build_s": t_build,
        "submit_s": t_submit,
        "cycle_s": wall,
        "starts": starts,
        "check_s": timed.check_s,
        "phases_s": timed.phases_s,
        "placements_per_s": starts / wall,
        "placements_per_s_without_check": starts / timed.phases_s,
        "still_pending": len(state.jobs),
        "reservations": len(result.reservations),
    }


# ---- 2. gangs -------------------------------------------------------------------------------------
GANG_QUEUES = ("q0", "q1", "q2", "q3")
GANG_LOAD_SHARE = (0.4, 0.3, 0.2, 0.1)  # of the busy GPUs; q0 and q1 end up above their quotas


def fragment(
    state: ClusterState, size: Size, rng: random.Random, jobs: Jobs, busy: float, start: float
) -> int:
    """Fill `busy` of the GPUs with 1-8 GPU jobs at random nodes and random GPU indices."""
    target = int(size.total_gpus * busy)
    used = 0
    free = [size.gpus] * size.nodes
    masks = [0] * size.nodes
    restored = []
    i = 0
    while used < target:
        node = rng.randrange(size.nodes)
        gpus = rng.choice((1, 1, 1, 2, 2, 3, 4, 4, 6, 8))
        gpus = min(gpus, target - used)
        if gpus > free[node]:
            continue
        mask = random_mask(rng, ~masks[node] & ((1 << size.gpus) - 1), size.gpus, gpus)
        masks[node] |= mask
        free[node] -= gpus
        used += gpus
        queue = rng.choices(GANG_QUEUES, GANG_LOAD_SHARE)[0]
        spec = jobs.make(
            f"bg{i}",
            queue,
            gpus,
            submit=start,
            time_limit=rng.choice([HOUR, 2 * HOUR, 4 * HOUR, 8 * HOUR, 24 * HOUR, None]),
        )
        restored.append((spec, [(node, mask)], start + rng.uniform(0, 300)))
        i += 1
    restore(state, restored)
    return i


def gang_spec(jobs: Jobs, rng: random.Random, i: int, now: float, max_gpus: int) -> JobSpec:
    if rng.random() < 0.8:
        gpus, replicas = 8, rng.choice((1, 1, 2, 2, 4, 4, 8, 8, 16, 32))
    else:
        gpus, replicas = 4, rng.choice((2, 4, 8, 16, 32, 64))
    replicas = max(1, min(replicas, max_gpus // gpus))
    r = rng.random()
    pack, required = (None, False)
    if replicas > 1 or gpus == 4:
        if r < 0.3:
            pack, required = "leaf", True
        elif r < 0.45:
            pack, required = "spine", True
        elif r < 0.6:
            pack, required = "leaf", False
    return jobs.make(
        f"gang{i}",
        rng.choice(GANG_QUEUES),
        gpus,
        replicas,
        priority="high" if rng.random() < 0.2 else "normal",
        submit=now,
        time_limit=rng.choice([HOUR, 8 * HOUR, 24 * HOUR, None]),
        pack=pack,
        required=required,
    )


def bench_gangs(size: Size, scale: float, rng: random.Random) -> dict[str, Any]:
    """A 50 %-loaded, fragmented cluster; 2,000 gangs of 8-256 GPUs decided one at a time."""
    n_gangs = round(2_000 * scale)
    quota = int(size.total_gpus * 0.15)  # 4 x 15 %: 60 % guaranteed, 40 % shared
    state = ClusterState.build(
        LEVELS, node_specs(size), [QueueSpec(QueueName(q), quota=quota) for q in GANG_QUEUES]
    )
    jobs = Jobs()
    t0 = time.perf_counter()
    background = fragment(state, size, rng, jobs, 0.5, 0.0)
    t_fill = time.perf_counter() - t0
    empty_nodes = state.alloc.count(0)
    profile = load_policy("default")
    max_gpus = 256 if scale >= 1 else 64
    latencies: list[float] = []
    without_check: list[float] = []
    outcomes = {"started": 0, "nominated": 0, "reserved": 0, "blocked": 0, "rejected": 0}
    replaced = 0
    for i in range(n_gangs):
        now = 1000.0 + i
        spec = gang_spec(jobs, rng, i, now, max_gpus)
        state.submit(spec)
        timed = timed_schedule(state, profile, now)
        result = timed.result
        latencies.append(timed.total_s)
        without_check.append(timed.phases_s)
        # put the cluster back to its load: the gang ends, its victims are replaced by new jobs
        # on the same GPUs, and no pending job is left for the next decision.
        if result.rejections:
            outcomes["rejected"] += 1
        elif result.starts:
            outcomes["started"] += 1
            state.end(spec.id, requeue=False, now=now)
        else:
            if result.nominations:
                outcomes["nominated"] += 1
            elif result.reservations:
                outcomes["reserved"] += 1
            else:
                outcomes["blocked"] += 1
            state.remove_pending(spec.id)
        again = []
        for p in result.preemptions:
            victim = state.end(p.job, requeue=False, now=now)
            clone = dataclasses.replace(victim.spec, id=JobId(f"{victim.spec.id}r{i}"), seq=jobs.seq + 1)
            jobs.seq += 1
            again.append((clone, list(victim.placement), now))
        restore(state, again)
        replaced += len(again)
        if state.jobs:
            raise AssertionError(f"jobs left pending after gang {i}: {list(state.jobs)[:5]}")
        state.plan.commit()
    check_state(state)
    figures: dict[str, Any] = {
        "nodes": size.nodes,
        "gpus": size.total_gpus,
        "background_jobs": background,
        "fill_s": t_fill,
        "empty_nodes_after_fill": empty_nodes,
        "gangs": n_gangs,
        "victims_replaced": replaced,
        "busy_gpus_at_end": sum(m.bit_count() for m in state.alloc),
    }
    figures.update({f"outcome_{k}": v for k, v in outcomes.items()})
    figures.update(latency_figures("decision", latencies))
    figures.update(latency_figures("decision_without_check", without_check))
    return figures


# ---- 3. cycle -------------------------------------------------------------------------------------
CYCLE_QUEUES = (  # name, quota share, limit share (None: no limit), share of running, share of pending
    ("research", 0.20, None, 0.30, 0.30),
    ("prod", 0.25, None, 0.25, 0.20),
    ("vision", 0.10, 0.40, 0.15, 0.15),
    ("speech", 0.10, 0.30, 0.10, 0.15),
    ("infra", 0.05, 0.15, 0.10, 0.10),
    ("interns", 0.00, 0.10, 0.10, 0.10),
)
TIME_LIMITS = (HOUR, 2 * HOUR, 4 * HOUR, 8 * HOUR, 24 * HOUR, 72 * HOUR, None)


def bench_cycle(size: Size, scale: float, rng: random.Random) -> dict[str, Any]:
    """20,000 running jobs, 10,000 pending (1-64 GPUs, quotas, limits, time limits); one full cycle."""
    n_running, n_pending = round(20_000 * scale), round(10_000 * scale)
    total = size.total_gpus
    queue_specs = [
        QueueSpec(
            QueueName(name),
            quota=int(total * quota),
            limit=None if limit is None else int(total * limit),
            cohort="all",
        )
        for name, quota, limit, _, _ in CYCLE_QUEUES
    ]
    names = [q[0] for q in CYCLE_QUEUES]
    state = ClusterState.build(LEVELS, node_specs(size), queue_specs)
    profile = load_policy("default")
    jobs = Jobs()
    for i in range(n_running):
        queue = rng.choices(names, [q[3] for q in CYCLE_QUEUES])[0]
        gpus = rng.choices((1, 2, 4), (0.6, 0.25, 0.15))[0]
        state.submit(
            jobs.make(
                f"r{i}",
                queue,
                gpus,
                priority=rng.choice(("low", "normal", "normal")),
                submit=rng.uniform(0, 100),
                time_limit=rng.choice(TIME_LIMITS),
            )
        )
    timed_setup = timed_schedule(state, profile, 100.0)
    setup, setup_wall = timed_setup.result, timed_setup.total_s
    if len(setup.starts) != n_running or state.jobs:
        raise AssertionError(f"setup started {len(setup.starts)} of {n_running} jobs")
    check_state(state)
    now = 100.0 + 1800.0  # past every class's min_runtime
    sizes = ((1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (8, 8), (4, 4))
    for i in range(n_pending):
        queue = rng.choices(names, [q[4] for q in CYCLE_QUEUES])[0]
        gpus, replicas = rng.choices(sizes, (0.3, 0.15, 0.15, 0.2, 0.08, 0.05, 0.04, 0.03))[0]
        pack = "leaf" if replicas > 1 and rng.random() < 0.4 else None
        priority = rng.choices(("low", "normal", "high"), (0.2, 0.65, 0.15))[0]
        state.submit(
            jobs.make(
                f"p{i}",
                queue,
                gpus,
                replicas,
                priority=priority,
                submit=rng.uniform(100, now),
                time_limit=rng.choice(TIME_LIMITS),
                pack=pack,
                required=pack is not None,
            )
        )
    busy_before = sum(m.bit_count() for m in state.alloc)
    timed = timed_schedule(state, profile, now)
    result, wall = timed.result, timed.total_s
    check_state(state)
    return {
        "nodes": size.nodes,
        "gpus": total,
        "running_before": n_running,
        "pending": n_pending,
        "busy_gpus_before": busy_before,
        "setup_cycle_s": setup_wall,
        "cycle_s": wall,
        "cycle_ms": wall * 1000,
        "check_ms": timed.check_s * 1000,
        "phases_ms": timed.phases_s * 1000,
        "considered": result.considered,
        "starts": len(result.starts),
        "backfilled": sum(1 for s in result.starts if s.backfilled),
        "preemptions": len(result.preemptions),
        "nominations": len(result.nominations),
        "reservations": len(result.reservations),
        "rejections": len(result.rejections),
    }
