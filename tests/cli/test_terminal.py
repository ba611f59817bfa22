"""`corral run`, `corral alloc` and `corral attach` with real processes: a real server on loopback,
dgx01's real agent run as root with no opt-in to root jobs (so jobs, and their shells, run as
`nobody`), and the CLI as a child process (through a pseudo-terminal, pexpect, for the shells).
Also the attacks on the terminal channel: another team's job, a forged or revoked token, an
agent token on the user's side and another node's agent on the agent's side."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pexpect
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.agent.conftest import AgentProcess
from tests.agent.test_sandbox import CLUSTER
from tests.agent.test_security import SECRET, need, nobody
from tests.server.harness import Server, free_port, wait_for

CLI = [sys.executable, "-c", "from corral.cli.main import main; main()"]
PROMPT = "corral-test$ "


@dataclass
class Lab:
    server: Server
    agent: AgentProcess
    alice: str  # a member of team research
    bob: str  # a member of team prod
    base: Path

    def env(self, token: str) -> dict[str, str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        return {
            **clean,
            "CORRAL_SERVER": self.server.url,
            "CORRAL_TOKEN": token,
            "CORRAL_CONFIG": str(self.base / "no-config.json"),
            "TERM": "dumb",
            "PS1": PROMPT,
        }

    def job(self, job_id: str) -> dict[str, Any]:
        with self.server.client(self.alice) as c:
            r = c.get(f"/v1/jobs/{job_id}")
            r.raise_for_status()
            out: dict[str, Any] = r.json()
            return out

    def state_is(self, job_id: str, *states: str) -> dict[str, Any] | None:
        job = self.job(job_id)
        return job if job["state"] in states else None


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    need(os.geteuid() == 0, "the agent must run as root to start jobs (and shells) as another user")
    nobody()
    base = Path(tempfile.mkdtemp(prefix="corral-term-"))  # pytest's folders are closed to nobody
    base.chmod(0o711)
    (base / "data").mkdir()
    cluster = base / "cluster.yaml"
    cluster.write_text(CLUSTER.format(allowed=base / "data"))
    srv = Server(
        f"sqlite:///{base / 'corral.db'}", base / "server", cluster, env={"CORRAL_TERMINAL_IDLE_S": "20"}
    )
    srv.start()
    agent = AgentProcess(srv, "dgx01", base, extra=[], env={"CORRAL_TEST_SECRET": SECRET})
    try:
        agent.wait_joined()
        alice = srv.token("alice", "member", team="research")
        bob = srv.token("bob", "member", team="prod")
        yield Lab(srv, agent, alice, bob, base)
    finally:
        agent.stop()
        srv.stop()
        shutil.rmtree(base, ignore_errors=True)


def submit(lab: Lab, token: str, **spec: Any) -> str:
    with lab.server.client(token) as c:
        r = c.post("/v1/jobs", json={"queue": "research", "max_restarts": 0, **spec})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def running(lab: Lab, job_id: str) -> dict[str, Any]:
    out: dict[str, Any] = wait_for(lambda: lab.state_is(job_id, "running"), timeout=60)
    return out


def corral(lab: Lab, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=lab.env(token), capture_output=True, text=True, timeout=120, check=False
    )


def spawn(lab: Lab, token: str, *args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        CLI[0], [*CLI[1:], *args], env=lab.env(token), encoding="utf-8", timeout=60, dimensions=(30, 100)
    )
    child.logfile_read = sys.stdout  # shown by pytest when a test fails
    return child


# ---- corral run --------------------------------------------------------------------------------
def test_run_prints_rank_0_and_exits_with_the_jobs_status(lab: Lab) -> None:
    ok = corral(lab, lab.alice, "run", "--queue", "research", "--", "sh", "-c", "echo hello from $RANK")
    assert ok.returncode == 0, ok.stderr
    assert "hello from 0" in ok.stdout
    failed = corral(
        lab,
        lab.alice,
        "run",
        "--queue",
        "research",
        "--max-restarts",
        "0",
        "--",
        "sh",
        "-c",
        "echo bye; exit 3",
    )
    assert failed.returncode == 3, failed.stderr
    assert "bye" in failed.stdout
    assert "failed" in failed.stderr


def test_run_all_ranks_prefixes_each_line_with_its_rank(lab: Lab) -> None:
    out = corral(
        lab, lab.alice, "run", "--queue", "research", "--replicas", "2", "--gpus-per-replica", "1",
        "--all-ranks", "--", "sh", "-c", "echo line-$RANK",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert sorted(line for line in out.stdout.splitlines() if "line-" in line) == ["0: line-0", "1: line-1"]


def test_run_refused_or_rejected_exits_1_with_the_reason(lab: Lab) -> None:
    out = corral(lab, lab.alice, "run", "--queue", "research", "--gpus", "8", "--replicas", "4", "--", "true")
    assert out.returncode == 2 and "--gpus" in out.stderr  # usage error: before anything is sent
    never = corral(
        lab,
        lab.alice,
        "run",
        "--queue",
        "research",
        "--replicas",
        "9",
        "--gpus-per-replica",
        "8",
        "--",
        "true",
    )
    assert never.returncode == 1, never.stderr  # a job that can never fit is refused at submit


def test_run_cancels_the_job_on_ctrl_c(lab: Lab) -> None:
    with subprocess.Popen(
        [*CLI, "run", "--queue", "research", "--", "sh", "-c", "echo started; sleep 300"],
        env=lab.env(lab.alice),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stderr is not None and proc.stdout is not None
        job_id = proc.stderr.readline().split(":")[0]
        running(lab, job_id)
        assert proc.stdout.readline().strip() == "started"  # its output is streamed before Ctrl-C
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 1
        assert "cancel" in proc.stderr.read()
        assert lab.state_is(job_id, "cancelled")


def test_run_says_why_it_waits_then_streams(lab: Lab) -> None:
    blocker = submit(lab, lab.alice, gpus_per_replica=8, command=["sleep", "300"])
    running(lab, blocker)
    with subprocess.Popen(
        [*CLI, "run", "--queue", "research", "--gpus", "1", "--", "echo", "done"],
        env=lab.env(lab.alice),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stderr is not None and proc.stdout is not None
        lines = [proc.stderr.readline()]
        while "pending:" not in lines[-1]:
            lines.append(proc.stderr.readline())
            assert lines[-1], lines
        assert "GPUs" in lines[-1]  # the scheduler's reason, e.g. "needs 1 GPU; 0 GPUs are free ..."
        with lab.server.client(lab.alice) as c:
            c.post(f"/v1/jobs/{blocker}/cancel")
        assert proc.wait(90) == 0, proc.stderr.read()
        assert proc.stdout.read().strip() == "done"


# ---- corral alloc ------------------------------------------------------------------------------
def test_alloc_gives_a_shell_inside_the_jobs_gpus_and_exit_frees_them(lab: Lab) -> None:
    child = spawn(lab, lab.alice, "alloc", "--queue", "research", "--gpus", "2", "--time-limit", "1h")
    child.expect(r"(j\w+): running on dgx01")
    job_id = child.match.group(1)
    child.expect(r"\$ ")  # the shell's own prompt: typed-ahead input may be dropped before it
    child.sendline("export PS1='corral-test''$ '")
    child.expect_exact(PROMPT)
    child.sendline("echo CVD=[$CUDA_VISIBLE_DEVICES] JOB=$CORRAL_JOB_ID UID=$(id -u) TTY=$(tty)")
    child.expect(r"CVD=\[(\d+),(\d+)\] JOB=(\w+) UID=(\d+) TTY=(/dev/pts/\d+)")
    assert child.match.group(3) == job_id
    assert int(child.match.group(4)) == nobody().pw_uid  # the job's user, never the root agent's
    with lab.server.client() as c:
        node = next(n for n in c.get("/v1/nodes").json()["nodes"] if n["name"] == "dgx01")
    assert node["allocated"] >= 2
    # Ctrl-C reaches the shell's foreground job, not the shell (nor the allocation)
    child.expect_exact(PROMPT)
    child.sendline("sleep 100")
    wait_for(lambda: b"sleep 100" in subprocess.run(["ps", "-eo", "args"], capture_output=True).stdout)
    child.sendcontrol("c")
    child.expect_exact(PROMPT)
    child.sendline("echo status-$?")
    child.expect(r"status-(\d+)")
    assert int(child.match.group(1)) == 130  # the sleep was killed by SIGINT; the shell goes on
    child.expect_exact(PROMPT)
    child.sendline("stty size")  # the terminal has the user's size, and follows a resize
    child.expect(r"30 100")
    child.setwinsize(40, 120)
    child.expect_exact(PROMPT)
    child.sendline("stty size")
    child.expect(r"40 120")
    child.sendline("exit 0")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert wait_for(lambda: lab.state_is(job_id, "finished"), timeout=30)
    with lab.server.client() as c:
        jobs = c.get("/v1/jobs", params={"state": "active"}).json()["jobs"]
        assert job_id not in {j["id"] for j in jobs}
        node = next(n for n in c.get("/v1/nodes").json()["nodes"] if n["name"] == "dgx01")
        assert node["allocated"] == sum(len(p["gpus"]) for j in jobs for p in j["placement"] or [])


def test_alloc_ends_when_its_user_goes_away(lab: Lab) -> None:
    child = spawn(lab, lab.alice, "alloc", "--queue", "research", "--gpus", "1")
    child.expect(r"(j\w+): running on dgx01")
    job_id = child.match.group(1)
    child.expect(r"\$ ")
    child.kill(signal.SIGKILL)  # the connection drops: the shell is hung up, the allocation ends
    child.close()
    try:
        wait_for(lambda: lab.state_is(job_id, "finished"), timeout=60)
    except AssertionError:
        raise AssertionError(f"{lab.job(job_id)}\nagent:\n{lab.agent.output()[-3000:]}") from None


# ---- corral attach -----------------------------------------------------------------------------
def test_attach_sees_the_jobs_env_and_cwd_and_leaves_it_running(lab: Lab) -> None:
    job_id = submit(lab, lab.alice, gpus_per_replica=1, command=["sleep", "300"], env={"FOO": "bar-42"})
    try:
        running(lab, job_id)
        child = spawn(lab, lab.alice, "attach", job_id)
        child.expect(r"\$ ")
        line = "echo FOO=$FOO JOB=$CORRAL_JOB_ID CWD=$(pwd) UID=$(id -u) SECRET=[$CORRAL_TEST_SECRET]"
        child.sendline(line)
        child.expect(r"FOO=bar-42 JOB=(\w+) CWD=(\S+) UID=(\d+) SECRET=\[\]")  # none of the agent's env
        assert child.match.group(1) == job_id
        assert child.match.group(2).endswith(f"/run/{job_id}/attempt-1/work")
        assert int(child.match.group(3)) == nobody().pw_uid
        child.sendline("grep -c . /proc/self/cgroup >/dev/null; cat /proc/self/cgroup")
        child.expect(rf"corral-dgx01-\w+/{job_id}-1")  # inside the attempt's cgroup
        child.sendline("exit 7")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 7
        assert lab.state_is(job_id, "running")  # exiting the shell leaves the job running
    finally:
        with lab.server.client(lab.alice) as c:
            c.post(f"/v1/jobs/{job_id}/cancel")


def test_run_and_attach_skip_a_dead_first_address(lab: Lab) -> None:
    both = f"http://127.0.0.1:{free_port()},{lab.server.url}"  # docs/cli.md, "Several servers"
    ok = corral(lab, lab.alice, "run", "--server", both, "--queue", "research", "--", "echo", "via-second")
    assert ok.returncode == 0, ok.stderr
    assert "via-second" in ok.stdout
    job_id = submit(lab, lab.alice, gpus_per_replica=1, command=["sleep", "300"])
    try:
        running(lab, job_id)
        child = spawn(lab, lab.alice, "attach", "--server", both, job_id)
        child.expect(r"\$ ")
        child.sendline("echo JOB=$CORRAL_JOB_ID")
        child.expect(rf"JOB={job_id}")
        child.sendline("exit 0")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
    finally:
        with lab.server.client(lab.alice) as c:
            c.post(f"/v1/jobs/{job_id}/cancel")


# ---- attacks -----------------------------------------------------------------------------------
def _ws(lab: Lab, path: str, token: str) -> int:
    """The HTTP status the server refuses a WebSocket with (101 if it accepted)."""
    url = lab.server.url.replace("http", "ws", 1) + path
    try:
        with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=10):
            return 101
    except InvalidStatus as exc:
        return int(exc.response.status_code)


def _audit(lab: Lab, action: str) -> list[dict[str, Any]]:
    with lab.server.client() as c:
        rows: list[dict[str, Any]] = c.get("/v1/audit", params={"limit": 500}).json()["audit"]
    return [r for r in rows if r["action"].startswith(action)]


def test_another_team_forged_revoked_and_agent_tokens_are_refused_and_nothing_starts(lab: Lab) -> None:
    job_id = submit(lab, lab.alice, gpus_per_replica=1, command=["sleep", "300"])
    try:
        running(lab, job_id)
        before = lab.agent.output().count("terminal")
        out = corral(lab, lab.bob, "attach", job_id)
        assert out.returncode == 3 and "another team" in out.stderr, out.stderr
        path = f"/v1/jobs/{job_id}/terminal"
        assert _ws(lab, path, lab.bob) == 403
        assert _ws(lab, path, "crl_t000000000000_forged") == 401
        revoked = lab.server.token("carol", "member", team="research")
        with lab.server.client() as c:
            token_id = revoked.split("_")[1]
            assert c.delete(f"/v1/tokens/{token_id}").status_code == 200
        assert _ws(lab, path, revoked) == 401
        assert _ws(lab, path, lab.server.agent_token("dgx01")) == 403  # agents never open shells
        # the agent's side: only dgx01's agent, and only for a session ordered on dgx01
        other = lab.server.token("agent-dgx02", "agent", node="dgx02")
        assert _ws(lab, "/v1/agents/dgx01/terminals/" + "a" * 24, other) == 403
        assert _ws(lab, "/v1/agents/dgx01/terminals/" + "a" * 24, lab.server.agent_token("dgx01")) == 404
        assert _ws(lab, "/v1/agents/dgx01/terminals/" + "a" * 24, lab.alice) == 403
        assert lab.agent.output().count("terminal") == before  # nothing was asked of the node
        refused = [r["result"] for r in _audit(lab, f"WS /v1/jobs/{job_id}/terminal")]
        assert refused.count("403") >= 3 and "101" not in refused
        assert len([r for r in _audit(lab, "WS /v1/jobs") if r["result"] == "401"]) >= 2
    finally:
        with lab.server.client(lab.alice) as c:
            c.post(f"/v1/jobs/{job_id}/cancel")


def test_an_idle_terminal_is_closed_and_the_job_goes_on(lab: Lab) -> None:
    job_id = submit(lab, lab.alice, gpus_per_replica=1, command=["sleep", "300"])
    try:
        running(lab, job_id)
        child = spawn(lab, lab.alice, "attach", job_id)
        child.expect(r"\$ ")
        child.expect("without traffic", timeout=120)  # nothing typed for 20 s (this server's idle bound)
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus != 0  # the shell was hung up, it did not exit on its own
        assert lab.state_is(job_id, "running")
    finally:
        with lab.server.client(lab.alice) as c:
            c.post(f"/v1/jobs/{job_id}/cancel")


def test_terminals_per_job_are_bounded(lab: Lab) -> None:
    job_id = submit(lab, lab.alice, gpus_per_replica=1, command=["sleep", "300"])
    url = lab.server.url.replace("http", "ws", 1) + f"/v1/jobs/{job_id}/terminal"
    try:
        running(lab, job_id)
        with contextlib.ExitStack() as opened:
            for _ in range(4):
                opened.enter_context(
                    connect(url, additional_headers={"Authorization": f"Bearer {lab.alice}"})
                )
            assert _ws(lab, f"/v1/jobs/{job_id}/terminal", lab.alice) == 429
    finally:
        with lab.server.client(lab.alice) as c:
            c.post(f"/v1/jobs/{job_id}/cancel")


def test_a_shell_open_and_close_are_audited(lab: Lab) -> None:
    job_id = submit(lab, lab.alice, gpus_per_replica=1, command=["sleep", "300"])
    try:
        running(lab, job_id)
        child = spawn(lab, lab.alice, "attach", job_id)
        child.expect(r"\$ ")
        child.sendline("exit 0")
        child.expect(pexpect.EOF)
        child.close()
        rows = wait_for(lambda: [r for r in _audit(lab, "terminal") if r["target"] == job_id][:2] or None)
        assert sorted(r["action"] for r in rows) == ["terminal close", "terminal open"] or len(rows) == 1
        closes = wait_for(lambda: [r for r in _audit(lab, "terminal close") if r["target"] == job_id])
        assert re.search(r"exit 0", closes[0]["detail"]), json.dumps(closes)
        assert any(r["principal"] == "alice" for r in closes)
        assert pwd.getpwuid(os.geteuid()).pw_uid == 0
    finally:
        with lab.server.client(lab.alice) as c:
            c.post(f"/v1/jobs/{job_id}/cancel")
