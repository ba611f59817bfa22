"""The node agent runs real workers for a real control plane: environment, failures and restarts,
cancel by the checkpoint signal, and `per_node` launch (DESIGN.md 4.3, 4.4, 5)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.agent.conftest import AgentProcess
from tests.server.harness import Server, wait_for

DUMP_ENV = (
    "import json, os, sys; "
    "keys = [k for k in os.environ if k.startswith('CORRAL_') or k in ("
    "'RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'NODE_RANK', 'MASTER_ADDR', 'MASTER_PORT', "
    "'CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER', 'TORCHELASTIC_RUN_ID', 'OUT')]; "
    "name = 'rank-' + os.environ['RANK'] + '-' + str(os.getpid()) + '.json'; "
    "path = os.path.join(os.environ['OUT'], name); "
    "open(path, 'w').write(json.dumps({k: os.environ[k] for k in keys}))"
)


def submit(server: Server, **spec: Any) -> str:
    with server.client() as c:
        r = c.post("/v1/jobs", json={"queue": "research", **spec})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def job(server: Server, job_id: str) -> dict[str, Any]:
    with server.client() as c:
        out: dict[str, Any] = c.get(f"/v1/jobs/{job_id}").json()
        return out


def events(server: Server, job_id: str) -> list[dict[str, Any]]:
    with server.client() as c:
        out: list[dict[str, Any]] = c.get(f"/v1/jobs/{job_id}/events").json()["events"]
        return out


def state_is(server: Server, job_id: str, *states: str) -> dict[str, Any] | None:
    j = job(server, job_id)
    return j if j["state"] in states else None


def dumps_in(folder: Path) -> list[dict[str, str]]:
    return sorted(
        (json.loads(p.read_text()) for p in folder.glob("rank-*.json")), key=lambda e: int(e["RANK"])
    )


def test_per_gpu_job_runs_with_the_worker_environment(
    server: Server, agent: AgentProcess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    job_id = submit(
        server,
        name="env",
        replicas=2,
        gpus_per_replica=2,
        command=["python", "-c", DUMP_ENV],
        env={"OUT": str(out), "CORRAL_ANSWER": "42"},
    )
    done = wait_for(lambda: state_is(server, job_id, "finished", "failed"), timeout=20)
    assert done["state"] == "finished", (done, agent.output())
    envs = dumps_in(out)
    assert [e["RANK"] for e in envs] == ["0", "1"]
    (placement,) = [e["placement"] for e in events(server, job_id) if e["event"] == "start"]
    for rank, env in enumerate(envs):
        assert env["WORLD_SIZE"] == "2"
        assert env["LOCAL_RANK"] == str(rank) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["NODE_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert 29500 <= int(env["MASTER_PORT"]) < 30000
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(str(g) for g in placement[rank]["gpus"])
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["TORCHELASTIC_RUN_ID"] == f"{job_id}-1"
        assert env["CORRAL_JOB_ID"] == job_id and env["CORRAL_ATTEMPT"] == "1"
        assert env["CORRAL_NUM_NODES"] == "1" and env["CORRAL_GPUS_PER_NODE"] == "4"
        assert env["CORRAL_ANSWER"] == "42"
        assert env["CORRAL_CHECKPOINT_DIR"] == str(agent.checkpoints / job_id)
        assert Path(env["CORRAL_HOSTFILE"]).read_text() == "127.0.0.1 slots=4\n"
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert (agent.checkpoints / job_id / "attempt-1").is_dir()
    logs = agent.data_dir / "logs" / job_id / "attempt-1"
    assert sorted(p.name for p in logs.iterdir()) == ["rank-0.log", "rank-1.log"]


def test_a_failing_rank_ends_the_attempt_and_restarts_then_fails(server: Server, agent: AgentProcess) -> None:
    fail_rank_1 = "import os, sys, time; sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(600)"
    job_id = submit(
        server,
        name="flaky",
        replicas=2,
        gpus_per_replica=1,
        max_restarts=1,
        command=["python", "-c", fail_rank_1],
    )
    started = time.monotonic()
    failed = wait_for(lambda: state_is(server, job_id, "failed", "finished"), timeout=30, interval=0.1)
    assert failed["state"] == "failed" and failed["exit_code"] == 3, (failed, agent.output())
    assert time.monotonic() - started < 25
    kinds = [(e["event"], e.get("exit_code"), e.get("rank")) for e in events(server, job_id)]
    assert ("restart", 3, 1) in kinds and kinds[-1] == ("fail", 3, 1), kinds


def test_cancel_sends_the_checkpoint_signal(server: Server, agent: AgentProcess, tmp_path: Path) -> None:
    marker, ready = tmp_path / "got-sigterm", tmp_path / "ready"
    trap = (
        "import signal, sys, time; "
        f"signal.signal(signal.SIGTERM, lambda *_: (open({str(marker)!r}, 'w').write('TERM'), sys.exit(0))); "
        f"open({str(ready)!r}, 'w').close(); "
        "time.sleep(600)"
    )
    job_id = submit(
        server,
        name="sleeper",
        gpus_per_replica=1,
        command=["python", "-c", trap],
        checkpoint={"signal": "SIGTERM", "grace": "3s"},
    )
    wait_for(lambda: state_is(server, job_id, "running"), timeout=15)
    wait_for(ready.exists, timeout=30)  # its handler is installed
    with server.client() as c:
        assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    # the worker saved on the signal and exited on its own, within its grace: exit code 0, not a
    # kill at the end of the grace (no wall-clock bound: a loaded machine may take its time)
    done = wait_for(lambda: state_is(server, job_id, "cancelled"), timeout=30)
    assert marker.read_text() == "TERM"
    assert done["exit_code"] == 0, done


def test_cancel_kills_a_worker_that_ignores_the_signal(
    server: Server, agent: AgentProcess, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    job_id = submit(
        server,
        name="stubborn",
        gpus_per_replica=1,
        command=[
            "python",
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"open({str(ready)!r}, 'w').close(); time.sleep(600)",
        ],
        checkpoint={"grace": "1s"},
    )
    wait_for(lambda: state_is(server, job_id, "running"), timeout=15)
    wait_for(ready.exists, timeout=30)  # it ignores SIGTERM from now on
    with server.client() as c:
        assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    asked = time.monotonic()
    done = wait_for(lambda: state_is(server, job_id, "cancelled"), timeout=30)
    assert done["exit_code"] == 137  # killed: it ignored the signal
    assert time.monotonic() - asked >= 1.0  # but not before its grace was over


def test_per_node_launch_is_one_process_with_node_rank(
    server: Server, agent: AgentProcess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    job_id = submit(
        server,
        name="torchrun",
        replicas=1,
        gpus_per_replica=8,
        launch="per_node",
        command=["python", "-c", DUMP_ENV],
        env={"OUT": str(out)},
    )
    done = wait_for(lambda: state_is(server, job_id, "finished", "failed"), timeout=20)
    assert done["state"] == "finished", (done, agent.output())
    (env,) = dumps_in(out)
    assert env["NODE_RANK"] == "0" and env["CORRAL_NUM_NODES"] == "1" and env["CORRAL_GPUS_PER_NODE"] == "8"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" and env["LOCAL_WORLD_SIZE"] == "1"


def test_time_limit_stops_the_attempt_on_the_agent(server: Server, agent: AgentProcess) -> None:
    job_id = submit(
        server,
        name="overtime",
        gpus_per_replica=1,
        time_limit="2s",
        max_restarts=3,
        checkpoint={"grace": "1s"},
        command=["sleep", "600"],
    )
    wait_for(lambda: state_is(server, job_id, "running"), timeout=15)
    done = wait_for(lambda: state_is(server, job_id, "failed", "finished"), timeout=30)
    # SIGTERM at the limit; a time limit is final (DESIGN.md 4.2): no restart, reason `time_limit`
    assert done["state"] == "failed" and done["exit_code"] == 128 + 15, done
    assert done["reason"] == "time_limit" and done["attempt"] == 1, done
    ending = [e for e in events(server, job_id) if e["event"] == "fail"]
    assert ending and ending[0]["reason"] == "time_limit", ending
    (start,) = [e for e in events(server, job_id) if e["event"] == "start"]
    assert ending[0]["t"] - start["t"] >= 2.0  # not before the limit (no upper bound: a loaded machine)
