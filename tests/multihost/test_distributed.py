"""Real distributed PyTorch across two hosts: a 2-replica gang of 4 GPUs each lands on two agents
in different network namespaces, and its ranks all-reduce over gloo with nothing but the
environment Corral gives them (DESIGN.md 4.3), once per GPU (`per_gpu`) and once through torchrun
(`per_node`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.multihost.cluster import WORKER, MultiHost, events, submit, wait_state

pytestmark = pytest.mark.usefixtures("torch_installed")


def run_allreduce(cluster: MultiHost, out: Path, launch: str) -> tuple[str, list[dict[str, Any]]]:
    out.mkdir()
    job_id = submit(
        cluster,
        name=f"allreduce-{launch}",
        replicas=2,
        gpus_per_replica=4,
        launch=launch,
        command=[sys.executable, str(WORKER), "allreduce" if launch == "per_gpu" else "torchrun"],
        env={"OUT": str(out)},
        max_restarts=0,
    )
    done = wait_state(cluster, job_id, "finished", "failed", timeout=90)
    assert done["state"] == "finished", (
        done,
        cluster.log("agent-h1")[-2000:],
        cluster.log("agent-h2")[-2000:],
    )
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    (start,) = [e for e in events(cluster, job_id) if e["event"] == "start"]
    return start, ranks


def check_gang(cluster: MultiHost, start: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
    placement = start["placement"]
    nodes = [p["node"] for p in placement]
    assert len(set(nodes)) == 2, placement  # 2 x 4 GPUs on nodes of 4: two hosts
    assert all(p["gpus"] == [0, 1, 2, 3] for p in placement), placement
    master = cluster.address(nodes[0])  # the address replica 0's node registered
    for rank, r in enumerate(ranks):
        assert r["rank"] == rank and r["world"] == 2
        assert r["sum"] == [1.0 + 2.0]  # every element: rank 0's 1 + rank 1's 2
        assert r["address"] == cluster.address(nodes[rank])  # it ran on its own host
        assert r["env"]["RANK"] == str(rank) and r["env"]["WORLD_SIZE"] == "2"
        assert r["env"]["MASTER_ADDR"] == master
        assert r["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
        assert r["hosts"] == [{"netns": x["netns"], "address": x["address"]} for x in ranks]
    assert ranks[0]["netns"] != ranks[1]["netns"]  # two network namespaces: two hosts
    assert ranks[0]["env"]["MASTER_PORT"] == ranks[1]["env"]["MASTER_PORT"]


def test_per_gpu_gang_all_reduces_across_two_hosts(cluster: MultiHost, tmp_path: Path) -> None:
    start, ranks = run_allreduce(cluster, tmp_path / "out", "per_gpu")
    check_gang(cluster, start, ranks)
    for rank, r in enumerate(ranks):
        assert r["env"]["NODE_RANK"] == str(rank) and r["env"]["LOCAL_RANK"] == "0"
        assert r["env"]["CORRAL_NUM_NODES"] == "2" and r["env"]["CORRAL_GPUS_PER_NODE"] == "4"
        assert 1024 <= int(r["env"]["MASTER_PORT"]) < 65536


def test_per_node_torchrun_all_reduces_across_two_hosts(cluster: MultiHost, tmp_path: Path) -> None:
    start, ranks = run_allreduce(cluster, tmp_path / "out", "per_node")
    check_gang(cluster, start, ranks)
    nodes = [p["node"] for p in start["placement"]]
    for rank, r in enumerate(ranks):
        node_env = r["node_env"]  # what Corral gave the node's process that ran torchrun
        assert node_env["NODE_RANK"] == str(rank) and node_env["RANK"] == str(rank)
        assert node_env["CORRAL_NUM_NODES"] == "2" and node_env["WORLD_SIZE"] == "2"
        assert node_env["MASTER_ADDR"] == cluster.address(nodes[0])
        assert node_env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
        assert node_env["address"] == cluster.address(nodes[rank])
        assert r["env"]["LOCAL_RANK"] == "0"  # torchrun's worker: one per node
    assert ranks[0]["node_env"]["MASTER_PORT"] == ranks[1]["node_env"]["MASTER_PORT"]
