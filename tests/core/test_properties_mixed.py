"""Hypothesis properties over mixed clusters: node sizes and GPU models, cohorts with lending
limits, classes with a minimum run time, per-node launch. Beside safety (the checks of
test_properties.check_cycle): liveness (a job that fits an idle cluster starts, and an idle
cluster with pending work that fits starts some), quota conservation (GPUs counted once per
queue; non-preemptible work only inside the quota), GPU models, per-node exclusivity and the
minimum run time of every victim."""

from __future__ import annotations

from dataclasses import fields
from fnmatch import fnmatchcase

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core.cycle import schedule
from corral.core.decisions import CycleResult
from corral.core.model import (
    JobId,
    JobSpec,
    Launch,
    NodeName,
    NodeSpec,
    PriorityClass,
    QueueName,
    QueueSpec,
    Topology,
)
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.core.test_properties import check_cycle

MODELS = ["H100-80GB", "A100-40GB"]
ACCEPTS = [(), (), ("H100*",), ("A100-40GB",), ("H100-80GB", "A100*")]
CLASSES = [("low", 0), ("normal", 100), ("high", 1000), ("urgent", 10000)]


@st.composite
def mixed_clusters(draw: st.DrawFn, max_nodes: int = 8) -> ClusterState:
    specs = []
    for i in range(draw(st.integers(1, max_nodes))):
        gpus = draw(st.sampled_from([2, 4, 8]))
        split = gpus > 2 and draw(st.booleans())
        nvlink = (tuple(range(gpus // 2)), tuple(range(gpus // 2, gpus))) if split else ()
        spine, leaf = draw(st.integers(0, 1)), draw(st.integers(0, 1))
        labels = {"spine": f"s{spine}", "leaf": f"s{spine}l{leaf}"}
        model = draw(st.sampled_from(MODELS))
        specs.append(NodeSpec(NodeName(f"n{i}"), gpus, model, labels=labels, nvlink=nvlink))
    total = sum(s.gpus for s in specs)
    queues, left = [], total
    for q in range(draw(st.integers(1, 3))):
        quota = draw(st.integers(0, left // 2))
        left -= quota
        queues.append(
            QueueSpec(
                QueueName(f"q{q}"),
                weight=draw(st.sampled_from([1.0, 2.0])),
                quota=quota,
                limit=draw(st.one_of(st.none(), st.integers(max(quota, 1), total))),
                cohort=draw(st.sampled_from(["", "x", "y"])),
                lending_limit=draw(st.one_of(st.none(), st.integers(0, quota))),
            )
        )
    runtimes = draw(st.lists(st.sampled_from([0.0, 100.0, 600.0]), min_size=4, max_size=4))
    classes = [PriorityClass(name, value, m) for (name, value), m in zip(CLASSES, runtimes, strict=True)]
    return ClusterState.build(("spine", "leaf"), specs, queues, classes)


@st.composite
def mixed_jobs(draw: st.DrawFn, state: ClusterState, start: int, count: int = 6) -> list[JobSpec]:
    result = []
    for i in range(draw(st.integers(1, count))):
        name, value = draw(st.sampled_from(CLASSES))
        pack = draw(st.sampled_from([None, None, "node", "leaf", "spine"]))
        per_node = draw(st.integers(0, 4)) == 0
        result.append(
            JobSpec(
                JobId(f"j{start + i}"),
                QueueName(f"q{draw(st.integers(0, len(state.queues) - 1))}"),
                replicas=draw(st.integers(1, 3)),
                gpus_per_replica=draw(st.sampled_from([1, 2, 4, 8])),
                priority=value,
                priority_class=name,
                seq=start + i,
                time_limit=draw(st.sampled_from([None, 100.0, 500.0, 2000.0])),
                preemptible=draw(st.integers(0, 5)) > 0,
                gpu_model=draw(st.sampled_from(ACCEPTS)),
                topology=Topology(pack, draw(st.booleans()) if pack else False),
                launch=Launch.PER_NODE if per_node else Launch.PER_GPU,
            )
        )
    return result


def _at(spec: JobSpec, now: float) -> JobSpec:
    return JobSpec(**{**{f.name: getattr(spec, f.name) for f in fields(spec)}, "submit_time": now})


def check_mixed(
    state: ClusterState,
    result: CycleResult,
    before: set[str],
    now: float,
    quotas: bool = True,
    exclusive: bool = True,
) -> None:
    check_cycle(state, result, before)
    for start in result.starts:
        spec = state.running[start.job].spec
        nodes = [state.node_ids[r.node] for r in start.placement]
        for node in nodes:
            model = state.specs[node].gpu_model
            assert not spec.gpu_model or any(fnmatchcase(model, p) for p in spec.gpu_model), (spec.id, model)
        if exclusive and spec.launch is Launch.PER_NODE:  # one process per node, the node the job's alone
            assert len(set(nodes)) == len(nodes), f"{spec.id}: two replicas of a per-node job on one node"
            for node in nodes:
                others = [a.spec.id for a in state.running.values() if a.spec.id != spec.id
                          and any(n == node for n, _ in a.placement)]  # fmt: skip
                assert not others, f"{spec.id} is per-node but shares {state.specs[node].name} with {others}"
    for p in result.preemptions:  # never a victim inside its minimum run time
        attempt = state.running[p.job]
        assert now - attempt.start >= state.min_runtime(attempt), (p, attempt.start, now)
    check_quotas(state, quotas)


def check_quotas(state: ClusterState, quotas: bool) -> None:
    """Quota conservation: every allocated GPU counted once, by the queue of the attempt that holds
    it; non-preemptible work only inside its queue's quota (for policies that admit by quota)."""
    allocated = sum(mask.bit_count() for mask in state.alloc)
    assert sum(q.alloc_gpus for q in state.queues.values()) == allocated
    firm: dict[str, int] = {}
    for attempt in state.running.values():
        if not attempt.spec.preemptible:
            firm[attempt.spec.queue] = firm.get(attempt.spec.queue, 0) + attempt.spec.gpus
    for name, gpus in firm.items() if quotas else ():
        quota = state.queues[QueueName(name)].spec.quota
        assert gpus <= quota, f"queue {name} runs {gpus} non-preemptible GPUs above its quota {quota}"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), policy=st.sampled_from(["default", "default", "fifo", "las", "tiresias"]))
def test_invariants_hold_over_mixed_histories(data: st.DataObject, policy: str) -> None:
    mixed_history(data, policy, exclusive=policy != "las")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_per_node_job_never_shares_its_node_under_las(data: st.DataObject) -> None:
    mixed_history(data, "las", exclusive=True)


def mixed_history(data: st.DataObject, policy: str, exclusive: bool) -> None:
    state = data.draw(mixed_clusters())
    profile = load_policy(policy)
    now, count = 0.0, 0
    for _ in range(data.draw(st.integers(1, 6))):
        for spec in data.draw(mixed_jobs(state, count)):
            state.submit(_at(spec, now))
            count += 1
        before = set(state.running)
        result = schedule(state, profile, now)
        check_mixed(state, result, before, now, quotas=policy == "default", exclusive=exclusive)
        now += data.draw(st.sampled_from([0.0, 50.0, 150.0, 700.0]))
        for job_id in list(state.running):
            attempt = state.running[job_id]
            stopping = attempt.preempting_deadline is not None and attempt.preempting_deadline <= now
            if stopping or attempt.limit_end <= now or data.draw(st.integers(0, 3)) == 0:
                state.end(job_id, requeue=stopping, now=now)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), later=st.sampled_from([1.0, 50.0, 99.0, 100.0, 150.0, 599.0, 600.0, 700.0]))
def test_no_victim_inside_its_minimum_run_time(data: st.DataObject, later: float) -> None:
    """A full cluster of low and normal work, then urgent work `later` seconds on (around the
    minimum run times drawn: 0, 100 or 600 s per class)."""
    state = data.draw(mixed_clusters())
    for spec in data.draw(mixed_jobs(state, 0, count=8)):
        if spec.priority < 1000:
            state.submit(spec)
    schedule(state, load_policy("default"), 0.0)
    for spec in data.draw(mixed_jobs(state, 100, count=3)):
        state.submit(_at(JobSpec(**{**_fields(spec), "priority": 10000, "priority_class": "urgent"}), later))
    before = set(state.running)
    result = schedule(state, load_policy(data.draw(st.sampled_from(["default", "las"]))), later)
    check_mixed(state, result, before, later, quotas=False)


def _fields(spec: JobSpec) -> dict[str, object]:
    return {f.name: getattr(spec, f.name) for f in fields(spec)}


def fits_idle(state: ClusterState, spec: JobSpec, quotas: bool) -> bool | None:
    """Brute force: could the gang run on this cluster with nothing else running? None when the
    answer depends on how much the queue may borrow (past its quota, more than no queue's quota
    covers: cohorts and lending limits decide, under a policy that admits by quota)."""
    queue = state.queues[spec.queue].spec
    if queue.limit is not None and spec.gpus > queue.limit:
        return False
    if not spec.preemptible and spec.gpus > queue.quota:  # rejected whatever the policy
        return False
    unguaranteed = state.total_gpus - sum(q.spec.quota for q in state.queues.values())
    if quotas and spec.gpus - queue.quota > unguaranteed:
        return None if _fits(state, spec) else False
    return _fits(state, spec)


def _fits(state: ClusterState, spec: JobSpec) -> bool:
    ok = [n for n, s in enumerate(state.specs)
          if not spec.gpu_model or any(fnmatchcase(s.gpu_model, p) for p in spec.gpu_model)]  # fmt: skip
    topo = state.topology
    if spec.topology.required and spec.topology.pack:
        span = topo.span_index(spec.topology.pack)
        if span == 1:  # one node (the strategies draw no `nvlink` pack)
            return any(_slots(state, spec, [n]) >= spec.replicas for n in ok)
        depth = topo.depth_of_span(span)
        domains = [[n for n in topo.domains[d].nodes if n in ok] for d in topo.by_depth[depth]]
    else:
        domains = [ok]
    return any(_slots(state, spec, nodes) >= spec.replicas for nodes in domains)


def _slots(state: ClusterState, spec: JobSpec, nodes: list[int]) -> int:
    g = spec.gpus_per_replica
    if spec.launch is Launch.PER_NODE:
        return sum(1 for n in nodes if state.specs[n].gpus >= g)
    return sum(state.specs[n].gpus // g for n in nodes)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_job_that_fits_an_idle_cluster_starts(data: st.DataObject) -> None:
    state = data.draw(mixed_clusters())
    (spec,) = data.draw(mixed_jobs(state, 0, count=1))
    state.submit(spec)
    policy = data.draw(st.sampled_from(["default", "fifo", "las"]))
    result = schedule(state, load_policy(policy), 0.0)
    started = [s.job for s in result.starts]
    fits = fits_idle(state, spec, quotas=policy == "default")
    if fits:
        assert started == [spec.id], f"{spec} fits the idle cluster but waits: {result.reasons.get(spec.id)}"
    elif fits is False:
        assert not started and [r.job for r in result.rejections] == [spec.id], (spec, result)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_an_idle_cluster_with_work_that_fits_starts_some(data: st.DataObject) -> None:
    state = data.draw(mixed_clusters())
    specs = data.draw(mixed_jobs(state, 0))
    for spec in specs:
        state.submit(spec)
    result = schedule(state, load_policy("default"), 0.0)
    check_mixed(state, result, set(), 0.0)
    fitting = [s.id for s in specs if fits_idle(state, s, quotas=True)]
    if fitting:
        assert result.starts, f"idle cluster, {fitting} fit, nothing started: {dict(result.reasons)}"


def test_the_strategies_reach_what_they_are_for() -> None:
    """The mixed strategies do produce mixed models, cohorts and per-node jobs (a smoke check)."""
    seen: set[str] = set()

    @settings(max_examples=60, deadline=None, database=None)
    @given(data=st.data())
    def sample(data: st.DataObject) -> None:
        state = data.draw(mixed_clusters())
        if len({s.gpu_model for s in state.specs}) > 1 and len({s.gpus for s in state.specs}) > 1:
            seen.add("mixed nodes")
        if len({q.spec.cohort for q in state.queues.values()}) > 1:
            seen.add("cohorts")
        if any(j.launch is Launch.PER_NODE for j in data.draw(mixed_jobs(state, 0))):
            seen.add("per-node")

    sample()
    assert seen == {"mixed nodes", "cohorts", "per-node"}, seen
