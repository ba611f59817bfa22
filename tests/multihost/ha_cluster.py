"""Two `corral server` replicas on one PostgreSQL, each on its own "host" (network namespace),
agents on two more, and a load balancer in front (`balancer.py`), for the failover test.

Hosts: `db` (PostgreSQL), `cp1` and `cp2` (the replicas), `lb` (a balancer), `h1` and `h2`
(agents of 4 GPUs). The two ways of reaching several replicas are both used: `h1`'s agent is given
both replicas' addresses (`--server URL1,URL2`, client/failover.py), `h2`'s the balancer's.
The test reaches each replica through its own relay (a Unix socket,
`relay.py`) and the balancer through its socket.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from corral.agent.fence import IDLE_EXIT
from tests.multihost.cluster import CLI, clean_env
from tests.multihost.netns import Network
from tests.server.harness import wait_for

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REPLICAS = ("cp1", "cp2")
AGENTS = ("h1", "h2")
GPUS = 4
PORT = 8400
CLUSTER: dict[str, Any] = {
    "name": "ha",
    "nodes": [{"name": "h[1-2]", "gpus": GPUS, "gpu_model": "H100-80GB", "gpu_memory_gib": 80}],
    "queues": [{"name": "research", "weight": 1}],
}


class HaCluster:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.net = Network({"db": 10, "cp1": 21, "cp2": 22, "lb": 30, "h1": 1, "h2": 2})
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        # the postgres user cannot enter pytest's folders (0700, root's): a folder of its own in /tmp
        self.pg = Path(tempfile.mkdtemp(prefix="corral-ha-pg-"))
        self.pgbin = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
        self.token = ""

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg://postgres@{self.net.address('db')}:5432/postgres"

    def sock(self, name: str) -> Path:
        return self.dir / f"{name}.sock"

    def client(self, name: str, timeout: float = 10.0) -> httpx.Client:
        """Through replica `name`'s relay, or the balancer's (`lb`)."""
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.sock(name))),
            base_url=f"http://{name}",
            headers={"Authorization": f"Bearer {self.token}"} if self.token else {},
            timeout=timeout,
        )

    def health(self, name: str) -> dict[str, Any]:
        try:
            with self.client(name, timeout=2) as c:
                out: dict[str, Any] = c.get("/healthz").json()
                return out
        except (httpx.HTTPError, ValueError):
            return {}

    def leader(self) -> str | None:
        found = [r for r in REPLICAS if self.health(r).get("scheduler") == "leader"]
        return found[0] if len(found) == 1 else None

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.net.up()
        self._postgres()
        cluster = self.dir / "cluster.yaml"
        cluster.write_text(json.dumps(CLUSTER))
        for name in REPLICAS:
            relay = [
                sys.executable,
                str(HERE / "relay.py"),
                str(self.sock(name)),
                self.net.address(name),
                str(PORT),
            ]
            self.procs[f"relay-{name}"] = self.net.run(
                name, relay, self.dir / f"relay-{name}.log", env=clean_env()
            )
        self.start_replica("cp1", cluster)
        wait_for(lambda: self.health("cp1").get("scheduler") == "leader", timeout=60, interval=0.1)
        self.token = (self.dir / "cp1" / "admin-token").read_text().strip()
        self.start_replica("cp2", cluster)
        wait_for(lambda: self.health("cp2").get("scheduler") == "standby", timeout=60, interval=0.1)
        backends = [f"{self.net.address(r)}:{PORT}" for r in REPLICAS]
        lb = [
            sys.executable,
            str(HERE / "balancer.py"),
            self.net.address("lb"),
            str(PORT),
            str(self.sock("lb")),
            *backends,
        ]
        self.procs["lb"] = self.net.run("lb", lb, self.dir / "lb.log", env=clean_env())
        wait_for(lambda: self.sock("lb").exists(), timeout=30)
        for host in AGENTS:
            self._agent(host)
        wait_for(self._joined, timeout=60, interval=0.2)

    def _postgres(self) -> None:
        shutil.chown(self.pg, "postgres")
        as_pg = ["runuser", "-u", "postgres", "--"]
        data = str(self.pg / "data")
        subprocess.run([*as_pg, f"{self.pgbin}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-N"],
                       check=True, capture_output=True)  # fmt: skip
        with open(self.pg / "data" / "pg_hba.conf", "a") as hba:
            hba.write("host all all 10.200.0.0/16 trust\n")
        opts = f"-h {self.net.address('db')} -p 5432 -k {self.pg} -c fsync=off -c max_connections=200"
        out = subprocess.run(
            ["ip", "netns", "exec", self.net.ns("db"), *as_pg, f"{self.pgbin}/pg_ctl", "-D", data,
             "-l", str(self.pg / "log"), "-w", "-t", "60", "-o", opts, "start"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr + (self.pg / "log").read_text()

    def start_replica(self, name: str, cluster: Path | None = None) -> None:
        data = self.dir / name
        data.mkdir(exist_ok=True)
        argv = [*CLI, "server", "--database-url", self.database_url, "--host", self.net.address(name),
                "--port", str(PORT), "--insecure-http", "--lost-after", "30"]  # fmt: skip
        if cluster is not None:
            argv += ["--cluster", str(cluster)]
        env = clean_env() | {"CORRAL_DATA_DIR": str(data)}
        self.procs[name] = self.net.run(name, argv, self.dir / f"{name}.log", env=env)
        wait_for(lambda: self.health(name).get("ok"), timeout=60, interval=0.1)

    def kill_replica(self, name: str) -> None:
        """`kill -9` of the replica's process group (API and scheduler)."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def _agent(self, host: str) -> None:
        with self.client("lb") as c:
            r = c.post("/v1/tokens", json={"name": f"agent-{host}", "role": "agent"})
            r.raise_for_status()
            token = r.json()["token"]
        servers = (
            ",".join(f"http://{self.net.address(r)}:{PORT}" for r in REPLICAS)
            if host == AGENTS[0]
            else f"http://{self.net.address('lb')}:{PORT}"
        )
        argv = [*CLI, "agent", "--server", servers, "--token", token,
                "--node", host, "--gpus", str(GPUS), "--gpu-model", "H100-80GB",
                "--address", self.net.address(host), "--data-dir", str(self.dir / f"agent-{host}"),
                *(["--default-user", "root", "--allow-root-jobs"] if os.geteuid() == 0 else [])]  # fmt: skip
        self.procs[f"agent-{host}"] = self.net.run(
            host, argv, self.dir / f"agent-{host}.log", env=clean_env()
        )

    def _joined(self) -> bool:
        with self.client("lb") as c:
            nodes = c.get("/v1/nodes").json()["nodes"]
        return len(nodes) == len(AGENTS) and all(n["registered"] and n["state"] == "up" for n in nodes)

    def stop(self) -> list[str]:
        try:
            for name in sorted(self.procs, key=lambda n: not n.startswith("agent")):
                proc = self.procs[name]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(15)
            data = str(self.pg / "data")
            subprocess.run(["runuser", "-u", "postgres", "--", f"{self.pgbin}/pg_ctl", "-D", data,
                            "-m", "immediate", "-w", "stop"], capture_output=True, check=False)  # fmt: skip
            shutil.rmtree(self.pg, ignore_errors=True)
        finally:
            # an agent's fence outlives it by design and exits IDLE_EXIT seconds after the last
            # attempt it guards has ended (the agents were stopped with their attempts just now)
            left = self.net.close(linger=IDLE_EXIT + 3.0)
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(5)
        return left
