"""Fixtures for the node agent: a real `corral server` (SQLite and PostgreSQL) and a real
`corral agent` process for node dgx01 of the lab cluster, launching real worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import database_url, server  # noqa: F401  (fixtures)
from tests.server.harness import Server, wait_for

CLI = [sys.executable, "-c", "from corral.cli.main import main; main()"]
# these tests' jobs write under pytest's folders, which only root may enter: a test agent run as
# root keeps running them as root, by the explicit opt-in a node needs for it (DESIGN.md 6.6);
# tests/agent/test_security.py runs jobs as unprivileged users
AS_ROOT = ["--default-user", "root", "--allow-root-jobs"] if os.geteuid() == 0 else []


class AgentProcess:
    """`corral agent` for one node as a child process, with its own data directory."""

    def __init__(
        self,
        srv: Server,
        node: str,
        directory: Path,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`extra`: more flags (instead of the root opt-in of AS_ROOT); `env`: more variables."""
        self.server = srv
        self.node = node
        self.data_dir = directory / f"agent-{node}"
        self.checkpoints = directory / "checkpoints"
        self.log = directory / f"agent-{node}.log"
        token = srv.agent_token(node)
        command = [
            *CLI,
            "agent",
            "--server",
            srv.url,
            "--token",
            token,
            "--node",
            node,
            "--gpus",
            "8",
            "--gpu-model",
            "H100-80GB",
            "--data-dir",
            str(self.data_dir),
            "--checkpoint-root",
            str(self.checkpoints),
            *(AS_ROOT if extra is None else extra),
        ]
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                command,
                env={**clean, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text()

    def wait_joined(self) -> None:
        def joined() -> bool:
            assert self.proc.poll() is None, self.output()
            return "joined" in self.output()

        wait_for(joined, timeout=30, interval=0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def agent(server: Server, tmp_path: Path) -> Iterator[AgentProcess]:  # noqa: F811
    running = AgentProcess(server, "dgx01", tmp_path)
    try:
        running.wait_joined()
        yield running
    finally:
        running.stop()
