"""Placement: whole gangs, domain first, best fit, NVLink groups, filters and node states."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core.decisions import Why
from corral.core.model import JobSpec, NodeName, NodeSpec, NodeState
from corral.core.placement import Request
from tests.helpers import check_no_double_allocation, job, nodes, occupy, run, started_on, state_of


def test_gang_of_64_with_60_free_holds_nothing_and_smaller_work_proceeds() -> None:
    state = state_of(nodes(8, 8, leaves=2))
    state.submit(job("filler", gpus=4))
    run(state)
    state.submit(job("big", gpus=8, replicas=8))
    state.submit(job("small", gpus=2))
    result = run(state, 1.0)
    assert "big" not in started_on(result)
    assert started_on(result)["small"]
    assert result.reasons["big"].code in (Why.CAPACITY, Why.RESERVED)
    assert "needs 8 x 8 GPUs" in result.reasons["big"].message
    assert (
        "58 GPUs are free" in result.reasons["big"].message
        or "60 GPUs are free" in result.reasons["big"].message
    )
    assert state.alloc.count(0) == 7  # the gang took none of the free GPUs; small packed beside filler
    check_no_double_allocation(state)


def test_eight_ranks_land_in_one_nvlink_domain_not_on_scattered_gpus() -> None:
    wide = NodeSpec(
        NodeName("wide"),
        16,
        "H100-80GB",
        labels={"spine": "s0", "leaf": "l0"},
        nvlink=(tuple(range(8)), tuple(range(8, 16))),
    )
    tight = NodeSpec(NodeName("tight"), 8, "H100-80GB", labels={"spine": "s0", "leaf": "l0"})
    state = state_of([wide, tight])
    occupy(state, "a", "wide", [0, 1, 2, 3, 8, 9, 10, 11])  # 8 free on wide, scattered over two groups
    state.submit(job("eight", gpus=1, replicas=8))
    assert started_on(run(state, 1.0))["eight"] == ["tight"]


def test_gpus_inside_a_node_come_from_the_tightest_nvlink_group() -> None:
    node = NodeSpec(NodeName("n"), 8, "A100", nvlink=((0, 1, 2, 3), (4, 5), (6, 7)))
    state = state_of([node], levels=())
    state.submit(job("two", gpus=2))
    result = run(state)
    gpus = result.starts[0].placement[0].gpus
    assert set(gpus) in ({4, 5}, {6, 7})


def test_best_fit_packs_small_jobs_onto_the_fullest_node() -> None:
    state = state_of(nodes(3, 8))
    state.submit(job("six", gpus=6))
    run(state)
    state.submit(job("one", gpus=1))
    assert started_on(run(state, 1.0))["one"] == started_on_first(state, "six")


def started_on_first(state, job_id):  # type: ignore[no-untyped-def]
    attempt = state.running[job_id]
    return [state.specs[attempt.placement[0][0]].name]


def test_a_gang_prefers_one_leaf_and_fewest_nodes() -> None:
    state = state_of(nodes(8, 8, leaves=2))  # l0: n00-n03, l1: n04-n07
    state.submit(job("x", gpus=8, replicas=3, pack="leaf"))
    placed = started_on(run(state))["x"]
    leaves = {state.specs[state.node_ids[n]].labels["leaf"] for n in placed}
    assert len(placed) == 3 and len(leaves) == 1


def test_required_leaf_pack_waits_with_a_reason_when_no_leaf_has_room() -> None:
    state = state_of(nodes(4, 8, leaves=2))  # l0: n00, n01; l1: n02, n03 (16 GPUs each)
    occupy(state, "blocker", "n00", [0, 1, 2, 3])  # one blocker in each leaf: each leaf has 12 free,
    occupy(state, "blocker2", "n02", [0, 1, 2, 3])  # but only one whole node (n01, n03)
    state.submit(job("wide", gpus=8, replicas=2, pack="leaf", required=True))
    result = run(state, 1.0)
    assert "wide" not in started_on(result), "a leaf-required gang started across leaves"
    assert "wide" not in state.running
    assert result.reasons["wide"].code is Why.TOPOLOGY
    assert "inside one leaf" in result.reasons["wide"].message
    assert "the most free in one leaf is 12" in result.reasons["wide"].message
    # the cluster does have room across the leaves: the same gang without `required` starts there
    state.submit(job("loose", gpus=8, replicas=2, pack="leaf"))
    assert sorted(started_on(run(state, 2.0))["loose"]) == ["n01", "n03"]
    check_no_double_allocation(state)


def test_a_job_larger_than_any_leaf_with_required_leaf_is_rejected() -> None:
    state = state_of(nodes(4, 8, leaves=2))
    state.submit(job("huge", gpus=8, replicas=3, pack="leaf", required=True))
    result = run(state)
    assert [r.job for r in result.rejections] == ["huge"]
    assert "inside one leaf" in result.rejections[0].reason and "at most 2" in result.rejections[0].reason
    assert "huge" not in state.jobs


def test_unknown_gpu_model_is_rejected_naming_the_models() -> None:
    state = state_of(nodes(2, 8))
    state.submit(job("v", gpus=1, model=["V100*"]))
    result = run(state)
    assert "H100-80GB" in result.rejections[0].reason


def test_gpu_model_glob_filters_nodes() -> None:
    specs = nodes(2, 8, model="A100-40GB") + nodes(1, 8, prefix="h", model="H100-80GB")
    state = state_of(specs)
    state.submit(job("h", gpus=2, model=["H100*"]))
    assert started_on(run(state))["h"] == ["h00"]


def test_unhealthy_gpus_and_cordoned_nodes_get_no_new_work() -> None:
    state = state_of(nodes(2, 4))
    state.set_gpu_health(NodeName("n00"), 1, healthy=False)
    state.set_node_state(NodeName("n01"), NodeState.CORDONED)
    state.submit(job("three", gpus=3))
    state.submit(job("more", gpus=1))
    result = run(state)
    assert started_on(result) == {"three": ["n00"]}
    assert 1 not in result.starts[0].placement[0].gpus
    assert result.reasons["more"].code in (Why.CAPACITY, Why.RESERVED)


def test_rollback_restores_the_index_exactly() -> None:
    state = state_of(nodes(6, 8, leaves=3))
    state.submit(job("a", gpus=3))
    run(state)
    before = (list(state.alloc), list(state.index.avail), _buckets(state))
    checkpoint = state.plan.checkpoint()
    from corral.core.placement import place
    from corral.core.request import request_for

    placed = place(state, request_for(state, job("b", gpus=8, replicas=5)))
    assert isinstance(placed, list) and len(placed) == 5
    state.plan.rollback(checkpoint)
    after = (list(state.alloc), list(state.index.avail), _buckets(state))
    assert before[:2] == after[:2]
    assert len(before[2]) == len(state.topology.domains) > 4  # root, spine and three leaves
    for domain, (was, now) in enumerate(zip(before[2], after[2], strict=True)):
        assert was == now, f"domain {domain}: buckets {was} after rollback {now}"


def _buckets(state) -> list[dict[int, list[list[int]]]]:  # type: ignore[no-untyped-def]
    """Every domain's buckets: class -> nodes per available count (as sets: a rollback puts nodes
    back in reverse order, which only changes which of two equal nodes best fit names first)."""
    return [{cls: [sorted(b) for b in bl] for cls, bl in per.items()} for per in state.index.buckets]


def _cpu_job(job_id: str, gpus: int, cpus: int, replicas: int = 1) -> JobSpec:
    return dataclasses.replace(job(job_id, gpus=gpus, replicas=replicas), cpus_per_replica=cpus)


def test_a_gang_that_fits_one_node_by_gpus_is_not_put_where_its_cpus_are_gone() -> None:
    """The one-node shortcuts (tightest NVLink group, best fit) read GPU counts only: a node
    whose CPUs are all taken must not receive a replica that asks for CPUs."""
    specs = [
        NodeSpec(NodeName(name), 8, "H100-80GB", cpus=8, labels={"spine": "s0", "leaf": "l0"})
        for name in ("a", "b")
    ]
    state = state_of(specs)
    state.submit(_cpu_job("hungry", gpus=1, cpus=8))
    assert started_on(run(state))["hungry"] == ["a"]
    state.submit(_cpu_job("two", gpus=2, cpus=4))  # best fit by GPUs is a (7 free), which has no CPU
    assert started_on(run(state, 1.0))["two"] == ["b"]
    state.submit(_cpu_job("pair", gpus=1, cpus=2, replicas=2))  # b has the 4 CPUs left
    assert started_on(run(state, 2.0))["pair"] == ["b"]
    state.submit(_cpu_job("late", gpus=1, cpus=1))  # 11 GPUs free, no CPU anywhere: it waits
    result = run(state, 3.0)
    assert "late" not in started_on(result)
    assert min(state.free_cpus) == 0
    check_no_double_allocation(state)


@settings(max_examples=200, deadline=None)
@given(
    ints=st.lists(st.integers(0, 64), min_size=4, max_size=4),
    tuples=st.lists(st.lists(st.integers(0, 7), max_size=3).map(tuple), min_size=3, max_size=3),
    per_node=st.booleans(),
    memory=st.floats(0, 1024, allow_nan=False),
)
def test_a_request_hashes_as_the_dataclass_would(
    ints: list[int], tuples: list[tuple[int, ...]], per_node: bool, memory: float
) -> None:
    """`Request.__hash__` (written out, compiled natively) is the hash of the fields' tuple, the
    one dataclasses generate: sets and memories of requests see the same hashes either way."""
    req = Request(ints[0], ints[1], tuples[0], ints[2], per_node, ints[3], memory, tuples[1], tuples[2])
    assert hash(req) == hash(tuple(getattr(req, f.name) for f in dataclasses.fields(req)))
    assert req == dataclasses.replace(req) and hash(req) == hash(dataclasses.replace(req))
