"""Lines of the event log (DESIGN.md 4.6) that both writers build the same way: the simulator's
and the control plane's `cluster` line, and a placement as JSON."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from corral.core.model import NodeSpec, Placement, PriorityClass, QueueSpec


def cluster_line(
    levels: Iterable[str],
    nodes: Iterable[NodeSpec],
    queues: Iterable[QueueSpec],
    classes: Iterable[PriorityClass],
) -> dict[str, Any]:
    """The `cluster` event: topology levels, nodes (with GPU model and NVLink groups), queues, classes."""
    return {
        "event": "cluster",
        "topology": list(levels),
        "nodes": [
            {
                "name": n.name,
                "gpus": n.gpus,
                "gpu_model": n.gpu_model,
                "labels": dict(n.labels),
                "nvlink": [list(g) for g in n.nvlink],
            }
            for n in nodes
        ],
        "queues": [
            {"name": q.name, "weight": q.weight, "quota": q.quota, "limit": q.limit, "cohort": q.cohort}
            for q in queues
        ],
        "priority_classes": {p.name: p.value for p in classes},
    }


def placement_json(placement: Placement) -> list[dict[str, Any]]:
    """One entry per replica, in rank order: the node and its GPU indices."""
    return [{"node": r.node, "gpus": list(r.gpus)} for r in placement]
