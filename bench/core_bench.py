"""Benchmarks of the scheduling core: placements/s, gang decision latency, a full cycle, victim selection.

Run: `.venv/bin/python bench/core_bench.py [--only NAME[,NAME]] [--quick] [--json OUT] [--seed N]`.

Each scenario builds its cluster and jobs with a seeded `random.Random`, runs in a fresh
subprocess (so its peak RSS is its own), checks that no GPU was given twice, and reports its
figures as one JSON object on stdout. The parent prints a table (scenario, figure, value,
target, met) and can write every figure as JSON. `--quick` runs each scenario at 1/10 size
(a smoke test; the targets are meant for the full size). docs/benchmarks.md explains each
scenario and records measured results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from corral.core import invariants
from corral.core import rejections as rejections_module
from corral.core.cycle import schedule
from corral.core.decisions import CycleResult
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, QueueSpec, Topology
from corral.core.plugins import Profile
from corral.core.state import ClusterState
from corral.policies.registry import load_policy

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


# ---- harness --------------------------------------------------------------------------------------
SCENARIOS: dict[str, Callable[[Size, float, random.Random], dict[str, Any]]] = {
    "placements": bench_placements,
    "gangs": bench_gangs,
    "cycle": bench_cycle,
    "preempt": bench_preempt,
    "preempt_one_queue": bench_preempt_one_queue,
    "backlog": bench_backlog,
}

# scenario -> (figure, label, target text, predicate)
TARGETS: dict[str, list[tuple[str, str, str, Callable[[float], bool]]]] = {
    "placements": [("placements_per_s", "placements/s (one cycle)", ">= 20,000", lambda v: v >= 20_000)],
    "gangs": [("decision_p99_ms", "gang decision p99 ms", "<= 10", lambda v: v <= 10)],
    "cycle": [("cycle_ms", "full cycle ms", "<= 250", lambda v: v <= 250)],
    "preempt": [("select_p99_ms", "victim selection p99 ms", "<= 20", lambda v: v <= 20)],
    "backlog": [
        ("idle_cycle_ms", "cycle where nothing can start ms", "<= 20", lambda v: v <= 20),
        ("after_end_cycle_ms", "cycle after 1 % end ms", "<= 100", lambda v: v <= 100),
    ],
}
TARGETS["preempt_one_queue"] = TARGETS["preempt"]
INFO: dict[str, list[tuple[str, str]]] = {
    "placements": [
        ("build_s", "build state s"),
        ("submit_s", "submit all s"),
        ("cycle_s", "cycle s"),
        ("check_s", "  of which feasibility check s"),
        ("phases_s", "  of which phases s"),
        ("placements_per_s_without_check", "placements/s without the check"),
        ("starts", "starts"),
    ],
    "gangs": [
        ("decision_p50_ms", "gang decision p50 ms"),
        ("decision_max_ms", "gang decision max ms"),
        ("decision_without_check_p50_ms", "p50 ms without the check"),
        ("decision_without_check_p99_ms", "p99 ms without the check"),
        ("outcome_started", "gangs started"),
        ("outcome_nominated", "gangs nominated"),
        ("outcome_reserved", "gangs reserved"),
        ("outcome_blocked", "gangs blocked"),
        ("outcome_rejected", "gangs rejected"),
    ],
    "cycle": [
        ("check_ms", "  of which feasibility check ms"),
        ("phases_ms", "  of which phases ms"),
        ("setup_cycle_s", "setup cycle s (starts running)"),
        ("starts", "starts"),
        ("backfilled", "backfilled"),
        ("nominations", "nominations"),
        ("reservations", "reservations"),
    ],
    "preempt": [
        ("select_p50_ms", "victim selection p50 ms"),
        ("select_max_ms", "victim selection max ms"),
        ("select_without_check_p99_ms", "p99 ms without the check"),
        ("select_nominated_p99_ms", "p99 ms of calls that nominated"),
        ("nominated", "gangs nominated"),
        ("victims", "victims"),
        ("start_nominated_p50_ms", "start nominated gang p50 ms"),
    ],
}
INFO["preempt_one_queue"] = INFO["preempt"]
INFO["backlog"] = [
    ("running", "running attempts"),
    ("pending", "pending jobs"),
    ("first_cycle_ms", "first cycle ms (every job new)"),
    ("first_check_ms", "  of which feasibility check ms"),
    ("idle_cycle_max_ms", "  the slowest of five ms"),
    ("idle_cycle_cpu_ms", "  CPU time, mean of five ms"),
    ("settling_cycles", "cycles reclaiming before the idle ones"),
    ("settling_cycle_max_ms", "  the slowest of them ms"),
    ("after_end_cpu_ms", "cycle after 1 % end, CPU time ms"),
    ("idle_considered", "jobs the idle cycle reached"),
    ("ended", "attempts ended"),
    ("freed_gpus", "GPUs they freed"),
    ("after_end_starts", "starts after they ended"),
    ("after_end_backfilled", "  of which backfilled"),
    ("after_end_reservations", "reservations"),
    ("free_gpus_after", "GPUs free after that cycle"),
]
RSS_LIMIT_MIB = 1024.0


def peak_rss_mib() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(name: str, quick: bool, seed: int, profile_dir: str | None) -> None:
    size, scale = (QUICK, 0.1) if quick else (FULL, 1.0)
    rng = random.Random(f"{seed}:{name}")
    t0 = time.perf_counter()
    if profile_dir is None:
        figures = SCENARIOS[name](size, scale, rng)
    else:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        figures = profiler.runcall(SCENARIOS[name], size, scale, rng)
        os.makedirs(profile_dir, exist_ok=True)
        path = os.path.join(profile_dir, f"{name}.prof")
        profiler.dump_stats(path)
        stats = pstats.Stats(profiler, stream=sys.stderr)
        print(f"---- {name}: top functions by cumulative time ({path}) ----", file=sys.stderr)
        stats.sort_stats("cumulative").print_stats(30)
        figures["profiled"] = True
    figures["total_s"] = time.perf_counter() - t0
    figures["peak_rss_mib"] = peak_rss_mib()
    figures["corral_from"] = os.path.dirname(os.path.dirname(sys.modules["corral"].__file__ or ""))
    figures["ok"] = True
    print(json.dumps(figures))


def run_once(name: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """One scenario in a fresh interpreter; its figures, or why it failed."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--seed", str(args.seed)]
    if args.quick:
        cmd.append("--quick")
    if args.profile:
        cmd += ["--profile", args.profile]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {
            "ok": False,
            "error": [f"TIMEOUT: killed after {args.timeout:.0f} s"],
            "process_s": time.perf_counter() - t0,
        }
    wall = time.perf_counter() - t0
    lines = proc.stdout.strip().splitlines()
    if args.profile:
        print(proc.stderr, file=sys.stderr)
    if proc.returncode != 0 or not lines:
        print(proc.stderr[-4000:], file=sys.stderr)
        return {
            "ok": False,
            "error": proc.stderr.strip().splitlines()[-1:] or ["no output"],
            "stderr": proc.stderr[-4000:],
            "process_s": wall,
        }
    figures: dict[str, Any] = json.loads(lines[-1])
    figures["process_s"] = wall
    return figures


def run_parent(names: list[str], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each scenario `args.repeat` times; keeps the run with the median target figure."""
    results: dict[str, dict[str, Any]] = {}
    env = dict(os.environ, PYTHONHASHSEED="0")
    src = args.src or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for name in names:
        runs = []
        for i in range(args.repeat):
            print(f"running {name} ({i + 1} of {args.repeat}) ...", file=sys.stderr, flush=True)
            runs.append(run_once(name, args, env))
            if not runs[-1].get("ok"):
                break
        if not all(r.get("ok") for r in runs):
            results[name] = next(r for r in runs if not r.get("ok"))
            continue
        key = TARGETS[name][0][0]
        runs.sort(key=lambda r: r[key])
        chosen = runs[(len(runs) - 1) // 2]
        if len(runs) > 1:
            chosen["runs_" + key] = [r[key] for r in runs]
            chosen["runs_peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
        results[name] = chosen
    return results


def source_version(src: str | None) -> str:
    """The commit benchmarked, with "+dirty" when src/ has uncommitted changes."""
    root = os.path.dirname(src) if src else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src/corral"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"tree at {src}" if src else "unknown"
    return commit + ("+dirty" if dirty else "")


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}" if value < 1 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(results: dict[str, dict[str, Any]], quick: bool) -> str:
    rows = [("scenario", "figure", "value", "target", "met")]
    for name, figures in results.items():
        if not figures.get("ok"):
            rows.append((name, "CRASHED", " ".join(figures.get("error", [])), "", "no"))
            continue
        for key, label, target, good in TARGETS[name]:
            value = figures[key]
            rows.append((name, label, fmt(value), target, "yes" if good(value) else "NO"))
            runs = figures.get("runs_" + key)
            if runs:
                met = sum(1 for v in runs if good(v))
                rows.append(
                    (
                        name,
                        f"  {len(runs)} runs (median above)",
                        " / ".join(fmt(v) for v in runs),
                        "",
                        f"{met} of {len(runs)}",
                    )
                )
        for key, label in INFO[name]:
            if key in figures:
                rows.append((name, label, fmt(figures[key]), "", ""))
        for message in figures.get("failed_checks", []):
            rows.append((name, "CHECK FAILED", message, "", "NO"))
        rss = figures["peak_rss_mib"]
        rows.append((name, "peak RSS MiB", fmt(rss), "< 1,024", "yes" if rss < RSS_LIMIT_MIB else "NO"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    size = "QUICK: 1/10 size, targets are for full size" if quick else "full size"
    header = f"Corral core benchmarks ({size})"
    return header + "\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", help=f"comma-separated scenarios: {', '.join(SCENARIOS)}")
    parser.add_argument("--json", metavar="OUT", help="write every figure as JSON to OUT")
    parser.add_argument("--quick", action="store_true", help="run each scenario at 1/10 size (smoke test)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each scenario N times (fresh processes) and report the median run",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds a scenario may run before it is killed and reported (default 1800)",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="run each scenario under cProfile: DIR/NAME.prof and the top 30 on stderr "
        "(figures are then inflated)",
    )
    parser.add_argument(
        "--src",
        metavar="DIR",
        help="benchmark the corral package under DIR instead of this checkout's src/ "
        "(e.g. a `git archive` snapshot of another commit)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_child(args.child, args.quick, args.seed, args.profile)
        return 0
    names = list(SCENARIOS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            parser.error(f"unknown scenario {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    version = source_version(args.src)
    load_before = os.getloadavg()[0]
    results = run_parent(names, args)
    load_after = os.getloadavg()[0]
    print(table(results, args.quick))
    print(
        f"source {version}; python {platform.python_version()}; {os.cpu_count()} CPUs; seed {args.seed}; "
        f"load average {load_before:.2f} before, {load_after:.2f} after"
        + ("; PROFILED: times are inflated" if args.profile else "")
    )
    if args.json:
        meta = {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "quick": args.quick,
            "seed": args.seed,
            "date": time.strftime("%Y-%m-%d"),
            "source": version,
            "profiled": bool(args.profile),
            "loadavg_1min_before_after": [load_before, load_after],
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
    return 0 if all(r.get("ok") and not r.get("failed_checks") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
