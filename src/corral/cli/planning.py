"""`corral plan`: one scheduling cycle over job spec files on an empty cluster, as JSON-ready rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corral.config.cluster_file import DEFAULT_QUEUE, ClusterConfig
from corral.config.job_spec import load_job_spec, to_job_spec
from corral.core.cycle import schedule
from corral.core.model import JobId
from corral.core.state import ClusterState
from corral.policies.registry import load_policy


def state_for(cfg: ClusterConfig) -> ClusterState:
    """An empty cluster state built from a cluster file."""
    return ClusterState.build(cfg.topology, cfg.nodes, cfg.queues, cfg.priority_classes)


def plan_jobs(cfg: ClusterConfig, paths: Sequence[Path], policy: str) -> list[dict[str, Any]]:
    """Submit each job file in order, run one cycle at t=0, and describe each job's fate."""
    profile = load_policy(policy)
    state = state_for(cfg)
    default_queue = cfg.queues[0].name if cfg.queues else DEFAULT_QUEUE
    ids: list[JobId] = []
    for seq, path in enumerate(paths, start=1):
        request = load_job_spec(path)
        base = request.name or path.stem
        job_id = JobId(base if base not in ids else f"{base}-{seq}")
        spec = to_job_spec(
            request, job_id=job_id, seq=seq, submit_time=0.0, cluster=cfg, default_queue=default_queue
        )
        state.submit(spec)
        ids.append(job_id)
    result = schedule(state, profile, 0.0)
    starts = {s.job: s for s in result.starts}
    rejected = {r.job: r.reason for r in result.rejections}
    rows: list[dict[str, Any]] = []
    for job_id in ids:
        row: dict[str, Any] = {"id": job_id, "state": "pending", "placement": [], "reason": ""}
        if job_id in starts:
            row["state"] = "starting"
            row["placement"] = [{"node": p.node, "gpus": list(p.gpus)} for p in starts[job_id].placement]
        elif job_id in rejected:
            row["state"] = "rejected"
            row["reason"] = rejected[job_id]
        elif (reason := result.reason_of(job_id)) is not None:
            row["reason"] = reason.message
        rows.append(row)
    return rows
