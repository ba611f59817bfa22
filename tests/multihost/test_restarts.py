"""`kill -9` of one rank of a gang that spans two hosts (DESIGN.md 5): the whole gang stops (the
other host's ranks too), the job waits out its backoff and restarts as attempt 2 from the newest
checkpoint of attempt 1; once `max_restarts` is used up, the next kill fails the job with the exit
code in its reason."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from tests.multihost.cluster import (
    WORKER,
    MultiHost,
    events,
    job,
    steps_done,
    steps_job,
    submit,
    wait_checkpoint,
    wait_file,
    wait_state,
    worker_events,
)
from tests.server.harness import wait_for

EVERY = 5  # steps between periodic checkpoints


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_kill_9_restarts_the_gang_from_its_checkpoint_then_fails(cluster: MultiHost, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job_id = steps_job(cluster, out, steps=100_000, every=EVERY, step_s=0.05, max_restarts=1)

    # attempt 1 runs on two hosts and checkpoints; kill -9 rank 1 (not the master's host)
    wait_state(cluster, job_id, "running")
    pids = {rank: int(wait_file(out / f"pid-1-{rank}")) for rank in (0, 1)}
    wait_checkpoint(out, attempt=1, step=2 * EVERY)
    (first,) = [e for e in events(cluster, job_id) if e["event"] == "start"]
    assert len({p["node"] for p in first["placement"]}) == 2
    os.kill(pids[1], 9)
    killed = time.time()

    # the gang is over on both hosts: rank 0, on the other host, is stopped too
    restart = wait_for(
        lambda: [e for e in events(cluster, job_id) if e["event"] == "restart"], timeout=30, interval=0.05
    )[0]
    assert (restart["attempt"], restart["exit_code"], restart["rank"]) == (1, 137, 1), restart
    # noticed from the worker's exit, after the kill, not as a lost node (no wall-clock bound: the
    # event names the killed rank and its signal, which only the exit report can say)
    assert restart["t"] >= killed - 1.0, (restart, killed)
    assert not [e for e in events(cluster, job_id) if e["event"] == "lost"]
    wait_for(lambda: not alive(pids[0]), timeout=10)

    # attempt 2 after the backoff, resuming from attempt 1's newest checkpoint
    second = wait_state(cluster, job_id, "running", timeout=40)
    assert second["attempt"] == 2 and second["restarts"] == 1, second
    pids2 = {rank: int(wait_file(out / f"pid-2-{rank}")) for rank in (0, 1)}
    record = cluster.checkpoints / job_id / "attempt-1" / "corral-checkpoint.json"
    newest = json.loads(record.read_text())["step"]  # what attempt 1 recorded last
    starts = worker_events(out, "start", attempt=2)
    assert {e["rank"] for e in starts} == {0, 1}
    for e in starts:
        assert e["resume_step"] == newest and e["resume_dir"].endswith(f"{job_id}/attempt-1"), e
    lost = max(steps_done(out, 0, 1)) - newest
    assert 0 <= lost <= EVERY, (lost, newest)  # never more than the checkpoint interval
    wait_checkpoint(out, attempt=2, step=newest + EVERY)
    assert steps_done(out, 0, 2)[0] == newest + 1  # attempt 2 goes on from the checkpoint

    # the second kill (rank 0 this time) uses up max_restarts: the job fails and says why
    os.kill(pids2[0], 9)
    failed = wait_state(cluster, job_id, "failed", timeout=10)
    assert failed["exit_code"] == 137 and failed["attempt"] == 2, failed
    assert "137" in failed["reason"], failed["reason"]
    assert job(cluster, job_id)["reason"] == failed["reason"]  # what `GET /v1/jobs/{id}` shows
    wait_for(lambda: not alive(pids2[1]), timeout=10)
    kinds = [
        (e["event"], e.get("attempt"), e.get("exit_code"), e.get("rank")) for e in events(cluster, job_id)
    ]
    assert kinds[-1] == ("fail", 2, 137, 0), kinds
    # the ending carries the last lines of the failing rank's log (`corral show` prints them)
    tail = events(cluster, job_id)[-1].get("log_tail", "")
    assert f"rank 0 of attempt 2: resuming after step {newest}" in tail, tail
    assert [k[0] for k in kinds].count("start") == 2


def test_a_gang_finishes_only_when_every_host_has(cluster: MultiHost, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    job_id = submit(
        cluster,
        name="uneven",
        replicas=2,
        gpus_per_replica=4,
        command=[sys.executable, str(WORKER), "uneven"],
        env={"OUT": str(out), "SLOW_S": "2"},
    )
    done = wait_state(cluster, job_id, "finished", "failed", timeout=30)
    assert (out / "done-0").exists()
    assert (out / "done-1").exists(), f"rank 1 (on the other host) was stopped before it finished: {done}"
