"""What the agent does around a worker: cgroups, bind mounts, the user, NCCL settings, logs served
to `corral logs`, log tails and checkpoint reports (issue 5), with a real server and agent."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.agent.conftest import CLI, AgentProcess
from tests.agent.test_agent import events, job, state_is
from tests.server.harness import Server, wait_for

CLUSTER = """
name: sandbox
topology: [spine, leaf]
nodes:
  - name: dgx01
    gpus: 8
    gpu_model: H100-80GB
    labels: {{spine: s1, leaf: l1}}
    network: {{nccl_socket_ifname: lo, ib_hcas: [mlx5_0, mlx5_1], nccl_debug: WARN}}
queues:
  - {{name: research, weight: 1, quota: 8, mount_allowlist: ["{allowed}"]}}
  - {{name: prod, weight: 1, quota: 0}}
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, AgentProcess, Path]]:
    """A server whose `research` queue may mount under its `data` folder, and dgx01's agent (shared
    by this module's tests: each works with its own jobs)."""
    tmp_path = tmp_path_factory.mktemp("lab")
    allowed = tmp_path / "data"
    allowed.mkdir()
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER.format(allowed=allowed))
    srv = Server(f"sqlite:///{tmp_path / 'corral.db'}", tmp_path / "server", cluster)
    srv.start()
    agent = AgentProcess(srv, "dgx01", tmp_path)
    try:
        agent.wait_joined()
        yield srv, agent, allowed
    finally:
        agent.stop()
        srv.stop()


def submit(server: Server, token: str | None = None, **spec: Any) -> str:
    with server.client(token) if token else server.client() as c:
        r = c.post("/v1/jobs", json={"queue": "research", "max_restarts": 0, **spec})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def ended(server: Server, job_id: str, timeout: float = 30) -> dict[str, Any]:
    out: dict[str, Any] = wait_for(
        lambda: state_is(server, job_id, "finished", "failed", "cancelled"), timeout=timeout
    )
    return out


def test_mounts_are_bound_read_only_and_a_missing_source_fails_at_once(
    lab: tuple[Server, AgentProcess, Path], tmp_path: Path
) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed: `bash scripts/bwrap.sh` (CI installs it)")
    server, _, data = lab
    (data / "set").mkdir()
    (data / "set" / "labels.txt").write_text("cat\n")
    target, out = tmp_path / "mnt", tmp_path / "out"
    target.mkdir()
    out.mkdir()
    code = (
        "import os, sys; t = sys.argv[1]; o = sys.argv[2]; "
        "open(o + '/read', 'w').write(open(t + '/labels.txt').read()); "
        "ok = True\n"
        "try: open(t + '/new', 'w')\n"
        "except OSError: ok = False\n"
        "open(o + '/wrote', 'w').write(str(ok))"
    )
    job_id = submit(
        server,
        command=[*py(code), str(target), str(out)],
        mounts=[{"source": str(data / "set"), "target": str(target), "read_only": True}],
    )
    done = ended(server, job_id)
    assert done["state"] == "finished", done
    assert (out / "read").read_text() == "cat\n"
    assert (out / "wrote").read_text() == "False"  # read-only inside the job
    assert not (data / "set" / "new").exists() and not any(target.iterdir())  # bound, not copied

    missing = submit(
        server, command=py("pass"), mounts=[{"source": str(data / "gone"), "target": str(target)}]
    )
    done = ended(server, missing)
    assert done["state"] == "failed" and done["attempt"] == 1, done
    assert f"mount source {data / 'gone'} does not exist" in done["reason"], done
    assert [e["event"] for e in events(server, missing)] == ["submit", "start", "fail"]


def test_jobs_run_as_the_user_their_token_maps_to(
    lab: tuple[Server, AgentProcess, Path], tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the agent must run as root to start jobs as another user")
    server, _, _ = lab
    nobody = pwd.getpwnam("nobody")
    out = Path(tempfile.mkdtemp(prefix="corral-uid-"))  # pytest's tmp is closed to other users
    out.chmod(0o777)
    mapped = server.token("ada", "member", team="research", run_as="nobody")
    try:  # the venv's python lives under /root here, so nobody runs the shell's `id`
        job_id = submit(  # pytest's folders (the agent's data dir here) are closed to nobody
            server, mapped, command=["sh", "-c", 'echo "$(id -u) $(id -g)" > id'], working_dir=str(out)
        )
        assert ended(server, job_id)["state"] == "finished"
        assert (out / "id").read_text() == f"{nobody.pw_uid} {nobody.pw_gid}\n"
    finally:
        shutil.rmtree(out)

    ghost = server.token("bob", "member", team="research", run_as="no-such-user-here")
    job_id = submit(server, ghost, command=py("pass"))
    done = ended(server, job_id)
    assert done["state"] == "failed" and "user 'no-such-user-here' does not exist" in done["reason"], done


def test_a_setsid_escapee_dies_with_its_attempt(
    lab: tuple[Server, AgentProcess, Path], tmp_path: Path
) -> None:
    server, agent, _ = lab
    if "workers in cgroups" not in agent.output():
        pytest.skip("no writable cgroup hierarchy here: the agent uses process groups")
    pidfile = tmp_path / "escapee.pid"
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen(['setsid', 'sleep', '600']); "
        "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(600)"
    )
    job_id = submit(server, command=[*py(code), str(pidfile)], checkpoint={"grace": "1s"})
    wait_for(lambda: pidfile.exists() and pidfile.read_text(), timeout=20)
    pid = int(pidfile.read_text())
    wait_for(lambda: os.getsid(pid) == pid, timeout=10)  # its own session: a group kill misses it
    with server.client() as c:
        assert c.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    assert ended(server, job_id)["state"] == "cancelled"

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.split(") ")[1].startswith("Z")  # killed, not yet reaped by init

    wait_for(gone, timeout=10)


def test_nccl_settings_and_the_checkpoint_env_reach_the_worker(
    lab: tuple[Server, AgentProcess, Path], tmp_path: Path
) -> None:
    server, _, _ = lab
    out = tmp_path / "env.json"
    code = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
    job_id = submit(server, command=[*py(code), str(out)], checkpoint={"signal": "SIGUSR1"})
    assert ended(server, job_id)["state"] == "finished"
    env = json.loads(out.read_text())
    assert env["NCCL_SOCKET_IFNAME"] == "lo"
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert env["NCCL_DEBUG"] == "WARN"
    assert env["CORRAL_CHECKPOINT_SIGNAL"] == "SIGUSR1"
    assert Path(env["CORRAL_CONTROL_DIR"]).is_dir()


def test_logs_are_served_per_rank_to_the_team_and_a_failure_shows_its_tail(
    lab: tuple[Server, AgentProcess, Path],
) -> None:
    server, _, _ = lab
    # Rank 1 fails only once rank 0 has written all its lines (rank 0 connects to rank 1 when done),
    # so the gang's teardown cannot cut rank 0's log short.
    code = """
import os, socket, sys, time
r = os.environ['RANK']
port = int(os.environ['MASTER_PORT'])
if r == '1':
    server = socket.create_server(('127.0.0.1', port))
    server.settimeout(30)
for i in range(30):
    print(f'rank {r} line {i}', flush=True)
print(f'rank {r}: boom', file=sys.stderr, flush=True)
if r == '1':
    server.accept()
    sys.exit(3)
for _ in range(300):
    try:
        socket.create_connection(('127.0.0.1', port), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
"""
    job_id = submit(server, replicas=2, gpus_per_replica=1, command=py(code))
    done = ended(server, job_id)
    assert done["state"] == "failed" and done["exit_code"] == 3, done
    fail = next(e for e in events(server, job_id) if e["event"] == "fail")
    assert fail["rank"] == 1 and fail["log_tail"].endswith("rank 1: boom"), fail
    assert len(fail["log_tail"].splitlines()) == 20

    with server.client() as c:
        r = c.get(f"/v1/jobs/{job_id}/logs", params={"rank": 1})
        assert r.status_code == 200, r.text
        assert r.text.startswith("rank 1 line 0\n") and "rank 1: boom" in r.text
        assert r.headers["X-Corral-Node"] == "dgx01" and r.headers["X-Corral-Attempt"] == "1"
        assert int(r.headers["X-Corral-Size"]) == len(r.content)
        page = c.get(f"/v1/jobs/{job_id}/logs", params={"rank": 0, "offset": 14, "limit": 13})
        assert page.text == "rank 0 line 1"
        assert c.get(f"/v1/jobs/{job_id}/logs", params={"rank": 5}).status_code == 404
    other = server.token("eve", "member", team="prod")
    with server.client(other) as c:
        assert c.get(f"/v1/jobs/{job_id}/logs").status_code == 404  # another team's job

    env = {**os.environ, "CORRAL_SERVER": server.url, "CORRAL_TOKEN": server.admin_token}
    shown = subprocess.run([*CLI, "logs", job_id, "--rank", "1"], env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == "rank 1: boom"
    show = subprocess.run([*CLI, "show", job_id], env=env, capture_output=True, text=True)
    assert "last lines of rank 1's log (attempt 1):" in show.stdout and "  | rank 1: boom" in show.stdout


def test_a_recorded_checkpoint_reaches_the_scheduler(lab: tuple[Server, AgentProcess, Path]) -> None:
    server, _, _ = lab
    code = "from corral import job; import time; job.record_checkpoint(42); time.sleep(600)"
    before = time.time()
    job_id = submit(server, command=py(code), checkpoint={"grace": "1s"})
    engine = create_engine(server.database_url)

    def recorded() -> float | None:
        with engine.connect() as conn:
            value = conn.execute(
                text("SELECT last_checkpoint FROM attempts WHERE job_id = :j AND attempt = 1"), {"j": job_id}
            ).scalar()
        return float(value) if value is not None else None

    when = wait_for(recorded, timeout=20)
    assert before - 1 <= when <= time.time()
    with server.client() as c:
        c.post(f"/v1/jobs/{job_id}/cancel")
    assert ended(server, job_id)["state"] == "cancelled"
    engine.dispose()
    assert job(server, job_id)["attempt"] == 1


def test_the_log_server_refuses_unsigned_requests(lab: tuple[Server, AgentProcess, Path]) -> None:
    server, _, _ = lab
    engine = create_engine(server.database_url)
    with engine.connect() as conn:
        url = conn.execute(text("SELECT logs_url FROM nodes WHERE name = 'dgx01'")).scalar()
    engine.dispose()
    assert url
    assert httpx.get(f"{url}/logs/j1/1/0").status_code == 403
    bad = {"X-Corral-Signature": f"{int(time.time())}:{'0' * 64}"}
    assert httpx.get(f"{url}/logs/j1/1/0", headers=bad).status_code == 403
