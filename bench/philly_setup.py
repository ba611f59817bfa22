"""Cluster files for replaying Philly: per virtual cluster (the Helios setup) or one shared cluster."""

from __future__ import annotations

from corral.config.cluster_file import ClusterConfig, parse_cluster_config
from corral.sim.trace import TraceJob


def vc_cluster(vc: str, nodes: int) -> ClusterConfig:
    """One VC on its own nodes of 8 GPUs, one queue (the Helios artifact's per-VC replay)."""
    return parse_cluster_config(
        {
            "name": f"philly-{vc}",
            "nodes": [{"name": f"n[001-{nodes:03d}]", "gpus": 8}],
            "queues": [{"name": vc}],
        },
        source=f"philly-{vc}",
    )


def shared_cluster(vc_nodes: dict[str, int], jobs: list[TraceJob], fraction: float) -> ClusterConfig:
    """All VCs on one cluster of `fraction` of the Helios size; each VC a queue with that quota.

    Nodes sit 16 to a leaf switch. VCs without nodes in the Helios setup get queues without quota.
    """
    total_nodes = round(sum(vc_nodes.values()) * fraction)
    quotas = {vc: int(n * 8 * fraction) for vc, n in vc_nodes.items()}
    queues = sorted({j.queue for j in jobs if j.queue})
    leaves = [
        {
            "name": f"n[{i + 1:03d}-{min(i + 16, total_nodes):03d}]",
            "gpus": 8,
            "labels": {"leaf": f"l{i // 16}"},
        }
        for i in range(0, total_nodes, 16)
    ]
    return parse_cluster_config(
        {
            "name": f"philly-shared-{fraction:g}",
            "topology": ["leaf"],
            "nodes": leaves,
            "queues": [{"name": q, "quota": quotas.get(q, 0)} for q in queues],
        },
        source="philly-shared",
    )
