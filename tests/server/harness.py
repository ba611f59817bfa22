"""A real `corral server` (API + scheduler processes) on a real database, for tests and benchmarks.

`Server` starts the command line's `corral server` as a child process on a free loopback port,
waits for `/healthz`, and hands out httpx clients with the admin token it wrote. `FakeAgent`
speaks the agents' API over HTTP (register, assignments, reports) the way a node agent does,
so the control plane's behaviour can be driven without launching workers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from corral.protocol import Orders, Registered

ROOT = Path(__file__).resolve().parents[2]
PG_ENV = "CORRAL_TEST_DATABASE_URL"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fresh_postgres(admin_url: str) -> tuple[str, str]:
    """A new empty database on the test PostgreSQL; returns (its URL, its name)."""
    name = "corral_" + uuid.uuid4().hex[:12]
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False), name


def drop_postgres(admin_url: str, name: str) -> None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


class Server:
    """`corral server` as a child process; `kill()` is `kill -9` of the API and its scheduler."""

    def __init__(
        self,
        database_url: str,
        data_dir: Path,
        cluster: Path | None = None,
        *,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.database_url = database_url
        self.data_dir = data_dir
        self.cluster = cluster
        self.extra = extra or []
        self.env = dict(os.environ, CORRAL_DATA_DIR=str(data_dir), **(env or {}))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir / "server.log"
        self._token: str | None = None
        self._agent_tokens: dict[str, str] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> float:
        """Start and wait until `/healthz` answers; returns the seconds it took."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-c",
            "from corral.cli.main import main; main()",
            "server",
            "--database-url",
            self.database_url,
            "--port",
            str(self.port),
            *self.extra,
        ]
        if not any(a.startswith("--lost-after") for a in self.extra):
            # FakeAgents do not heartbeat: their nodes would be declared lost 30 s into a test.
            # Tests of lost nodes pass their own --lost-after.
            cmd += ["--lost-after", "900"]
        if self.cluster is not None:
            cmd += ["--cluster", str(self.cluster)]
        started = time.monotonic()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log, start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"corral server exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > timeout:
                self.kill()
                raise RuntimeError(
                    f"corral server did not answer within {timeout}s:\n{self.log.read_text()[-3000:]}"
                )
            time.sleep(0.02)

    def kill(self) -> None:
        """`kill -9` the server and its scheduler (the whole process group)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def admin_token(self) -> str:
        if self._token is None:
            self._token = (self.data_dir / "admin-token").read_text().strip()
        return self._token

    def client(self, token: str | None = None, **kw: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kw.pop("timeout", 30.0), **kw)

    def agent_token(self, node: str) -> str:
        """The node's join token, made once (bound to the node at its first registration): an
        agent started again for the node uses it again, as an operator's would."""
        if node not in self._agent_tokens:
            self._agent_tokens[node] = self.token(f"agent-{node}", "agent")
        return self._agent_tokens[node]

    def token(self, name: str, role: str, **fields: str) -> str:
        with self.client() as c:
            r = c.post("/v1/tokens", json={"name": name, "role": role, **fields})
            r.raise_for_status()
            return str(r.json()["token"])


class FakeAgent:
    """Speaks the agents' API for one node: register, poll assignments, report running and exits."""

    def __init__(self, server: Server, node: str, gpus: int, gpu_model: str = "", **inventory: Any) -> None:
        self.server = server
        self.node = node
        self.token = server.agent_token(node)
        self.http = server.client(self.token)
        self.inventory = {"node": node, "gpus": gpus, "gpu_model": gpu_model, **inventory}
        self.incarnation = 0
        self.after = 0

    def register(self) -> dict[str, Any]:
        r = self.http.post("/v1/agents/register", json=self.inventory)
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        self.incarnation = Registered.model_validate(out).incarnation  # the node protocol's answer
        return out

    def orders(self, wait: float = 0.0) -> list[dict[str, Any]]:
        r = self.http.get(f"/v1/agents/{self.node}/assignments", params={"after": self.after, "wait": wait})
        r.raise_for_status()
        orders: list[dict[str, Any]] = r.json()["orders"]
        Orders.model_validate({"orders": orders})  # every order the server sends is a protocol model
        if orders:
            self.after = orders[-1]["seq"]
        return orders

    def report(self, job: str, attempt: int, status: str, exit_code: int | None = None) -> httpx.Response:
        body = {
            "incarnation": self.incarnation,
            "job": job,
            "attempt": attempt,
            "status": status,
            "exit_code": exit_code,
        }
        return self.http.post(f"/v1/agents/{self.node}/reports", json=body)

    def close(self) -> None:
        self.http.close()


def wait_for(fn: Any, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll `fn()` until it returns something truthy; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value: {value!r})")
        time.sleep(interval)


def lost_after_server(tmp_path: Path, cluster: Path, seconds: float) -> Server:
    """A started `corral server` on SQLite that declares nodes lost after `seconds` of silence."""
    srv = Server(
        f"sqlite:///{tmp_path / 'corral.db'}",
        tmp_path / "data",
        cluster,
        extra=["--lost-after", str(seconds)],
    )
    srv.start()
    return srv
