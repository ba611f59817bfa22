"""Lines of the event log (DESIGN.md 4.6), one constructor per kind, used by both writers (the
simulator and the control plane), so that a shadow replay compares like with like by
construction: `cluster`, `submit`, `start`, `preempting`, `reject`, and the endings (`preempt`,
`lost`, `restart`, `finish`, `fail`, `cancel`). A writer may add fields of its own (`extra`,
appended after the common ones: the simulator's `duration`, `span`, `lost_gpu_seconds`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from corral.core.model import JobSpec, NodeSpec, Placement, PriorityClass, QueueSpec


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


def submit_line(spec: JobSpec, t: float, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `submit` event: every field scheduling depends on."""
    line: dict[str, Any] = {
        "event": "submit",
        "t": t,
        "job": spec.id,
        "queue": spec.queue,
        "replicas": spec.replicas,
        "gpus_per_replica": spec.gpus_per_replica,
        "priority": spec.priority,
        "priority_class": spec.priority_class,
        "gpu_model": list(spec.gpu_model),
        "topology": {"pack": spec.topology.pack, "required": spec.topology.required},
        "time_limit": spec.time_limit,
        "preemptible": spec.preemptible,
        "user": spec.user,
    }
    if extra:
        line.update(extra)
    return line


def start_line(
    t: float, job: str, attempt: int, placement: list[dict[str, Any]], extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The `start` event; `placement` as `placement_json` makes it."""
    line: dict[str, Any] = {"event": "start", "t": t, "job": job, "attempt": attempt, "placement": placement}
    if extra:
        line.update(extra)
    return line


def preempting_line(t: float, job: str, attempt: int, by: str, deadline: float) -> dict[str, Any]:
    """The `preempting` event: the decision taken; the GPUs stay busy until the attempt stops."""
    return {"event": "preempting", "t": t, "job": job, "attempt": attempt, "by": by, "deadline": deadline}


def reject_line(t: float, job: str, reason: str) -> dict[str, Any]:
    """The `reject` event of a job that can never run."""
    return {"event": "reject", "t": t, "job": job, "reason": reason}


def ending_line(
    kind: str,
    t: float,
    job: str,
    attempt: int | None,
    reason: str = "",
    exit_code: int | None = None,
    rank: int | None = None,
    log_tail: str = "",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An ending (`preempt`, `lost`, `restart`, `finish`, `fail`, `cancel`): the attempt it ends
    (when there is one), and where known the reason, exit code, failing rank and its log's tail."""
    line: dict[str, Any] = {"event": kind, "t": t, "job": job}
    if attempt is not None:
        line["attempt"] = attempt
    if reason:
        line["reason"] = reason
    if exit_code is not None:
        line["exit_code"] = exit_code
    if rank is not None:
        line["rank"] = rank
    if log_tail:
        line["log_tail"] = log_tail
    if extra:
        line.update(extra)
    return line
