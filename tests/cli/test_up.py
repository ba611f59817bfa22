"""`corral up` on a temporary data directory: it serves, registers this machine, writes the config
that the next `corral submit` uses; and `corral --help` stays light."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.agent.inventory import detect_gpus
from corral.cli.up import DECLARE_HINT
from tests.server.harness import free_port, wait_for

CLI = [sys.executable, "-c", "from corral.cli.main import main; main()"]


class Up:
    """`corral up` as a child process, with its own data directory and user config."""

    def __init__(self, tmp_path: Path, *args: str, port: int | None = None, opt_in: bool = True) -> None:
        """`opt_in`: run as root, keep running the jobs as root (`--run-as root`): they write
        under pytest's folders, which nobody else may enter."""
        tmp_path.mkdir(parents=True, exist_ok=True)
        if opt_in and os.geteuid() == 0 and "--run-as" not in args:
            args = (*args, "--run-as", "root")
        self.port = port or free_port()
        self.data_dir = tmp_path / "data"
        self.config = tmp_path / "xdg-config" / "corral" / "config.json"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_") and k != "SUDO_USER"}
        self.env.update(CORRAL_DATA_DIR=str(self.data_dir), XDG_CONFIG_HOME=str(tmp_path / "xdg-config"))
        self.log = tmp_path / "up.log"
        with open(self.log, "wb") as log:
            command = [*CLI, "up", "--port", str(self.port), *args]
            self.proc = subprocess.Popen(
                command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def output(self) -> str:
        return self.log.read_text()

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, self.output()
            return "Stop with Ctrl-C." in self.output()

        wait_for(ready, timeout=60, interval=0.1)

    def corral(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A later `corral` command from "another terminal": only the config tells it where to go."""
        return subprocess.run([*CLI, *args], env=self.env, capture_output=True, text=True, timeout=60)

    def json(self, *args: str) -> Any:
        at = args.index("--") if "--" in args else len(args)
        done = self.corral(*args[:at], "--json", *args[at:])
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C in its terminal
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def up_declared(tmp_path: Path) -> Iterator[Up]:
    up = Up(tmp_path, "--gpus", "2", "--gpu-model", "NVIDIA H100 80GB HBM3", "--node", "workstation")
    try:
        yield up
    finally:
        up.stop()


def test_up_serves_registers_the_node_and_writes_the_config(up_declared: Up) -> None:
    up = up_declared
    up.wait_ready()
    out = up.output()
    url = f"http://127.0.0.1:{up.port}"
    assert f"API {url}/v1, its OpenAPI schema at {url}/openapi.json" in out
    assert "Node workstation joined with 2 x H100-80GB GPUs." in out
    assert "This node's agent runs the jobs placed on it" in out and DECLARE_HINT not in out
    assert up.config.stat().st_mode & 0o777 == 0o600
    config = json.loads(up.config.read_text())
    assert config["server"] == url and config["token"] == (up.data_dir / "admin-token").read_text().strip()
    nodes = up.json("nodes")["nodes"]
    assert [(n["name"], n["state"], n["gpus"], n["gpu_model"]) for n in nodes] == [
        ("workstation", "up", 2, "H100-80GB")
    ]
    show_gpus = "import os; print('gpus', os.environ['CUDA_VISIBLE_DEVICES'])"
    job = up.json("submit", "--gpus", "2", "--", "python", "-c", show_gpus)
    assert job["queue"] == "default" and job["state"] == "pending"
    done = wait_for(
        lambda: (j := up.json("show", job["id"]))["state"] in ("finished", "failed") and j, timeout=30
    )
    assert done["state"] == "finished", done
    log = up.data_dir / "logs" / job["id"] / "attempt-1" / "rank-0.log"
    assert log.read_text() == "gpus 0,1\n"
    too_big = up.corral("submit", "--gpus", "3", "--", "true")
    assert too_big.returncode == 2 and "--replicas 3 --gpus-per-replica 1" in too_big.stderr
    assert up.stop() == 0
    assert "Traceback" not in up.output()


def test_up_without_a_gpu_says_once_how_to_declare_some(tmp_path: Path) -> None:
    if detect_gpus().count:
        pytest.skip("this machine has NVIDIA GPUs")
    up = Up(tmp_path)
    try:
        up.wait_ready()
        out = up.output()
        assert out.count(DECLARE_HINT) == 1 and f"Node {socket.gethostname()} joined with 0 GPUs." in out
        job = up.json("submit", "--gpus", "0", "--", "echo", "hello")
        wait_for(lambda: up.json("show", job["id"])["state"] == "finished", timeout=30)
        log = up.data_dir / "logs" / job["id"] / "attempt-1" / "rank-0.log"
        assert log.read_text() == "hello\n"
        second = Up(tmp_path / "again", port=up.port)  # the port is taken
        assert second.proc.wait(60) == 2 and f"port {up.port} on 127.0.0.1 is in use" in second.output()
    finally:
        up.stop()


def test_help_loads_neither_the_client_nor_the_server() -> None:
    probe = (
        "import sys\nfrom corral.cli.main import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = ('httpx', 'fastapi', 'sqlalchemy', 'uvicorn')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy"
        " or m.startswith(('corral.client', 'corral.server'))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "4 the server is unreachable" in " ".join(done.stdout.split())


def need_root() -> None:
    """These tests check what `corral up` does as root: skipped elsewhere, a failure in CI."""
    if os.geteuid() == 0:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("CI must run tests/cli/test_up.py as root", pytrace=False)
    pytest.skip("`corral up` as root is what these tests check")


@pytest.fixture
def open_base() -> Iterator[Path]:
    """A folder others may pass through (as /var/lib is), for a `corral up` whose jobs run as nobody."""
    base = Path(tempfile.mkdtemp(prefix="corral-up-"))
    base.chmod(0o711)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def mode_of(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_uid, stat.S_IMODE(info.st_mode)


def test_up_as_root_runs_jobs_as_nobody_and_keeps_its_data_private(open_base: Path) -> None:
    need_root()
    nobody = pwd.getpwnam("nobody")
    up = Up(open_base, "--gpus", "0", opt_in=False)
    try:
        up.wait_ready()
        job = up.json("submit", "--gpus", "0", "--", "id", "-u")
        done = wait_for(lambda: (j := up.json("show", job["id"]))["state"] in ("finished", "failed") and j)
        assert done["state"] == "finished", (done, up.output())
        log = up.data_dir / "logs" / job["id"] / "attempt-1" / "rank-0.log"
        assert log.read_text() == f"{nobody.pw_uid}\n"  # never root
        assert "runs the jobs placed on it as nobody" in up.output()
        assert mode_of(log) == (nobody.pw_uid, 0o600)  # the job's user's, and the agent's (root)
        assert mode_of(up.data_dir) == (0, 0o711)  # others pass through to their files, never list
        private = ["corral.db", "corral.db-wal", "corral.db-shm", "admin-token", "agent-token"]
        for path in [*(up.data_dir / name for name in private), up.config]:
            assert mode_of(path) == (0, 0o600), path
        record = up.data_dir / "run" / job["id"] / "attempt-1" / "attempt.json"
        assert mode_of(record) == (0, 0o600)  # it holds the job's env
        for path in (up.data_dir / "corral.db", record, up.data_dir / "admin-token"):
            read = subprocess.run(["runuser", "-u", "nobody", "--", "cat", str(path)], capture_output=True)
            assert read.returncode != 0 and b"Permission denied" in read.stderr, path
    finally:
        up.stop()


def test_sigterm_stops_up_and_the_workers_it_runs_at_once(open_base: Path) -> None:
    up = Up(open_base, "--gpus", "1", opt_in=False)
    try:
        up.wait_ready()
        job = up.json("submit", "--gpus", "1", "--", "sh", "-c", "echo $$; exec sleep 600")
        log = up.data_dir / "logs" / job["id"] / "attempt-1" / "rank-0.log"
        pid = int(wait_for(lambda: log.exists() and log.read_text().strip(), timeout=30))
        assert alive(pid)
        os.kill(up.proc.pid, signal.SIGTERM)  # as a service manager stops it: the main process only
        code = up.proc.wait(60)
        # gone when `corral up` has exited, not 20 s later when the node's fence would have killed it
        wait_for(lambda: not alive(pid), timeout=3)
        assert code == 0, up.output()
        assert "corral up: stopped (and the workers of 1 running job attempts)" in up.output()
    finally:
        up.stop()


def alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"  # killed, not yet reaped by init
