"""The checkpoint contract end to end across hosts (DESIGN.md 4.4): preemption, cancel and the time
limit all send the checkpoint signal to every rank on every host at once; the job saves within its
grace (`checkpoint: {signal: SIGTERM, grace: 10s}`) with the `corral.job` helper, and a preempted
job later resumes from that checkpoint having lost no more than its checkpoint interval."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.multihost.cluster import (
    MultiHost,
    events,
    job,
    steps_done,
    steps_job,
    wait_checkpoint,
    wait_state,
    worker_events,
)

GRACE = 10.0
EVERY = 10  # steps between periodic checkpoints


def only(evs: list[dict[str, Any]], kind: str, **match: Any) -> dict[str, Any]:
    (e,) = [e for e in evs if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]
    return e


def gpus(placement: list[dict[str, Any]]) -> set[tuple[str, int]]:
    return {(p["node"], g) for p in placement for g in p["gpus"]}


def saved_on_request(out: Path, attempt: int, ranks: int) -> dict[str, Any]:
    """Every rank saw the request and stopped; rank 0 wrote a checkpoint for it. Returns that."""
    assert {e["rank"] for e in worker_events(out, "stopped", attempt=attempt)} == set(range(ranks))
    return only(worker_events(out, "checkpoint", attempt=attempt, asked=True), "checkpoint")


def test_preemption_checkpoints_frees_the_gpus_and_resumes(cluster: MultiHost, tmp_path: Path) -> None:
    # a low-priority gang on all 12 GPUs of the three hosts
    victim_out, steps = tmp_path / "victim", 60
    victim = steps_job(
        cluster, victim_out, steps=steps, every=EVERY, step_s=0.1, replicas=3, priority="low", name="victim"
    )
    wait_state(cluster, victim, "running")
    wait_checkpoint(victim_out, attempt=1, step=EVERY)  # a periodic checkpoint exists

    # a high-priority gang of 2 x 4 GPUs arrives: only the victim's GPUs can hold it
    boss_out = tmp_path / "boss"
    boss = steps_job(cluster, boss_out, steps=10, every=100, step_s=0.1, priority="high", name="boss")
    assert wait_state(cluster, boss, "finished", timeout=30)["state"] == "finished"
    done = wait_state(cluster, victim, "finished", timeout=60)
    assert done["attempt"] == 2 and done["restarts"] == 0, done  # a preemption is no restart

    evs, boss_evs = events(cluster, victim), events(cluster, boss)
    preempting = only(evs, "preempting", attempt=1)
    preempted = only(evs, "preempt", attempt=1)
    assert preempting["by"] == boss and preempted["reason"] == f"preempted by {boss}", (preempting, preempted)
    # the victim saved within its grace: each rank got the signal, rank 0 checkpointed, all exited
    saved = saved_on_request(victim_out, attempt=1, ranks=3)
    assert preempting["t"] <= saved["t"] <= preempting["t"] + GRACE
    assert preempted["t"] - preempting["t"] <= GRACE + 2.0  # decision to GPUs free
    # its GPUs went to the new job, once they were free
    boss_start = only(boss_evs, "start", attempt=1)
    assert boss_start["t"] >= preempted["t"]
    assert gpus(boss_start["placement"]) <= gpus(only(evs, "start", attempt=1)["placement"])
    # attempt 2 resumed from the newest checkpoint of attempt 1 and lost at most one interval
    resumed = worker_events(victim_out, "start", attempt=2)
    assert {e["rank"] for e in resumed} == {0, 1, 2}
    assert all(e["resume_step"] == saved["step"] for e in resumed), (resumed, saved)
    assert max(steps_done(victim_out, 0, 1)) - saved["step"] <= EVERY
    assert only(evs, "start", attempt=2)["t"] >= only(boss_evs, "finish")["t"]
    for rank in range(3):
        done_2 = steps_done(victim_out, rank, 2)
        assert done_2 == list(range(saved["step"] + 1, steps + 1)), (rank, done_2[:3], saved)
    # rank 0's state is the checkpoint: with attempt 1 it covers every step, none skipped
    # (the other ranks are not in lockstep with it here: no collective between steps)
    done_1, done_2 = steps_done(victim_out, 0, 1), steps_done(victim_out, 0, 2)
    assert sorted(set(done_1[: done_1.index(saved["step"]) + 1]) | set(done_2)) == list(range(1, steps + 1))
    assert {e["rank"] for e in worker_events(victim_out, "finished", attempt=2)} == {0, 1, 2}


def test_cancel_takes_the_checkpoint_path(cluster: MultiHost, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job_id = steps_job(cluster, out, steps=100_000, every=EVERY, step_s=0.05, name="cancelled")
    wait_state(cluster, job_id, "running")
    wait_checkpoint(out, attempt=1, step=EVERY)
    with cluster.client() as c:
        assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    asked = time.time()
    done = wait_state(cluster, job_id, "cancelled", timeout=GRACE + 30)
    saved = saved_on_request(out, attempt=1, ranks=2)
    assert asked - 1 <= saved["t"] <= asked + GRACE
    record = cluster.checkpoints / job_id / "attempt-1" / "corral-checkpoint.json"
    assert json.loads(record.read_text())["step"] == saved["step"]
    assert done["reason"].startswith("cancelled by"), done
    # it saved and exited on its own: exit code 0, not a kill at the end of the grace (137)
    assert only(events(cluster, job_id), "cancel", attempt=1)["exit_code"] == 0


def test_time_limit_takes_the_checkpoint_path_and_fails(cluster: MultiHost, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job_id = steps_job(
        cluster,
        out,
        steps=100_000,
        every=EVERY,
        step_s=0.05,
        name="overtime",
        time_limit="3s",
        max_restarts=0,
    )
    running = wait_state(cluster, job_id, "running")
    failed = wait_state(cluster, job_id, "failed", timeout=3 + GRACE + 5)
    assert failed["reason"] == "time_limit", failed
    saved = saved_on_request(out, attempt=1, ranks=2)  # both hosts' ranks got the signal
    assert saved["t"] - running["start_time"] >= 3.0 - 0.5
    evs = events(cluster, job_id)
    ended = only(evs, "fail", attempt=1)
    assert ended["reason"] == "time_limit" and ended["t"] - only(evs, "start")["t"] < 3 + GRACE
    assert job(cluster, job_id)["reason"] == "time_limit"
