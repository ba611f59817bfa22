"""The nodes as operators see them: state, GPUs allocated and free, health, heartbeat age, and
per GPU what runs on it (`GET /v1/nodes`)."""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import func, select

from corral.server.allocations import gpu_owners
from corral.server.auth import Principal
from corral.server.context import Context
from corral.store import schema


def gpus_of(
    ctx: Context, row: Any, owners: dict[tuple[str, int], Any], who: Principal
) -> list[dict[str, Any]]:
    """Each GPU of a node: its state, what runs on it (job ids of other teams hidden from members),
    and its NVML utilisation and memory where the node reports them."""
    unhealthy = json.loads(row["unhealthy"])
    samples = {s["index"]: s for s in ctx.node_status.samples(row["name"])}
    out = []
    for gpu in range(row["gpus"]):
        owner = owners.get((row["name"], gpu))
        if str(gpu) in unhealthy:
            state = "unhealthy"
        elif owner is not None:
            state = "allocated"
        else:
            state = "free" if row["state"] == "up" else row["state"]
        entry: dict[str, Any] = {"index": gpu, "state": state}
        if str(gpu) in unhealthy:
            entry["reason"] = unhealthy[str(gpu)]
        if owner is not None:
            mine = who.is_admin or owner.team == who.team
            entry.update(queue=owner.queue, job=owner.job_id if mine else None)
            if mine:
                entry.update(attempt=owner.attempt, user=owner.user)
        sample = samples.get(gpu)
        if sample is not None:
            entry.update({k: v for k, v in sample.items() if k != "index" and v is not None})
        out.append(entry)
    return out


def node_list(ctx: Context, who: Principal | None = None, with_gpus: bool = False) -> list[dict[str, Any]]:
    n, al = schema.nodes, schema.allocations
    now = time.monotonic()
    with ctx.engines.reader.connect() as conn:
        used: dict[str, int] = dict(
            conn.execute(select(al.c.node, func.count()).where(al.c.live == 1).group_by(al.c.node)).all()
        )
        rows = conn.execute(select(n).order_by(n.c.name)).mappings().all()
        owners = gpu_owners(conn) if with_gpus else {}
    out = []
    for row in rows:
        unhealthy = json.loads(row["unhealthy"])
        allocated = used.get(row["name"], 0)
        out.append(
            {
                "name": row["name"],
                "state": row["state"],
                "reason": row["reason"],
                "gpus": row["gpus"],
                "gpu_model": row["gpu_model"],
                "allocated": allocated,
                "unhealthy": unhealthy,
                "free": max(0, row["gpus"] - allocated - len(unhealthy))
                if row["state"] == "up" and row["responding"]
                else 0,
                "responding": bool(row["responding"]),
                "labels": json.loads(row["labels"]),
                "nvlink": json.loads(row["nvlink"]),
                "address": row["address"],
                "declared": bool(row["declared"]),
                "registered": bool(row["registered"]),
                "incarnation": row["incarnation"],
                "heartbeat_age_s": round(age, 3)
                if (age := ctx.node_status.heartbeat_age(row["name"], now)) is not None
                else None,
                "drain_deadline": row["drain_deadline"],
            }
        )
        if with_gpus and who is not None:
            out[-1]["gpu_list"] = gpus_of(ctx, row, owners, who)
    return out
