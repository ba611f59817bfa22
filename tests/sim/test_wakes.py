"""Wakes under `tiresias` (issue 16): a waiting job whose candidates grow by time alone or by a
borrower's checkpoint, with nothing else happening, is taken up then, not at the next unrelated
event. Each scenario's unrelated event comes hours later, so a missing wake shows as a late start."""

from __future__ import annotations

from typing import Any

from corral.config.cluster_file import parse_cluster_config
from corral.policies.registry import load_policy
from corral.sim.engine import Simulation
from corral.sim.eventlog import EventLog
from corral.sim.trace import TraceJob


def two_queues() -> Any:
    """Two 8-GPU nodes, queues a and b, each guaranteed one node (8 GPUs), one cohort;
    class `normal` protects an attempt for 600 s."""
    return parse_cluster_config(
        {
            "nodes": [{"name": "n[1-2]", "gpus": 8}],
            "priority_classes": {"normal": {"value": 100, "min_runtime": "10m"}},
            "queues": [{"name": q, "quota": 8, "cohort": "lab"} for q in ("a", "b")],
        },
        source="t",
    )


def job(job_id: str, queue: str, submit: float, duration: float, **extra: Any) -> TraceJob:
    return TraceJob(job_id=job_id, submit_time=submit, duration=duration, gpus=8, replicas=1,
                    gpus_per_replica=8, queue=queue, priority="normal", **extra)  # fmt: skip


def replay(jobs: list[TraceJob], args: dict[str, Any]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    profile = load_policy("tiresias", {"tiresias": args})
    Simulation(two_queues(), jobs, profile, EventLog([events.append])).run()
    return events


def first(events: list[dict[str, Any]], kind: str, job_id: str) -> float:
    return next(float(e["t"]) for e in events if e["event"] == kind and e["job"] == job_id)


def test_a_job_reclaims_when_its_patience_ends() -> None:
    """b borrows a's node from t=0 and never checkpoints; a's job arrives at t=100 and may take
    only a borrower that would lose at most 100 s (`max_lost`) for 1,000 s (`patience`): at
    t=1,100 it takes a borrower (b1: equal lost work, then by id), which stops 30 s later (its
    grace). Without a wake at the patience's end it waited for the next event: b2 ending at
    t=20,000."""
    jobs = [
        job("b1", "b", 0.0, 50_000.0),
        job("b2", "b", 0.0, 20_000.0),
        job("a1", "a", 100.0, 1_000.0),
    ]
    events = replay(jobs, {"patience": 1_000.0, "max_lost": 100.0})
    assert first(events, "start", "a1") == 1_130.0
    assert first(events, "preempting", "b1") == 1_100.0


def test_a_job_reclaims_a_borrower_when_its_checkpoint_makes_it_cheap() -> None:
    """The same, with a patience of a day, and b's borrower b2 checkpointing every 2,000 s of
    work: from t=2,000 it would lose less than `max_lost` (100 s) for 100 s, so a cycle comes
    within that, halfway (the simulator serves the checkpoints of those 50 s with one cycle), and
    a's job takes b2 at t=2,050 (at t=600 its protection ended, but it had 600 s to lose). Without
    a cycle after the checkpoint a's job waited for the next event: b1 ending at t=20,000."""
    jobs = [
        job("b1", "b", 0.0, 20_000.0),
        job("b2", "b", 0.0, 50_000.0, checkpoint_interval=2_000.0),
        job("a1", "a", 100.0, 1_000.0),
    ]
    events = replay(jobs, {"patience": 86_400.0, "max_lost": 100.0})
    assert first(events, "start", "a1") == 2_080.0
    assert first(events, "preempting", "b2") == 2_050.0
