"""A control plane and three node agents on four "hosts" (network namespaces), for tests and the
agent benchmark: `corral server` listens on `10.200.<net>.254` inside namespace `cp`
(`--insecure-http`, SQLite), and `corral agent` runs in `h1`, `h2` and `h3`, each declaring 4
GPUs and registering its own address `10.200.<net>.<i>`. Workers run inside their agent's
namespace, so a gang of two replicas of 4 GPUs really spans two hosts that talk over the bridge.

The tests themselves stay in the root namespace and reach the API through `relay.py`, a Unix
socket relayed to the server's address from inside `cp`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from corral.agent.fence import IDLE_EXIT
from tests.multihost.netns import Loopback, Network
from tests.server.harness import free_port, wait_for

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
CLI = [sys.executable, "-c", "from corral.cli.main import main; main()"]
AGENT_HOSTS = ("h1", "h2", "h3")
GPUS = 4
TERMINAL = ("finished", "failed", "cancelled", "rejected")

# three nodes of 4 GPUs; the built-in priority classes without min_runtime (preemption at once)
CLUSTER: dict[str, Any] = {
    "name": "multihost",
    "nodes": [{"name": "h[1-3]", "gpus": GPUS, "gpu_model": "H100-80GB", "gpu_memory_gib": 80}],
    "queues": [
        {"name": "research", "weight": 1, "quota": 12}
    ],  # no limit (a job blocked by its queue's limit preempts nothing)
    "priority_classes": {
        "low": {"value": 0, "min_runtime": "0s"},
        "normal": {"value": 100, "min_runtime": "0s"},
        "high": {"value": 1000},
    },
}


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}


class MultiHost:
    """`start()` builds the namespaces and starts everything; `stop()` undoes all of it."""

    def __init__(self, directory: Path, namespaces: bool = True, server_args: Sequence[str] = ()) -> None:
        """`server_args`: more options for `corral server` (e.g. `--lost-after 10`)."""
        self.dir = directory
        self.server_args = list(server_args)
        hosts = {"cp": 254, **{h: i for i, h in enumerate(AGENT_HOSTS, start=1)}}
        self.net: Network | Loopback = Network(hosts) if namespaces else Loopback(hosts)
        self.port = 8400 if namespaces else free_port()
        self.data = directory / "server"
        self.checkpoints = directory / "checkpoints"  # every host mounts it (one file system here)
        self.socket = directory / "api.sock"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.agent_tokens: dict[str, str] = {}  # host -> its join token (a restarted agent reuses it)
        self._token = ""

    # ---- addresses and the API -------------------------------------------------------------
    @property
    def url(self) -> str:
        """The server's URL as the agents see it."""
        return f"http://{self.net.address('cp')}:{self.port}"

    def address(self, host: str) -> str:
        return self.net.address(host)

    def client(self, token: str | None = None, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.socket)),
            base_url=self.url,
            headers={"Authorization": f"Bearer {token or self._token}"},
            timeout=timeout,
        )

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.net.up()
        self.data.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        cluster = self.dir / "cluster.yaml"
        cluster.write_text(json.dumps(CLUSTER, indent=1))
        env = clean_env() | {"CORRAL_DATA_DIR": str(self.data)}
        server = [
            *CLI,
            "server",
            "--database-url",
            f"sqlite:///{self.data / 'corral.db'}",
            "--host",
            self.net.address("cp"),
            "--port",
            str(self.port),
            "--insecure-http",
            "--cluster",
            str(cluster),
            *self.server_args,
        ]
        self.procs["server"] = self.net.run("cp", server, self.dir / "server.log", env=env)
        relay = [
            sys.executable,
            str(HERE / "relay.py"),
            str(self.socket),
            self.net.address("cp"),
            str(self.port),
        ]
        self.procs["relay"] = self.net.run("cp", relay, self.dir / "relay.log", env=clean_env())
        wait_for(self._healthy, timeout=60, interval=0.05)
        self._token = (self.data / "admin-token").read_text().strip()
        for host in AGENT_HOSTS:
            self._agent(host)
        wait_for(self._joined, timeout=60, interval=0.05)

    def _healthy(self) -> bool:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{self.log(name)[-3000:]}"
        if not self.socket.exists():
            return False
        try:
            with self.client("-", timeout=2) as c:
                return c.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def agent_dir(self, host: str) -> Path:
        """The agent's `--data-dir` (lease, fence log, attempt records, `gpu-faults`)."""
        return self.dir / f"agent-{host}"

    def _agent(self, host: str, *extra: str) -> None:
        token = self.agent_tokens.get(host)
        if token is None:
            with self.client() as c:
                r = c.post("/v1/tokens", json={"name": f"agent-{host}", "role": "agent"})
                r.raise_for_status()
                token = self.agent_tokens[host] = r.json()["token"]
        argv = [
            *CLI,
            "agent",
            "--server",
            self.url,
            "--token",
            token,
            "--node",
            host,
            "--gpus",
            str(GPUS),
            "--gpu-model",
            "H100-80GB",
            "--address",
            self.net.address(host),
            "--data-dir",
            str(self.agent_dir(host)),
            "--checkpoint-root",
            str(self.checkpoints),
            # the jobs write under pytest's folders, closed to others: root's explicit opt-in
            *(["--default-user", "root", "--allow-root-jobs"] if os.geteuid() == 0 else []),
            *extra,
        ]
        self.procs[f"agent-{host}"] = self.net.run(
            host, argv, self.dir / f"agent-{host}.log", env=clean_env()
        )

    def _joined(self) -> bool:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{self.log(name)[-3000:]}"
        with self.client() as c:
            nodes = c.get("/v1/nodes").json()["nodes"]
        return all(n["registered"] and n["state"] == "up" for n in nodes) and len(nodes) == len(AGENT_HOSTS)

    def kill_rank(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    # ---- failures --------------------------------------------------------------------------
    def kill_agent(self, host: str) -> None:
        """`kill -9` the agent's process (only it: its workers and fence live on)."""
        proc = self.procs[f"agent-{host}"]
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def start_agent(self, host: str, *extra: str) -> None:
        """Start `host`'s agent again, with the same data directory and token (and `extra` options)."""
        old = self.procs.get(f"agent-{host}")
        assert old is None or old.poll() is not None, f"the agent of {host} still runs"
        self._agent(host, *extra)

    def cut(self, host: str) -> None:
        assert isinstance(self.net, Network), "cutting a host off needs network namespaces"
        self.net.link(host, up=False)

    def heal(self, host: str) -> None:
        assert isinstance(self.net, Network), "cutting a host off needs network namespaces"
        self.net.link(host, up=True)

    def host_pids(self, host: str) -> list[int]:
        assert isinstance(self.net, Network), "processes per host need network namespaces"
        return self.net.host_pids(host)

    def stop(self) -> list[str]:
        """Stop the agents (they kill their workers), the server and the relay; then kill whatever
        is left inside the namespaces and delete them. Returns what was left (pid and command)."""
        try:
            for name in sorted(self.procs, key=lambda n: not n.startswith("agent")):
                proc = self.procs[name]
                # the main process only, as `kill PID` would: each one stops what it started
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)
                    raise AssertionError(f"{name} did not stop within 15 s of SIGTERM") from None
        finally:
            # `corral server` leaves its scheduler to notice (within 0.5 s) that it is gone; an
            # agent's fence (corral.agent.fence) outlives it by design and exits IDLE_EXIT seconds
            # after the last attempt it guards has ended
            left = self.net.close(linger=IDLE_EXIT + 3.0 if isinstance(self.net, Network) else 2.0)
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(5)
        return left


# ---- the jobs API, as a user calls it ---------------------------------------------------------
def submit(mh: MultiHost, **spec: Any) -> str:
    body = {"queue": "research", "env": {}, **spec}
    body["env"] = {"GLOO_SOCKET_IFNAME": "eth0", **body["env"]}  # gloo's interface on every host
    with mh.client() as c:
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def job(mh: MultiHost, job_id: str) -> dict[str, Any]:
    with mh.client() as c:
        r = c.get(f"/v1/jobs/{job_id}")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out


def events(mh: MultiHost, job_id: str) -> list[dict[str, Any]]:
    with mh.client() as c:
        out: list[dict[str, Any]] = c.get(f"/v1/jobs/{job_id}/events").json()["events"]
        return out


def wait_state(mh: MultiHost, job_id: str, *states: str, timeout: float = 30.0) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        j = job(mh, job_id)
        if j["state"] in states:
            return j
        assert j["state"] not in TERMINAL, (j, mh.log("agent-h1")[-2000:])
        return None

    out: dict[str, Any] = wait_for(reached, timeout=timeout, interval=0.05)
    return out


def idle(mh: MultiHost, timeout: float = 30.0) -> None:
    """Cancel every job that has not ended and wait until no GPU is allocated (between tests)."""
    with mh.client() as c:
        for j in c.get("/v1/jobs", params={"state": "active"}).json()["jobs"]:
            c.post(f"/v1/jobs/{j['id']}/cancel")

        def free() -> bool:
            return all(n["allocated"] == 0 for n in c.get("/v1/nodes").json()["nodes"])

        wait_for(free, timeout=timeout, interval=0.1)


def wait_file(path: Path, timeout: float = 30.0) -> str:
    def ready() -> str | None:
        return path.read_text() if path.exists() else None

    out: str = wait_for(ready, timeout=timeout, interval=0.02)
    return out


def time_of(evs: list[dict[str, Any]], kind: str, attempt: int | None = None) -> float:
    (t,) = [e["t"] for e in evs if e["event"] == kind and (attempt is None or e.get("attempt") == attempt)]
    return float(t)


# ---- the `steps` worker: a checkpointing training loop --------------------------------------
def steps_job(mh: MultiHost, out: Path, steps: int, every: int, step_s: float, **spec: Any) -> str:
    """Submit `worker.py steps` (2 replicas of 4 GPUs unless `spec` says otherwise)."""
    out.mkdir(exist_ok=True)
    body: dict[str, Any] = {
        "name": "steps",
        "replicas": 2,
        "gpus_per_replica": 4,
        "command": [sys.executable, str(WORKER), "steps"],
        "checkpoint": {"signal": "SIGTERM", "grace": "10s"},
        **spec,
    }
    body["env"] = {"OUT": str(out), "STEPS": str(steps), "EVERY": str(every), "STEP_S": str(step_s)}
    return submit(mh, **body)


def worker_events(out: Path, event: str | None = None, **match: Any) -> list[dict[str, Any]]:
    """What the workers wrote to `events.log`, optionally only one kind with matching fields."""
    path = out / "events.log"
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [
        e
        for e in lines
        if (event is None or e["event"] == event) and all(e.get(k) == v for k, v in match.items())
    ]


def steps_done(out: Path, rank: int, attempt: int) -> list[int]:
    """The steps `rank` finished in `attempt`, from its append-only log."""
    path = out / f"steps-{rank}.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [int(s) for a, s in (x.split() for x in lines) if int(a) == attempt]


def wait_checkpoint(out: Path, attempt: int, step: int, timeout: float = 30.0) -> dict[str, Any]:
    """Wait until rank 0 of `attempt` has recorded a checkpoint of at least `step`."""

    def reached() -> dict[str, Any] | None:
        found = [e for e in worker_events(out, "checkpoint", attempt=attempt) if e["step"] >= step]
        return found[-1] if found else None

    out_: dict[str, Any] = wait_for(reached, timeout=timeout, interval=0.05)
    return out_
