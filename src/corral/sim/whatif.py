"""What-if: the cluster's own history (`GET /v1/history`) replayed through the simulator twice,
under the configuration in force (the baseline) and under a proposed one, compared per queue.

The replay runs each job for the run time observed live (no topology slowdown, no restart
overhead: the observed run time already holds both), so the baseline should reproduce the live
waits; its fidelity (per queue, average wait replayed against live) is the first thing shown.
What it cannot reproduce: the live scheduler's cycle spacing (at least 20 ms, longer under load)
and the agents' start latency (the time between a decision and the `start` line), both of which
add to live waits and which the replay, deciding at once, does not have.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.config.cluster_file import ClusterConfig, parse_cluster_config
from corral.core.errors import ConfigError
from corral.core.plugins import Profile
from corral.policies.registry import load_policy
from corral.sim.engine import SimOptions, Simulation
from corral.sim.eventlog import EventLog
from corral.sim.jobmodel import PreemptionCost, Slowdown
from corral.sim.metrics import Measures
from corral.sim.trace import TraceJob

REPLAY_OPTIONS = SimOptions(slowdown=Slowdown(0.0, 0.0, 0.0), preemption=PreemptionCost(0.0, None))
OVERALL = "(all)"


def trace_jobs(rows: Sequence[Mapping[str, Any]]) -> list[TraceJob]:
    """The exported rows as trace jobs (their extra columns are the export's, not the trace's)."""
    return [
        TraceJob(
            job_id=str(r["job_id"]),
            submit_time=float(r["submit_time"]),
            duration=float(r["duration"]),
            gpus=int(r["gpus"]),
            queue=r.get("queue") or None,
            replicas=int(r["replicas"]),
            gpus_per_replica=int(r["gpus_per_replica"]),
            priority=r.get("priority") or None,
            gpu_model=tuple(m for m in str(r.get("gpu_model") or "").split("|") if m),
            time_limit=None if r.get("time_limit") in (None, "") else float(r["time_limit"]),
            preemptible=bool(r.get("preemptible", True)),
            checkpoint_interval=r.get("checkpoint_interval"),
            user=r.get("user") or None,
        )
        for r in rows
    ]


def node_entry(node: Mapping[str, Any]) -> dict[str, Any]:
    """A node of a `cluster` line as a cluster file's node entry."""
    gpus = int(node.get("gpus") or 0)
    entry: dict[str, Any] = {"name": node["name"], "gpus": gpus}
    if node.get("gpu_model"):
        entry["gpu_model"] = node["gpu_model"]
    if node.get("labels"):
        entry["labels"] = dict(node["labels"])
    groups = [list(g) for g in node.get("nvlink") or []]
    if gpus and groups:
        if groups == [list(range(gpus))]:
            entry["nvlink"] = "all"
        elif all(len(g) == 1 for g in groups):
            entry["nvlink"] = "none"
        else:
            entry["nvlink"] = groups
    return entry


def cluster_body(export: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A cluster file: the nodes as they were in the window, queues and classes of `config`
    (default: the configuration in force)."""
    body = copy.deepcopy(dict(config if config is not None else export["config"]))
    body["topology"] = list(export.get("topology") or body.get("topology") or [])
    body["nodes"] = [node_entry(n) for n in export["nodes"]]
    return body


def cluster_of(body: Mapping[str, Any], source: str) -> ClusterConfig:
    return parse_cluster_config(dict(body), source, strict=False)


@dataclass
class QueueFigures:
    """Per queue: waits, JCTs, preemptions and the GPU-seconds they lost, from one event log."""

    submit: dict[str, tuple[str, float]] = field(default_factory=dict)  # job -> (queue, t)
    started: set[str] = field(default_factory=set)
    waits: dict[str, list[float]] = field(default_factory=dict)
    wait_of: dict[str, float] = field(default_factory=dict)  # job -> its wait
    jcts: dict[str, list[float]] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)
    lost: dict[str, float] = field(default_factory=dict)

    def feed(self, event: Mapping[str, Any]) -> None:
        kind, job = event["event"], str(event.get("job"))
        if kind == "submit":
            self.submit[job] = (event["queue"], float(event["t"]))
            return
        if job not in self.submit:
            return
        queue, t0 = self.submit[job]
        if kind == "start" and job not in self.started:
            self.started.add(job)
            self.wait_of[job] = float(event["t"]) - t0
            self.waits.setdefault(queue, []).append(self.wait_of[job])
        elif kind == "finish":
            self.jcts.setdefault(queue, []).append(float(event["t"]) - t0)
        elif kind == "preempt":
            self.preemptions[queue] = self.preemptions.get(queue, 0) + 1
            self.lost[queue] = self.lost.get(queue, 0.0) + float(event.get("lost_gpu_seconds") or 0.0)


@dataclass
class Run:
    name: str
    measures: Measures
    queues: QueueFigures

    def summary(self) -> dict[str, Any]:
        return self.measures.summary()


def replay(cfg: ClusterConfig, jobs: Sequence[TraceJob], profile: Profile, name: str) -> Run:
    measures, figures = Measures(), QueueFigures()
    Simulation(cfg, jobs, profile, EventLog([measures.feed, figures.feed]), REPLAY_OPTIONS).run()
    return Run(name, measures, figures)


def proposed_body(
    baseline: Mapping[str, Any],
    *,
    queues: Sequence[Mapping[str, Any]] | None = None,
    revision_body: Mapping[str, Any] | None = None,
    policy: str | None = None,
    args: Mapping[str, Mapping[str, Any]] | None = None,
    queue_change: tuple[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The configuration to compare: the baseline with a revision's queues and policy, a queues
    file's queues, one queue's fields, or another policy and its arguments."""
    body = copy.deepcopy(dict(baseline))
    if revision_body is not None:
        for key in ("queues", "priority_classes", "default_priority", "policy", "policy_args"):
            if key in revision_body:
                body[key] = copy.deepcopy(revision_body[key])
            else:
                body.pop(key, None)
    if queues is not None:
        body["queues"] = [dict(q) for q in queues]
    if queue_change is not None:
        name, fields = queue_change
        entry = next((q for q in body.setdefault("queues", []) if q.get("name") == name), None)
        if entry is None:
            entry = {"name": name}
            body["queues"].append(entry)
        entry.update({k: v for k, v in fields.items() if v is not None})
    if policy is not None:
        body["policy"] = policy
        body.pop("policy_args", None)
    if args:
        body["policy_args"] = {k: dict(v) for k, v in args.items()}
    return body


def profile_of(body: Mapping[str, Any], default_policy: str) -> Profile:
    return load_policy(str(body.get("policy") or default_policy), body.get("policy_args"))


def check_proposed(body: Mapping[str, Any], default_policy: str) -> tuple[ClusterConfig, Profile]:
    """The proposed configuration, validated as the control plane would (ConfigError otherwise)."""
    cfg = parse_cluster_config(dict(body), "the proposed configuration", strict=False)
    return cfg, profile_of(body, default_policy)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def p99(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = 0.99 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def require_jobs(rows: Sequence[Mapping[str, Any]], counts: Mapping[str, int]) -> None:
    """A window with nothing that finished has nothing to replay: say so, and what was there."""
    if not any(r.get("observed") == "finished" for r in rows):
        seen = ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "no jobs at all"
        raise ConfigError(
            f"the window holds no finished job ({seen})",
            where="--since",
            fix="give a longer window (e.g. --since 14d), or wait until some jobs have finished",
        )
