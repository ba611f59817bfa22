"""A gang's checkpoints (DESIGN.md 4.4, docs/job-spec.md): complete when every rank recorded the step,
every rank resumes from the same newest complete one; `stop_reason()` tells a checkpoint request
from a teardown; the checkpoint signal reaches a rank's main process, not its children. Real
workers of a real agent and control plane."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tests.agent.conftest import AgentProcess
from tests.agent.test_agent import state_is, submit
from tests.server.harness import Server, wait_for

# attempt 1: rank 0 records steps 10, 20, 36, rank 1 records 10 and 20, then fails; attempt 2:
# every rank writes where it resumes from
GANG = """
import json, os, sys, time
from pathlib import Path
from corral import job
out, rank, attempt = Path(sys.argv[1]), int(os.environ["RANK"]), job.attempt()
if attempt == 1:
    for step in (10, 20, 36) if rank == 0 else (10, 20):
        (job.step_dir(step) / f"shard-{rank}").write_text(str(step))
        job.record_checkpoint(step)
    if rank == 1:
        time.sleep(0.5)
        sys.exit(3)
    while not job.checkpoint_requested():
        time.sleep(0.05)
    (out / f"stop-{rank}").write_text(str(job.stop_reason()))
    sys.exit(0)
step = job.resume_step()
shard = job.resume_dir() / f"step-{step}" / f"shard-{rank}"
(out / f"resume-{rank}").write_text(json.dumps([step, shard.read_text()]))
"""

# the rank's main process starts a child; on the checkpoint signal it looks whether the child lives
PARENT = """
import os, subprocess, sys, time
from pathlib import Path
from corral import job
out = Path(sys.argv[1])
child = subprocess.Popen(["sleep", "60"])
(out / "ready").write_text(str(child.pid))
while not job.checkpoint_requested():
    time.sleep(0.05)
time.sleep(0.3)
state = "alive" if child.poll() is None else child.returncode
(out / "seen").write_text(f"{job.stop_reason()} child={state}")
child.kill()
"""


def test_every_rank_resumes_from_the_newest_step_every_rank_recorded(
    server: Server, agent: AgentProcess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    job_id = submit(
        server, replicas=2, gpus_per_replica=1, max_restarts=1, command=[sys.executable, "-c", GANG, str(out)]
    )
    # rank 1 fails: rank 0 is told the gang is torn down, not asked for a checkpoint
    assert wait_for(lambda: (out / "stop-0").exists() and (out / "stop-0").read_text(), timeout=30) == (
        "peer_failed"
    )
    done = wait_for(lambda: state_is(server, job_id, "finished", "failed"), timeout=60)
    assert done["state"] == "finished" and done["attempt"] == 2, done
    resumed = {r: json.loads((out / f"resume-{r}").read_text()) for r in (0, 1)}
    assert resumed == {0: [20, "20"], 1: [20, "20"]}  # not 36: rank 1 never recorded it
    record = json.loads((agent.checkpoints / job_id / "attempt-1" / "corral-checkpoint.json").read_text())
    assert record["step"] == 20


def test_the_checkpoint_signal_goes_to_the_rank_main_process_with_the_reason(
    server: Server, agent: AgentProcess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    job_id = submit(
        server,
        gpus_per_replica=1,
        command=[sys.executable, "-c", PARENT, str(out)],
        checkpoint={"signal": "SIGTERM", "grace": "10s"},
    )
    wait_for(lambda: (out / "ready").exists(), timeout=30)
    time.sleep(0.3)
    with server.client() as c:
        assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    assert wait_for(lambda: (out / "seen").exists() and (out / "seen").read_text(), timeout=15) == (
        "cancel child=alive"
    )
    wait_for(lambda: state_is(server, job_id, "cancelled"), timeout=15)
    assert "HTTP Request:" not in agent.output()  # no line per heartbeat, poll or report
    assert "stop (cancel)" in agent.output()
