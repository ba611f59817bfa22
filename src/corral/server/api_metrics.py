"""`/metrics`: the process metrics of the server and the scheduler (multiprocess mode) plus
gauges computed from the database at scrape time (pending jobs by queue, running jobs,
allocated, free and unhealthy GPUs, node heartbeat age)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from corral.server.allocations import gpu_owners
from corral.server.context import Context
from corral.server.leader import role
from corral.store import schema


class ClusterCollector(Collector):
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        j, n, al = schema.jobs, schema.nodes, schema.allocations
        with self.ctx.engines.reader.connect() as conn:
            by_state = conn.execute(
                select(j.c.queue, j.c.state, func.count())
                .where(j.c.state.in_(("pending", "starting", "running", "stopping")))
                .group_by(j.c.queue, j.c.state)
            ).all()
            nodes = conn.execute(select(n.c.name, n.c.state, n.c.gpus, n.c.unhealthy)).all()
            used: dict[str, int] = dict(
                conn.execute(select(al.c.node, func.count()).where(al.c.live == 1).group_by(al.c.node)).all()
            )
            owners = gpu_owners(conn)
            config = dict(
                conn.execute(
                    select(schema.settings.c.key, schema.settings.c.value).where(
                        schema.settings.c.key.in_(("config.active", "config.refused"))
                    )
                ).all()
            )
        pending = GaugeMetricFamily("corral_pending_jobs", "Jobs waiting, by queue", labels=["queue"])
        running = GaugeMetricFamily(
            "corral_running_jobs", "Jobs with a live attempt, by queue and state", labels=["queue", "state"]
        )
        for queue, state, count in by_state:
            if state == "pending":
                pending.add_metric([queue], count)
            else:
                running.add_metric([queue, state], count)
        gpus = GaugeMetricFamily(
            "corral_gpus", "GPUs by status (allocated, free, unhealthy, unavailable)", labels=["status"]
        )
        counts = {"allocated": 0, "free": 0, "unhealthy": 0, "unavailable": 0}
        for name, state, total, unhealthy in nodes:
            bad = len(json.loads(unhealthy))
            busy = used.get(name, 0)
            counts["allocated"] += busy
            counts["unhealthy"] += bad
            rest = max(0, total - busy - bad)
            counts["free" if state == "up" else "unavailable"] += rest
        for status, value in counts.items():
            gpus.add_metric([status], value)
        age = GaugeMetricFamily(
            "corral_node_heartbeat_age_seconds", "Seconds since each node's last heartbeat", labels=["node"]
        )
        now = time.monotonic()
        for name, seen in list(self.ctx.node_status.heartbeats.items()):
            age.add_metric([name], now - seen)
        yield from (pending, running, gpus, age)
        yield from _config_gauges(config)
        yield from self._per_gpu(owners)

    def _per_gpu(self, owners: dict[tuple[str, int], Any]) -> Iterator[Metric]:
        """Per GPU, labelled as NVIDIA's DCGM exporter labels its series (`Hostname`, `gpu`, `UUID`)
        so that `corral_gpu_allocated * on(Hostname, gpu) group_left DCGM_FI_DEV_GPU_UTIL` joins
        them: which job holds each GPU, and (from NVML, where the node has it) how busy it is."""
        labels = ["Hostname", "gpu", "UUID"]
        held = GaugeMetricFamily(
            "corral_gpu_allocated", "1 for each GPU a job holds", labels=[*labels, "job", "queue"]
        )
        util = GaugeMetricFamily(
            "corral_gpu_utilization_ratio", "GPU busy time (NVML), 0 to 1", labels=labels
        )
        memory = GaugeMetricFamily("corral_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=labels)
        job_util = GaugeMetricFamily(
            "corral_job_gpu_utilization_ratio",
            "Mean utilisation of a job's GPUs (NVML)",
            labels=["job", "queue"],
        )
        per_job: dict[tuple[str, str], list[float]] = {}
        samples = {
            (node, s["index"]): s
            for node, rows in list(self.ctx.node_status.gpu_samples.items())
            for s in rows
        }
        for (node, gpu), owner in owners.items():
            uuid = str(samples.get((node, gpu), {}).get("uuid", ""))
            held.add_metric([node, str(gpu), uuid, owner.job_id, owner.queue], 1)
        for (node, gpu), s in samples.items():
            key = [node, str(gpu), str(s.get("uuid", ""))]
            if s.get("utilization") is not None:
                util.add_metric(key, s["utilization"])
                owner = owners.get((node, gpu))
                if owner is not None:
                    per_job.setdefault((owner.job_id, owner.queue), []).append(s["utilization"])
            if s.get("memory_used_bytes") is not None:
                memory.add_metric(key, s["memory_used_bytes"])
        for (job, queue), values in per_job.items():
            job_util.add_metric([job, queue], sum(values) / len(values))
        yield from (held, util, memory, job_util)


def _config_gauges(settings: dict[str, str]) -> Iterator[Metric]:
    """The revision in force, and the last one the scheduler refused (0: none)."""
    refused = json.loads(settings["config.refused"]) if settings.get("config.refused") else {}
    yield GaugeMetricFamily(
        "corral_config_revision",
        "The active configuration revision",
        value=int(settings.get("config.active") or 0),
    )
    yield GaugeMetricFamily(
        "corral_config_refused_revision",
        "The last configuration revision the scheduler refused (0: none); see GET /v1/config",
        value=int(refused.get("revision", 0)),
    )


class LeaderCollector(Collector):
    """The leader lease as the database has it, and whether this replica holds it."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        with self.ctx.engines.reader.connect() as conn:
            said = role(conn, self.ctx.replica)
        yield GaugeMetricFamily(
            "corral_leader_epoch", "The leader lease's epoch (raised by every takeover)", value=said["epoch"]
        )
        yield GaugeMetricFamily(
            "corral_leader",
            "1 when this replica's scheduler holds the leader lease, else 0",
            value=int(said["scheduler"] == "leader"),
        )


def render(ctx: Context) -> tuple[bytes, str]:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        body = generate_latest(registry)
    else:
        body = generate_latest(REGISTRY)
    cluster = CollectorRegistry()
    cluster.register(ClusterCollector(ctx))
    from corral.server.notify import NotifyCollector

    cluster.register(NotifyCollector(ctx.engines.reader))
    cluster.register(LeaderCollector(ctx))
    return body + generate_latest(cluster), CONTENT_TYPE_LATEST
