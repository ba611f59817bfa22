"""Failure handling across hosts (issue 6, DESIGN.md 5 and 6.1), with the server's defaults: a
heartbeat every 5 s (or more often), a lease of 20 s, a node lost after 30 s of silence.

- Two hosts cut off the network (`ip link set portN down` on the bridge), one whose agent was
  `kill -9`ed first and, 8 s later, one with its agent alive: each one's fence kills its workers
  within the lease, the nodes are declared lost, and their jobs resume on the third host from
  their newest checkpoints within 60 s of the cut; an append-only record kept by the job (host,
  attempt, step, monotonic time) proves that no two attempts ever ran at once. A job requeued
  onto the other cut-off host (silent, not yet lost) before it moves on is never launched there,
  not even when that host comes back. Healed, the hosts are readmitted only clean (`lost` until
  they register again with nothing the server has ended still running) and their reports and
  heartbeats under the old incarnation are refused.
- `kill -9` of an agent for 10 s: its workers run on (same pids), the restarted agent adopts and
  reports them, a cancel sent while it was down reaches them, and the other job finishes on
  attempt 1. For longer than lease and lost-after: the fence has killed them and the job runs
  elsewhere, once; the agent, started again, is readmitted without taking the job back.
- A declared GPU fault (`DATA_DIR/gpu-faults`): the gang on that GPU checkpoints and resumes on
  another host (a disruption, not a restart), the node is drained with the reason, and the GPU
  gets no new work.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.agent.records import read_record
from tests.multihost.cluster import (
    AGENT_HOSTS,
    MultiHost,
    events,
    job,
    steps_done,
    steps_job,
    wait_checkpoint,
    wait_file,
    wait_state,
    worker_events,
)
from tests.server.harness import wait_for

EVERY = 10  # steps between periodic checkpoints
STEP_S = 0.1
LEASE_S = 20.0  # the defaults this file checks (corral server without --lost-after)
LOST_AFTER_S = 30.0
RESUME_WITHIN_S = 60.0  # the bound: cut to work resumed elsewhere
AWAY_S = 60.0  # the figure: an agent killed for longer than lease and lost-after


# ---- the job's own record ---------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    address: str
    attempt: int
    kind: str  # begin | step
    step: int
    mono: float
    wall: float


def record(out: Path, rank: int = 0) -> list[Line]:
    path = out / f"record-{rank}.log"
    lines = path.read_text().splitlines() if path.exists() else []
    found = []
    for text in lines:
        parts = text.split()
        if len(parts) == 6:  # a line being written by a process killed mid-write is incomplete
            a, n, kind, step, mono, wall = parts
            found.append(Line(a, int(n), kind, int(step), float(mono), float(wall)))
    return found


def spans(lines: list[Line]) -> dict[int, tuple[set[str], float, float]]:
    """Per attempt: the hosts it ran on and the first and last moment it was seen alive."""
    out: dict[int, tuple[set[str], float, float]] = {}
    for x in lines:
        hosts, first, last = out.get(x.attempt, (set(), x.mono, x.mono))
        out[x.attempt] = (hosts | {x.address}, min(first, x.mono), max(last, x.mono))
    return out


def never_two_at_once(lines: list[Line]) -> dict[int, tuple[set[str], float, float]]:
    """The attempts' lifetimes, in order, do not overlap (each began after the previous one's
    last sign of life); returns them."""
    seen = spans(lines)
    ordered = sorted(seen.items(), key=lambda kv: kv[1][1])
    for (a, (_, _, end)), (b, (_, begin, _)) in itertools.pairwise(ordered):
        assert end < begin, f"attempts {a} and {b} ran at once: {a} last seen at {end}, {b} began at {begin}"
    assert [a for a, _ in ordered] == sorted(seen), ordered
    return seen


# ---- the cluster --------------------------------------------------------------------------------
def nodes(mh: MultiHost) -> dict[str, dict[str, Any]]:
    with mh.client() as c:
        return {n["name"]: n for n in c.get("/v1/nodes", params={"gpus": True}).json()["nodes"]}


def wait_node(mh: MultiHost, name: str, state: str, timeout: float = 30.0) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        n = nodes(mh)[name]
        return n if n["state"] == state else None

    out: dict[str, Any] = wait_for(reached, timeout=timeout, interval=0.1)
    return out


def node_action(mh: MultiHost, name: str, action: str) -> None:
    with mh.client() as c:
        r = c.post(f"/v1/nodes/{name}/{action}", json={})
        assert r.status_code == 200, r.text


def wait_attempt(mh: MultiHost, job_id: str, attempt: int, timeout: float) -> dict[str, Any]:
    """Wait until `attempt` of the job runs (its workers reported running)."""

    def reached() -> dict[str, Any] | None:
        j = job(mh, job_id)
        assert j["state"] not in ("finished", "failed", "cancelled"), j
        return j if j["state"] == "running" and j["attempt"] == attempt else None

    out: dict[str, Any] = wait_for(reached, timeout=timeout, interval=0.1)
    return out


def hosts_of(j: dict[str, Any]) -> set[str]:
    return {p["node"] for p in j["placement"]}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def agent_post(mh: MultiHost, path: str, body: dict[str, Any]) -> httpx.Response:
    """A call of the agents' API as `path`'s node (with its own join token)."""
    node = path.split("/")[3]
    with mh.client(mh.agent_tokens[node]) as c:
        return c.post(path, json=body)


class NodeWatch:
    """Every (state, reason, incarnation) each node went through, polled every 0.1 s."""

    def __init__(self, mh: MultiHost) -> None:
        self.mh = mh
        self.seen: dict[str, list[tuple[str, str, int]]] = {h: [] for h in AGENT_HOSTS}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> NodeWatch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(5)
        self._look()  # what the test saw last is seen here too

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            self._look()

    def _look(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            for name, n in nodes(self.mh).items():
                now = (n["state"], n["reason"], n["incarnation"])
                if not self.seen[name] or self.seen[name][-1] != now:
                    self.seen[name].append(now)

    def states(self, name: str) -> list[str]:
        out: list[str] = []
        for state, _, _ in self.seen[name]:
            if not out or out[-1] != state:
                out.append(state)
        return out


@pytest.fixture
def failures(cluster: MultiHost) -> Iterator[MultiHost]:
    """The cluster, put back together after the test whatever it broke: links up, agents running,
    no declared GPU faults, every node `up`."""
    try:
        yield cluster
    finally:
        for host in AGENT_HOSTS:
            cluster.heal(host)
            faults = cluster.agent_dir(host) / "gpu-faults"
            faults.unlink(missing_ok=True)
            if cluster.procs[f"agent-{host}"].poll() is not None:
                cluster.start_agent(host)
        for host in AGENT_HOSTS:
            state = nodes(cluster)[host]["state"]
            if state in ("cordoned", "draining"):
                node_action(cluster, host, "undrain")

        def together() -> bool:
            now = nodes(cluster)
            return all(now[h]["state"] == "up" and not now[h]["unhealthy"] for h in AGENT_HOSTS)

        wait_for(together, timeout=LOST_AFTER_S + 15, interval=0.2)


def place_on(mh: MultiHost, host: str, out: Path, **spec: Any) -> str:
    """Submit a `steps` job (1 replica) while every other node is cordoned, so that it runs on
    `host`; the others are left as they were. Returns the job's id once it runs."""
    others = [h for h in AGENT_HOSTS if h != host and nodes(mh)[h]["state"] == "up"]
    for h in others:
        node_action(mh, h, "cordon")
    try:
        body: dict[str, Any] = {"steps": 100_000, "every": EVERY, "step_s": STEP_S} | spec
        job_id = steps_job(
            mh, out, body.pop("steps"), body.pop("every"), body.pop("step_s"), replicas=1, **body
        )
        running = wait_state(mh, job_id, "running")
        assert hosts_of(running) == {host}, running
    finally:
        for h in others:
            node_action(mh, h, "undrain")
    return job_id


def newest_checkpoint(mh: MultiHost, job_id: str, attempt: int) -> int:
    path = mh.checkpoints / job_id / f"attempt-{attempt}" / "corral-checkpoint.json"
    step: int = json.loads(path.read_text())["step"]
    return step


def fenced(mh: MultiHost, host: str, job_id: str, attempt: int) -> bool:
    log = mh.agent_dir(host) / "fence.log"
    text = log.read_text() if log.exists() else ""
    return f"lease expired: killed {job_id} attempt-{attempt}" in text


def resumed_from_checkpoint(mh: MultiHost, out: Path, job_id: str, attempt: int = 2) -> int:
    """`attempt` began at attempt 1's newest checkpoint (none in between ran) and attempt 1 lost at
    most one checkpoint interval; returns that checkpoint's step."""
    newest = newest_checkpoint(mh, job_id, 1)
    (start,) = wait_for(lambda: worker_events(out, "start", attempt=attempt), timeout=10)
    assert start["resume_step"] == newest and start["resume_dir"].endswith(f"{job_id}/attempt-1"), start
    assert newest >= EVERY, newest
    assert 0 <= max(steps_done(out, 0, 1)) - newest <= EVERY  # the work lost: since the checkpoint
    wait_for(lambda: steps_done(out, 0, attempt), timeout=10)
    assert steps_done(out, 0, attempt)[0] == newest + 1
    return newest


def kinds(mh: MultiHost, job_id: str) -> list[str]:
    """The job's events after its submission, by kind."""
    return [e["event"] for e in events(mh, job_id) if e["event"] != "submit"]


def requeued_not_restarted(mh: MultiHost, job_id: str, kind: str, attempt: int = 2) -> dict[str, Any]:
    """Every attempt before `attempt` ended as `kind` (a disruption): no restart counted, one start
    per attempt. Returns attempt 1's ending."""
    j = job(mh, job_id)
    assert j["restarts"] == 0 and j["attempt"] == attempt, j
    evs = events(mh, job_id)
    ends = [e for e in evs if e["event"] not in ("submit", "start", "preempting")]
    assert [(e["event"], e["attempt"]) for e in ends] == [(kind, n) for n in range(1, attempt)], evs
    assert [e["attempt"] for e in evs if e["event"] == "start"] == list(range(1, attempt + 1)), evs
    return ends[0]


# ---- the tests ----------------------------------------------------------------------------------
def test_cut_off_hosts_are_fenced_their_jobs_resume_elsewhere_and_they_return_clean(
    failures: MultiHost, tmp_path: Path
) -> None:
    mh = failures
    alive_host, killed_host, spare = AGENT_HOSTS  # h1: agent alive; h2: agent kill -9ed first; h3
    outs = {h: tmp_path / h for h in (alive_host, killed_host)}
    jobs = {h: place_on(mh, h, outs[h], gpus_per_replica=2) for h in outs}
    pids = {h: int(wait_file(outs[h] / "pid-1-0")) for h in outs}
    for h in outs:
        wait_checkpoint(outs[h], attempt=1, step=2 * EVERY)
    before = nodes(mh)
    addresses = {h: mh.address(h) for h in AGENT_HOSTS}
    cut: dict[str, float] = {}  # wall clock
    cut_mono: dict[str, float] = {}

    with NodeWatch(mh) as watch:
        # h2 first (agent killed, then cut), h1 8 s later: h2 is lost while h1, silent but not yet
        # lost, still has 2 free GPUs, so h2's job may be sent there first, to a host that is cut
        # off: that attempt must end `lost` too and never run, not even when h1 comes back
        mh.kill_agent(killed_host)
        cut[killed_host], cut_mono[killed_host] = time.time(), time.monotonic()
        mh.cut(killed_host)
        time.sleep(8)
        cut[alive_host], cut_mono[alive_host] = time.time(), time.monotonic()
        mh.cut(alive_host)

        # both jobs run again on the spare host, from their checkpoints, within 60 s of the cut
        final: dict[str, int] = {}
        for h, job_id in jobs.items():

            def on_spare(job_id: str = job_id) -> dict[str, Any] | None:
                j = job(mh, job_id)
                return j if j["state"] == "running" and hosts_of(j) == {spare} else None

            final[h] = wait_for(on_spare, timeout=RESUME_WITHIN_S + 5, interval=0.1)["attempt"]
        assert final[alive_host] == 2, final
        for h, job_id in jobs.items():
            out, attempt = outs[h], final[h]
            wait_for(lambda out=out, n=attempt: [x for x in record(out) if x.attempt == n], timeout=10)
            (begin,) = [x for x in record(out) if x.attempt == attempt and x.kind == "begin"]
            assert begin.wall - cut[h] <= RESUME_WITHIN_S, (h, begin.wall - cut[h])
            # the fence killed the cut-off host's worker, before the job began again
            assert fenced(mh, h, job_id, 1), (mh.agent_dir(h) / "fence.log").read_text()
            assert not alive(pids[h]) and pids[h] not in mh.host_pids(h)
            seen = never_two_at_once(record(out))
            assert seen[1][0] == {addresses[h]} and seen[attempt][0] == {addresses[spare]}, seen
            # within the lease (20 s, counted from a heartbeat sent before the cut): dead before
            # the node was declared lost (30 s)
            assert seen[1][2] - cut_mono[h] <= LEASE_S + 1.5, (h, seen[1][2] - cut_mono[h])
            assert set(seen) == {1, attempt}, seen  # an attempt in between never ran
            newest = resumed_from_checkpoint(mh, out, job_id, attempt)
            assert newest >= 2 * EVERY
            lost = requeued_not_restarted(mh, job_id, "lost", attempt)
            assert f"node {h} lost" in lost["reason"], lost
            assert nodes(mh)[h]["state"] == "lost"
            # a lost node's stale reports are refused: the attempt has ended, its incarnation is over
            incarnation = before[h]["incarnation"]
            for status in ("running", "exited"):
                body = {
                    "incarnation": incarnation,
                    "job": job_id,
                    "attempt": 1,
                    "status": status,
                    "exit_code": 0,
                }
                r = agent_post(mh, f"/v1/agents/{h}/reports", body)
                assert r.status_code == 409, (status, r.text)
            r = agent_post(mh, f"/v1/agents/{h}/heartbeat", {"incarnation": incarnation})
            assert r.status_code == 409 and "lost" in r.json()["error"], r.text

        # healed (the killed agent started again with its data directory): readmitted only clean
        for h in outs:
            mh.heal(h)
        mh.start_agent(killed_host)
        for h in outs:
            back = wait_node(mh, h, "up", timeout=30)
            assert back["incarnation"] > before[h]["incarnation"], (before[h], back)
        time.sleep(1)  # the returned agents' first look at their orders
    for h in outs:
        states = watch.states(h)
        assert states[-2:] == ["lost", "up"] and "up" in states[:-2], (h, watch.seen[h])
        # what the server still had running there (nothing) is all it accepted: no attempt moved
        for job_id in jobs.values():
            j = job(mh, job_id)
            assert j["state"] == "running" and hosts_of(j) == {spare}, j
        # reports and heartbeats of the old incarnation are refused
        incarnation = before[h]["incarnation"]
        body = {"incarnation": incarnation, "job": jobs[h], "attempt": 1, "status": "exited", "exit_code": 0}
        r = agent_post(mh, f"/v1/agents/{h}/reports", body)
        assert r.status_code == 409 and "stale incarnation" in r.json()["error"], r.text
        r = agent_post(mh, f"/v1/agents/{h}/heartbeat", {"incarnation": incarnation})
        assert r.status_code == 409 and "stale incarnation" in r.json()["error"], r.text
    for h, job_id in jobs.items():
        assert kinds(mh, job_id) == ["start", "lost"] * (final[h] - 1) + ["start"], events(mh, job_id)
        seen = never_two_at_once(record(outs[h]))
        assert set(seen) == {1, final[h]}, seen
        # an attempt sent to a host while it was cut off never ran, and was never even launched
        # once the host came back: it had ended (lost) by then
        for attempt in range(2, final[h]):
            assert not (outs[h] / f"pid-{attempt}-0").exists(), attempt
            placed = {
                p["node"]
                for e in events(mh, job_id)
                if e["event"] == "start" and e["attempt"] == attempt
                for p in e["placement"]
            }
            for host in placed:
                launched = read_record(mh.agent_dir(host) / "run" / job_id / f"attempt-{attempt}")
                assert launched is None or not launched["ranks"], (
                    f"the agent of {host} launched attempt {attempt} of {job_id} after it had ended "
                    "(a start order sent while the host was cut off, delivered when it came back, "
                    f"and run although the agent's lease had expired): {launched}"
                )


def test_agent_killed_for_10s_keeps_its_workers(failures: MultiHost, tmp_path: Path) -> None:
    mh, host = failures, AGENT_HOSTS[0]
    out, other = tmp_path / "out", tmp_path / "cancelled"
    steps = 250  # 25 s of work: it ends after the agent is back
    job_id = place_on(mh, host, out, steps=steps, gpus_per_replica=2)
    cancelled = place_on(mh, host, other, gpus_per_replica=2, name="cancelled")
    pids = {o: int(wait_file(o / "pid-1-0")) for o in (out, other)}
    wait_checkpoint(out, attempt=1, step=EVERY)
    before = nodes(mh)[host]

    mh.kill_agent(host)
    killed = time.monotonic()
    time.sleep(2)
    with mh.client() as c:  # an order for the node while its agent is down
        assert c.post(f"/v1/jobs/{cancelled}/cancel").status_code == 200
    time.sleep(max(0.0, 10 - (time.monotonic() - killed)))
    for pid in pids.values():
        assert alive(pid) and pid in mh.host_pids(host)
    mh.start_agent(host)
    back = wait_for(lambda: (n := nodes(mh)[host])["incarnation"] > before["incarnation"] and n, timeout=30)
    assert back["state"] == "up", back

    # the same workers run on, adopted and reported by the new incarnation
    assert alive(pids[out]), "the restarted agent (or the fence) killed the worker"
    assert job(mh, job_id)["attempt"] == 1
    assert mh.log(f"agent-{host}").count("adopted 1 running ranks") == 2
    # the cancel sent while the agent was down reaches its workers: saved, ended `cancelled`
    ended = wait_state(mh, cancelled, "cancelled", timeout=20)
    assert ended["attempt"] == 1, ended
    assert worker_events(other, "checkpoint", attempt=1, asked=True), worker_events(other)
    # the other job finishes on attempt 1, every step done once
    done = wait_state(mh, job_id, "finished", timeout=40)
    assert done["attempt"] == 1 and done["restarts"] == 0, done
    assert kinds(mh, job_id) == ["start", "finish"], events(mh, job_id)
    assert steps_done(out, 0, 1) == list(range(1, steps + 1))
    assert {x.attempt for x in record(out)} == {1}
    assert not fenced(mh, host, job_id, 1) and not fenced(mh, host, cancelled, 1)


def test_agent_killed_past_its_lease_is_fenced_and_the_job_runs_elsewhere_once(
    failures: MultiHost, tmp_path: Path
) -> None:
    mh, host, out = failures, AGENT_HOSTS[1], tmp_path / "out"
    job_id = place_on(mh, host, out, gpus_per_replica=4)
    pid = int(wait_file(out / "pid-1-0"))
    wait_checkpoint(out, attempt=1, step=EVERY)
    before = nodes(mh)[host]

    with NodeWatch(mh) as watch:
        mh.kill_agent(host)
        killed = time.monotonic()
        j = wait_attempt(mh, job_id, 2, timeout=LOST_AFTER_S + 15)
        assert j["attempt"] == 2 and host not in hosts_of(j), j
        assert fenced(mh, host, job_id, 1) and not alive(pid) and pid not in mh.host_pids(host)
        seen = never_two_at_once(record(out))
        assert seen[1][2] - killed <= LEASE_S + 1.5, seen[1][2] - killed  # the lease, then the fence
        resumed_from_checkpoint(mh, out, job_id)
        requeued_not_restarted(mh, job_id, "lost")

        # started again after AWAY_S: readmitted once clean (it adopts attempt 1, whose workers the
        # fence killed, and reports it ended), and the job stays where it is: it ran elsewhere once
        time.sleep(max(0.0, AWAY_S - (time.monotonic() - killed)))
        mh.start_agent(host)
        back = wait_node(mh, host, "up", timeout=30)
        assert back["incarnation"] > before["incarnation"], back
        time.sleep(2)
    assert watch.states(host)[-3:] == ["up", "lost", "up"], watch.seen[host]
    j = job(mh, job_id)
    assert j["state"] == "running" and j["attempt"] == 2 and host not in hosts_of(j), j
    assert kinds(mh, job_id) == ["start", "lost", "start"]
    never_two_at_once(record(out))


def test_declared_gpu_fault_requeues_the_gang_and_drains_the_node(
    failures: MultiHost, tmp_path: Path
) -> None:
    mh, host, out = failures, AGENT_HOSTS[2], tmp_path / "out"
    job_id = place_on(mh, host, out, gpus_per_replica=4, checkpoint={"signal": "SIGTERM", "grace": "10s"})
    wait_checkpoint(out, attempt=1, step=EVERY)

    (mh.agent_dir(host) / "gpu-faults").write_text("2 uncorrectable ECC errors (declared by the test)\n")
    declared = time.monotonic()
    drained = wait_node(mh, host, "draining", timeout=15)  # read at the next heartbeat (5 s)
    assert drained["reason"] == "GPU 2 unhealthy: uncorrectable ECC errors (declared by the test)", drained
    assert drained["unhealthy"] == {"2": "uncorrectable ECC errors (declared by the test)"}
    assert drained["gpu_list"][2]["state"] == "unhealthy", drained["gpu_list"]

    # the gang checkpointed on request and resumed on another host; a disruption, not a restart
    j = wait_attempt(mh, job_id, 2, timeout=30)
    assert j["attempt"] == 2 and host not in hosts_of(j), j
    assert time.monotonic() - declared < 20
    (saved,) = worker_events(out, "checkpoint", attempt=1, asked=True)
    assert newest_checkpoint(mh, job_id, 1) == saved["step"]
    resumed_from_checkpoint(mh, out, job_id)
    ended = requeued_not_restarted(mh, job_id, "preempt")
    assert ended["reason"] == f"requeued by unhealthy GPU {host}:2", ended
    never_two_at_once(record(out))

    # even back in service, the node offers 3 GPUs: GPU 2 gets no new work
    node_action(mh, host, "undrain")
    wait_node(mh, host, "up")
    four = steps_job(mh, tmp_path / "four", 100_000, EVERY, STEP_S, replicas=1, name="four")
    wait_state(mh, four, "running")  # on the third host
    blocked = steps_job(mh, tmp_path / "blocked", 100_000, EVERY, STEP_S, replicas=1, name="blocked")
    three = steps_job(mh, tmp_path / "three", 100_000, EVERY, STEP_S, replicas=1, gpus_per_replica=3)
    placed = wait_state(mh, three, "running")
    assert hosts_of(placed) == {host} and sorted(placed["placement"][0]["gpus"]) == [0, 1, 3], placed
    time.sleep(1)
    assert job(mh, blocked)["state"] == "pending", job(mh, blocked)
    gpu_list = nodes(mh)[host]["gpu_list"]
    assert gpu_list[2]["state"] == "unhealthy" and "job" not in gpu_list[2], gpu_list
