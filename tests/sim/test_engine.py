"""The simulator engine: orderings, time limits, preemption costs, rejection, node failures."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from corral.config.cluster_file import parse_cluster_config
from corral.policies.registry import load_policy
from corral.sim import timeline
from corral.sim.engine import SimOptions, Simulation
from corral.sim.eventlog import EventLog
from corral.sim.trace import TraceJob


def cluster(nodes: int = 1, gpus: int = 4, **queue: Any) -> Any:
    queues = [{"name": "q", **queue}] if queue else [{"name": "q"}]
    return parse_cluster_config(
        {"nodes": [{"name": f"n[1-{nodes}]", "gpus": gpus}], "queues": queues}, source="t"
    )


def job(job_id: str, submit: float, duration: float, gpus: int = 4, **extra: Any) -> TraceJob:
    return TraceJob(job_id=job_id, submit_time=submit, duration=duration, gpus=gpus, replicas=1,
                    gpus_per_replica=gpus, queue="q", **extra)  # fmt: skip


def replay(jobs: list[TraceJob], policy: str, c: Any = None, **options: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    Simulation(
        c or cluster(), jobs, load_policy(policy), EventLog([events.append]), SimOptions(**options)
    ).run()
    return events


def starts(events: list[dict[str, Any]]) -> list[str]:
    return [e["job"] for e in events if e["event"] == "start"]


def test_sjf_runs_the_shortest_waiting_job_first_and_fifo_does_not() -> None:
    jobs = [job("first", 0, 100), job("long", 1, 1000), job("short", 2, 10)]
    assert starts(replay(jobs, "sjf")) == ["first", "short", "long"]
    assert starts(replay(jobs, "fifo")) == ["first", "long", "short"]


def test_time_limit_fails_the_attempt_and_the_log_is_ordered() -> None:
    events = replay([job("slow", 0, 500, time_limit=100.0)], "default")
    fail = next(e for e in events if e["event"] == "fail")
    assert fail["t"] == 100.0 and fail["reason"] == "time_limit"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert all(a.get("t", 0) <= b.get("t", 0) for a, b in itertools.pairwise(events))


def test_jobs_that_never_fit_are_rejected_and_the_run_goes_on() -> None:
    huge = TraceJob(
        job_id="huge", submit_time=0, duration=10, gpus=16, replicas=4, gpus_per_replica=4, queue="q"
    )
    events = replay([huge, job("ok", 1, 10)], "default")
    kinds = [(e["event"], e.get("job")) for e in events if e["event"] in ("reject", "finish")]
    assert ("reject", "huge") in kinds and ("finish", "ok") in kinds


def test_a_preempted_job_loses_work_since_its_last_checkpoint() -> None:
    c = cluster(nodes=1, gpus=4)
    jobs = [
        job("low", 0, 5000, priority="low", checkpoint_interval=1000.0),
        job("urgent", 2500, 100, priority="urgent"),
    ]
    events = replay(
        jobs, "default", c, preemption=__import__("corral.sim.jobmodel", fromlist=["x"]).PreemptionCost(0.0)
    )
    preempt = next(e for e in events if e["event"] == "preempt")
    # stopped at 2500 + 30 s grace: 2530 s of work done, 2000 kept, 530 s x 4 GPUs lost
    assert preempt["t"] == 2530.0 and abs(preempt["lost_gpu_seconds"] - 530 * 4) < 1e-6
    finish = {e["job"]: e["t"] for e in events if e["event"] == "finish"}
    assert finish["urgent"] == 2630.0 and finish["low"] == 2630.0 + 3000.0


def test_node_failures_requeue_attempts_and_the_run_ends() -> None:
    events = replay([job(f"j{i}", i * 10.0, 5000) for i in range(4)], "default", cluster(nodes=2),
                    node_mtbf=3000.0, node_repair=100.0, seed=3)  # fmt: skip
    assert any(e["event"] == "lost" for e in events)
    assert sum(e["event"] == "finish" for e in events) == 4


@pytest.mark.parametrize("fold", [False, True])
def test_periodic_checkpoints_are_reported_to_the_core(fold: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each checkpoint a job reaches (every `checkpoint_interval` seconds of work) is recorded on
    its running attempt, so that the core knows what a preemption would lose; none after the
    attempt ends, and a restarted attempt counts from the progress it kept. Folded into the next
    instant (`timeline.FOLD_CHECKPOINTS`), a checkpoint is not an instant `step` plays alone, but
    every instant after it sees it."""
    from corral.core.model import JobId

    monkeypatch.setattr(timeline, "FOLD_CHECKPOINTS", fold)
    c = cluster(nodes=1, gpus=4)
    jobs = [
        job("j", 0, 2500, gpus=2, checkpoint_interval=1000.0),
        job("a", 1500, 1, gpus=1),
        job("b", 2200, 1, gpus=1),
    ]
    sim = Simulation(c, jobs, load_policy("default"), EventLog([]), SimOptions())
    seen: list[tuple[float, float]] = []
    sim.begin()
    while sim.step():
        attempt = sim.state.running.get(JobId("j"))
        if attempt is not None:
            seen.append((sim.stats.end_time, attempt.last_checkpoint))
    assert ((1000.0, 1000.0) in seen and (2000.0, 2000.0) in seen) is not fold
    assert (1500.0, 1000.0) in seen and (2200.0, 2000.0) in seen and (2201.0, 2000.0) in seen
    assert max(t for t, _ in seen) == 2201.0  # nothing after the last checkpoint before its end
    assert [e for e in sim.events if e[0] > 2500.0] == []


def test_reported_checkpoints_make_default_take_the_victim_that_loses_least() -> None:
    """Two low jobs, one checkpointing every 100 s: an urgent job preempts the one that would lose
    less work (default's victim order), which the core knows only from reported checkpoints."""
    from corral.sim.jobmodel import PreemptionCost

    c = cluster(nodes=2, gpus=4)
    jobs = [
        job("saver", 0, 5000, priority="low", checkpoint_interval=100.0),  # started first: lost
        job("plain", 10, 5000, priority="low"),  # more since its start, but checkpointed at 1,000
        job("urgent", 1005, 100, priority="urgent"),
    ]
    events = replay(jobs, "default", c, preemption=PreemptionCost(0.0))
    preempt = next(e for e in events if e["event"] == "preempt")
    assert preempt["job"] == "saver" and preempt["lost_gpu_seconds"] < 100 * 4


def test_a_job_no_cycle_can_admit_is_rejected_though_nodes_keep_failing() -> None:
    """Queue b may borrow nothing (a lends none of its quota), so b's job can never start; with
    node failures, failures and repairs would follow one another for ever: the replay rejects
    the job once nothing runs and only failures are due, as it does without failures."""
    cfg = parse_cluster_config(
        {
            "nodes": [{"name": f"n{i}", "gpus": 8} for i in range(2)],
            "queues": [
                {"name": "a", "quota": 16, "lending_limit": 0, "cohort": "lab"},
                {"name": "b", "quota": 0, "cohort": "lab"},
            ],
        },
        source="t",
    )
    trace = [
        TraceJob(
            job_id="j0", submit_time=0.0, duration=600.0, gpus=1, replicas=1, gpus_per_replica=1, queue="a"
        ),
        TraceJob(
            job_id="j1", submit_time=10.0, duration=600.0, gpus=1, replicas=1, gpus_per_replica=1, queue="b"
        ),
    ]
    for mtbf in (None, 86_400.0, 300.0):
        events: list[dict[str, Any]] = []
        sim = Simulation(
            cfg,
            trace,
            load_policy("default"),
            EventLog([events.append]),
            SimOptions(node_mtbf=mtbf, node_repair=600.0),
        )
        sim.begin()
        steps = 0
        while sim.step():
            steps += 1
            assert steps < 10_000, f"the replay does not end (node_mtbf {mtbf})"
        ends = {e["job"]: e for e in events if e["event"] in ("finish", "reject")}
        assert ends["j0"]["event"] == "finish"
        assert ends["j1"]["event"] == "reject"
        assert "can never start" in ends["j1"]["reason"]
