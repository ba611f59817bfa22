"""Jobs that can never run say which constraint binds, with the right numbers, grammar and a fix
(issue 14, defect 9). Checked through the cycle's rejections (the simulator's `reject` events and
the scheduler's rejected jobs); the API answers 422 with the same reason and fix."""

from __future__ import annotations

from corral.core.model import JobSpec, NodeName, NodeSpec
from corral.core.state import ClusterState
from tests.helpers import job, nodes, run, state_of


def _rejected(state: ClusterState, spec: JobSpec) -> str:
    state.submit(spec)
    result = run(state)
    assert [r.job for r in result.rejections] == [spec.id], result.reasons
    return result.rejections[0].reason


def test_a_gang_larger_than_every_nvlink_domain_names_the_largest_domain() -> None:
    state = state_of(nodes(2, nvlink=((0, 1, 2, 3), (4, 5, 6, 7))))
    assert _rejected(state, job("j", gpus=8, pack="nvlink", required=True)) == (
        "needs 8 GPUs inside one NVLink domain (required); the largest NVLink domain holds 4 GPUs "
        "(fix: pack node instead (--pack node: NVLink domains of one node), or ask for at most 4 GPUs)"
    )


def test_when_the_gpu_model_binds_the_reason_says_so_not_the_cluster() -> None:
    a100 = NodeSpec(NodeName("a01"), 8, "A100-80GB", 80.0, labels={"spine": "s0", "leaf": "l0"})
    state = state_of([*nodes(3), a100])
    assert _rejected(state, job("j", gpus=8, replicas=2, model=("A100*",))) == (
        "needs 2 replicas of 8 GPUs with GPU model A100*; the nodes with it (a01) hold at most 1 replica "
        "even when empty (fix: ask for at most 1 replica, or accept other models too (--gpu-model H100-80GB))"
    )


def test_a_required_leaf_names_the_level_and_the_count() -> None:
    state = state_of(nodes(4, leaves=2))  # two leaves of two nodes
    assert _rejected(state, job("j", gpus=8, replicas=3, pack="leaf", required=True)) == (
        "needs 3 replicas of 8 GPUs inside one leaf (required); the largest leaf holds 2 replicas even "
        "when empty (fix: drop the requirement (--pack leaf without --pack-required), or ask for at most "
        "2 replicas)"
    )


def test_a_required_node_and_the_whole_cluster() -> None:
    state = state_of(nodes(2))
    assert _rejected(state, job("j", gpus=4, replicas=3, pack="node", required=True)) == (
        "needs 3 replicas of 4 GPUs inside one node (required); the largest node holds 2 replicas even "
        "when empty (fix: drop the requirement (--pack node without --pack-required), or ask for at most "
        "2 replicas)"
    )
    assert _rejected(state, job("k", gpus=8, replicas=3)) == (
        "needs 3 replicas of 8 GPUs; the whole cluster (16 GPUs) holds at most 2 replicas of 8 GPUs even "
        "when empty (fix: ask for at most 2 replicas, or fewer GPUs per replica)"
    )


def test_one_replica_is_singular() -> None:
    state = state_of(nodes(2))
    assert _rejected(state, job("j", gpus=8, replicas=2, pack="node", required=True)).startswith(
        "needs 2 replicas of 8 GPUs inside one node (required); the largest node holds 1 replica even "
        "when empty"
    )
    state = state_of(nodes(1, 4))
    assert _rejected(state, job("k", gpus=4, replicas=2)).startswith(
        "needs 2 replicas of 4 GPUs; the whole cluster (4 GPUs) holds at most 1 replica of 4 GPUs"
    )


def test_no_node_at_all_names_the_constraint_no_node_meets() -> None:
    state = state_of(nodes(2))
    assert _rejected(state, job("big", gpus=16)) == (
        "needs 16 GPUs per replica; the largest node has 8 (fix: use more replicas of at most 8 GPUs each "
        "(--replicas, --gpus-per-replica))"
    )
    assert _rejected(state, job("model", gpus=8, model=("B200",))) == (
        "no node has GPUs of model B200; models in the cluster: H100-80GB (fix: ask for a model the cluster "
        "has (--gpu-model), or leave the model out)"
    )
