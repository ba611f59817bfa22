"""An agent killed with -9: restarted in time it adopts its workers (they never stopped); gone
longer than its lease, its fence kills them and the job runs again once (DESIGN.md 6.1).

The server runs with `--lost-after 6`, so leases last 4 s; the defaults (30 s, 20 s) behave the
same, only slower (tests/multihost covers them across hosts)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corral.agent.sandbox import Capabilities
from tests.agent.conftest import AgentProcess
from tests.agent.test_agent import events, job, state_is
from tests.server.conftest import LAB
from tests.server.harness import Server, lost_after_server, wait_for

LOST_AFTER = 6.0
LEASE = LOST_AFTER * 2 / 3
STEPS = (
    "import os, sys, time; from pathlib import Path; "
    "out = Path(sys.argv[1]); n = int(sys.argv[2]); "
    "(out / f'pid-{os.environ[\"CORRAL_ATTEMPT\"]}').write_text(str(os.getpid())); "
    "[time.sleep(0.1) for _ in range(n)]"
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = lost_after_server(tmp_path, LAB, LOST_AFTER)
    try:
        yield srv
    finally:
        srv.stop()


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def submit(server: Server, out: Path, tenths: int) -> str:
    with server.client() as c:
        r = c.post(
            "/v1/jobs",
            json={"queue": "research", "command": [sys.executable, "-c", STEPS, str(out), str(tenths)]},
        )
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def groups_of(agent: AgentProcess) -> dict[str, set[str]]:
    """The attempt cgroups under each of the agent's bases: v2, and v1 cpu and memory (hybrid)."""
    caps = Capabilities.detect(agent.node, data_dir=agent.data_dir)
    if caps.cgroup_base is None:
        pytest.skip("no writable cgroup hierarchy here (CI runs as root with one)")
    bases = [caps.cgroup_base, *caps.v1_bases.values()]
    return {str(b): {p.name for p in b.iterdir() if p.is_dir()} for b in bases if b.is_dir()}


@dataclass
class FenceWatch:
    """Seconds from the last heartbeat the server accepted (its latest possible arrival)."""

    died: float  # until the worker was seen dead
    lost: float  # until the server was first seen to say the node is lost
    dead_when_lost: bool  # the worker was dead when the server was first seen to say so


def watch_fence(server: Server, pid: int) -> FenceWatch:
    """After the agent's death: poll the worker (every 20 ms) and the server's node listing until
    the node is lost. The server's monotonic clock is this machine's, so `heartbeat_age_s` read
    between two local readings bounds when the last heartbeat arrived."""
    killed = time.monotonic()
    died_at: float | None = None
    lost_at: float | None = None
    dead_when_lost = False
    beats: list[float] = []  # upper bounds of the last heartbeat's arrival, one per listing
    last_poll = 0.0
    with server.client() as c:
        while lost_at is None or died_at is None:
            now = time.monotonic()
            assert now - killed < LOST_AFTER + 20, f"worker dead at {died_at}, node lost at {lost_at}"
            if died_at is None and not alive(pid):
                died_at = now
            if lost_at is None and now - last_poll >= 0.2:
                last_poll = now
                node = next(n for n in c.get("/v1/nodes").json()["nodes"] if n["name"] == "dgx01")
                after = time.monotonic()
                if now - killed > 0.5:  # past any heartbeat still in flight at the kill
                    beats.append(after - node["heartbeat_age_s"])
                if node["state"] == "lost":
                    lost_at, dead_when_lost = after, died_at is not None
            time.sleep(0.02)
    assert beats
    last = min(beats)
    return FenceWatch(died_at - last, lost_at - last, dead_when_lost)


def kill_9(agent: AgentProcess) -> None:
    os.kill(agent.proc.pid, signal.SIGKILL)  # the agent only: workers and fence have sessions of their own
    agent.proc.wait()


@pytest.fixture
def slow_server(tmp_path: Path) -> Iterator[Server]:
    """The default leases (20 s): time for a loaded machine to start an agent again within one."""
    srv = lost_after_server(tmp_path, LAB, 30.0)
    try:
        yield srv
    finally:
        srv.stop()


def test_a_restarted_agent_adopts_its_running_workers(slow_server: Server, tmp_path: Path) -> None:
    server = slow_server
    out = tmp_path / "out"
    out.mkdir()
    first = AgentProcess(server, "dgx01", tmp_path)
    second = None
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    try:
        first.wait_joined()
        done_id = submit(server, earlier, 1)
        wait_for(lambda: state_is(server, done_id, "finished"), timeout=15)
        ran = (earlier / "pid-1").read_text()
        job_id = submit(server, out, 400)  # 40 s
        wait_for(lambda: state_is(server, job_id, "running"), timeout=15)
        pid = int(wait_for(lambda: (out / "pid-1").exists() and (out / "pid-1").read_text(), timeout=10))
        kill_9(first)
        time.sleep(1.0)
        assert alive(pid)  # nobody killed the workers
        second = AgentProcess(server, "dgx01", tmp_path)
        second.wait_joined()
        time.sleep(20 + 1)  # past the old lease: the new agent took it over
        assert alive(pid), second.output()
        done: dict[str, Any] = wait_for(lambda: state_is(server, job_id, "finished", "failed"), timeout=60)
        assert done["state"] == "finished" and done["attempt"] == 1, (done, second.output())
        assert "adopted 1 running ranks" in second.output()
        assert (earlier / "pid-1").read_text() == ran  # old start orders are not replayed
        # the adopted attempt's groups, v1 cpu and memory included, go when it ends
        wait_for(lambda: not any(groups_of(second).values()), timeout=10)
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_the_fence_kills_the_workers_of_a_dead_agent_and_the_job_runs_again_once(
    server: Server, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    first = AgentProcess(server, "dgx01", tmp_path)
    second = None
    try:
        first.wait_joined()
        job_id = submit(server, out, 600)
        wait_for(lambda: state_is(server, job_id, "running"), timeout=15)
        pid = int(wait_for(lambda: (out / "pid-1").exists() and (out / "pid-1").read_text(), timeout=10))
        kill_9(first)
        watch = watch_fence(server, pid)
        # the deadline that matters: the server declares the node lost LOST_AFTER after the last
        # heartbeat it accepted, and the job may run elsewhere then; the fence (lease LEASE from
        # that heartbeat's send time) must have killed the workers before
        assert watch.died <= LOST_AFTER, watch
        assert watch.dead_when_lost, watch
        fence_log = (first.data_dir / "fence.log").read_text()
        assert "lease expired: killed" in fence_log, fence_log
        # the server loses the node, then the job waits for GPUs (the only node is gone)
        waiting = wait_for(lambda: state_is(server, job_id, "pending"), timeout=LOST_AFTER + 10)
        assert waiting["attempt"] == 1
        lost = [e for e in events(server, job_id) if e["event"] == "lost"]
        assert lost and lost[0]["attempt"] == 1, lost
        second = AgentProcess(server, "dgx01", tmp_path)
        second.wait_joined()
        wait_for(lambda: (out / "pid-2").exists(), timeout=20)
        state = job(server, job_id)
        assert state["attempt"] == 2 and state["restarts"] == 0, state
        assert not alive(pid)
        starts = [e["attempt"] for e in events(server, job_id) if e["event"] == "start"]
        assert starts == [1, 2]
        # the dead agent's attempt left its groups (v2, v1 cpu and memory); the new agent removed them
        left = groups_of(second)
        assert left and all(names == {f"{job_id}-2"} for names in left.values()), left
    finally:
        first.stop()
        if second is not None:
            second.stop()
