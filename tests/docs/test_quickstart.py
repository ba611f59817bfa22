"""docs/quickstart.md works as written: its `shell` blocks run in order against a real `corral up`."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
SHELL = re.compile(r"```shell\n(.*?)```", re.S)
CORRAL = [sys.executable, "-c", "from corral.cli.main import main; main()"]


def commands() -> list[list[str]]:
    text = (ROOT / "docs" / "quickstart.md").read_text()
    return [shlex.split(line) for block in SHELL.findall(text) for line in block.strip().splitlines()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_quickstart_runs_as_written(tmp_path: Path) -> None:
    steps = commands()
    up, rest = steps[0], steps[1:]
    assert up[:2] == ["corral", "up"], "the first shell block starts Corral"
    port = str(free_port())
    up = [port if prev == "--port" else a for prev, a in zip(["", *up], up, strict=False)]
    if os.geteuid() == 0:  # as root, jobs would run as nobody, who cannot enter pytest's folders
        up += ["--run-as", "root"]
    env = dict(os.environ, CORRAL_DATA_DIR=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    env.pop("CORRAL_SERVER", None)
    env.pop("CORRAL_TOKEN", None)
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115 - closed in finally
    server = subprocess.Popen([*CORRAL, *up[1:]], env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        config_file = tmp_path / "config" / "corral" / "config.json"
        while True:
            try:
                up_ok = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                up_ok = False
            if up_ok and config_file.exists() and "joined" in (tmp_path / "up.log").read_text():
                break
            assert server.poll() is None, (tmp_path / "up.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "up.log").read_text()
            time.sleep(0.1)
        config = json.loads(config_file.read_text())
        assert config["server"].endswith(f":{port}") and config["token"]
        outputs = {}
        for argv in rest:
            assert argv[0] == "corral"
            proc = subprocess.run([*CORRAL, *argv[1:]], env=env, capture_output=True, text=True, timeout=60)
            outputs[" ".join(argv[:3])] = proc
            expected = 1 if "--replicas" in argv else 0  # the page says `big` is refused (exit 1)
            assert proc.returncode == expected, f"{argv}: {proc.stdout}{proc.stderr}"
        refused = outputs["corral submit --name"]
        assert refused is not None
        jobs = outputs["corral jobs --all"].stdout
        assert "hello" in jobs and "sleepy" in jobs
        assert "never run" in " ".join(p.stderr for p in outputs.values())
        events = [json.loads(line) for line in outputs["corral events --json"].stdout.splitlines()]
        assert events[0]["event"] == "cluster"
        assert {"submit", "start"} <= {e["event"] for e in events}
        deadline = time.monotonic() + 30  # the page says hello finishes, sleepy gets cancelled
        while True:
            shown = subprocess.run(
                [*CORRAL, "jobs", "--all", "--json"], env=env, capture_output=True, text=True, timeout=60
            )
            states = {j["name"]: j["state"] for j in json.loads(shown.stdout)["jobs"]}
            if states.get("hello") == "finished" and states.get("sleepy") == "cancelled":
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.2)
        printed = tmp_path / "data" / "logs" / "j1" / "attempt-1" / "rank-0.log"
        assert printed.read_text() == "hello\n"
        assert outputs["corral logs j1"].stdout == "hello\n"  # served by the node's agent
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
