"""A member's job attacks the node it runs on (issue 13, findings 1, 5, 6), with a real server and
a real agent run as root with no opt-in to root jobs, as a production node is: jobs run as
`nobody`. The job's env carries payloads (a `sitecustomize.py` on PYTHONPATH, an LD_PRELOAD
library, BASH_ENV, PYTHONSTARTUP, LD_LIBRARY_PATH) that record the uid they ran as; none may run
as root, no root process may see the job's env, no secret of the agent's env may reach the job,
and nothing the job plants in its own folders may make the agent write as root."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.conftest import AgentProcess
from tests.agent.test_agent import events
from tests.agent.test_sandbox import CLUSTER, ended, submit
from tests.server.harness import Server, wait_for

SECRET = "s3cr3t-of-the-agent"
EVIL_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void hit(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/preload-%d", DIR, (int)getpid());
    FILE *f = fopen(path, "w");
    if (f) { fprintf(f, "%d\n", (int)getuid()); fclose(f); }
}
"""
JOB_PY = r"""
import json, os, sys, time
d = sys.argv[1]
json.dump(dict(os.environ), open(os.path.join(d, "env.json"), "w"))
tries = {}
for name, path, mode in [
    ("control", os.path.join(os.environ["CORRAL_CONTROL_DIR"], "planted"), "w"),
    ("record", os.path.join(os.environ["CORRAL_CONTROL_DIR"], "attempt.json"), "r"),
]:
    try:
        open(path, mode).close()
        tries[name] = "ok"
    except OSError as exc:
        tries[name] = type(exc).__name__
json.dump(tries, open(os.path.join(d, "tries.json"), "w"))
while not os.path.exists(os.path.join(d, "go")):
    time.sleep(0.05)
"""


def need(ok: bool, what: str) -> None:
    """A prerequisite: skipped on a developer's machine without it, a failure in CI."""
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what}: CI must run these tests as root with gcc and a `nobody` user", pytrace=False)
    pytest.skip(what)


def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        need(False, "no user `nobody` on this machine")
        raise


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[Server, AgentProcess, Path]]:
    """A server, and dgx01's agent run as root without --default-user or --allow-root-jobs, with
    a secret in its environment; its folders live where an unprivileged job can reach its own."""
    need(os.geteuid() == 0, "the agent must run as root to start jobs as another user")
    nobody()
    base = Path(tempfile.mkdtemp(prefix="corral-sec-"))  # pytest's folders are closed to nobody
    base.chmod(0o711)
    allowed = base / "data"
    allowed.mkdir()
    cluster = base / "cluster.yaml"
    cluster.write_text(CLUSTER.format(allowed=allowed))
    srv = Server(f"sqlite:///{base / 'corral.db'}", base / "server", cluster)
    srv.start()
    agent = AgentProcess(
        srv, "dgx01", base, extra=[], env={"CORRAL_TEST_SECRET": SECRET, "LC_ALL": "C.UTF-8"}
    )
    try:
        agent.wait_joined()
        yield srv, agent, base
    finally:
        agent.stop()
        srv.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def payloads() -> Iterator[Path]:
    """A folder of the unprivileged user's with payloads that record the uid they run as."""
    need(shutil.which("gcc") is not None, "gcc is needed to build the LD_PRELOAD payload")
    user = nobody()
    folder = Path(tempfile.mkdtemp(prefix="corral-payload-"))
    try:
        record = "import os; open(os.path.join({d!r}, '{kind}-%d' % os.getpid()), 'w')"
        record += ".write(str(os.getuid()))"
        (folder / "sitecustomize.py").write_text(record.format(d=str(folder), kind="site"))
        (folder / "startup.py").write_text(record.format(d=str(folder), kind="startup"))
        (folder / "bashenv.sh").write_text(f'id -u > "{folder}/bash-$$"\n')
        (folder / "job.py").write_text(JOB_PY)
        source = folder / "evil.c"
        source.write_text(EVIL_C)
        subprocess.run(
            ["gcc", "-shared", "-fPIC", f'-DDIR="{folder}"', "-o", str(folder / "evil.so"), str(source)],
            check=True,
        )
        for path in [folder, *folder.iterdir()]:
            os.chown(path, user.pw_uid, user.pw_gid)
        folder.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def hits(folder: Path) -> dict[str, list[int]]:
    """Which payload ran, by kind, and the uids it ran as."""
    out: dict[str, list[int]] = {}
    for path in folder.iterdir():
        kind, _, pid = path.name.partition("-")
        if pid.isdigit():
            out.setdefault(kind, []).append(int(path.read_text()))
    return out


def processes_of(group: int) -> list[int]:
    """The live processes of a process group (a rank's shim leads its rank's group)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group:
                found.append(int(entry.name))
    return found


def uid_env_maps(pid: int) -> tuple[int, dict[str, str], str]:
    status = Path(f"/proc/{pid}/status").read_text()
    uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().partition("=")[::2] for item in raw if item)
    return uid, env, Path(f"/proc/{pid}/maps").read_text()


def run_dir(agent: AgentProcess, job_id: str) -> Path:
    return agent.data_dir / "run" / job_id / "attempt-1"


def test_the_jobs_env_never_reaches_root_and_the_agents_env_never_reaches_the_job(
    node: tuple[Server, AgentProcess, Path], payloads: Path
) -> None:
    server, agent, _ = node
    user = nobody()
    job_env = {
        "PYTHONPATH": str(payloads),
        "PYTHONSTARTUP": str(payloads / "startup.py"),
        "LD_PRELOAD": str(payloads / "evil.so"),
        "LD_LIBRARY_PATH": str(payloads),
        "BASH_ENV": str(payloads / "bashenv.sh"),
    }
    command = ["/bin/bash", "-c", f"/usr/bin/python3 {payloads / 'job.py'} {payloads}"]
    member = server.token("mallory", "member", team="research", run_as="nobody")
    job_id = submit(server, member, command=command, env=job_env, working_dir=str(payloads))
    wait_for(lambda: (payloads / "tries.json").exists(), timeout=30)
    record = json.loads((run_dir(agent, job_id) / "attempt.json").read_text())
    (shim,) = [int(r["pid"]) for r in record["ranks"]]
    seen = {pid: uid_env_maps(pid) for pid in processes_of(shim)}  # while the job runs
    (payloads / "go").write_text("")
    assert ended(server, job_id)["state"] == "finished", agent.output()

    ran = hits(payloads)  # kind -> the uids it ran as
    assert {"site", "preload", "bash"} <= set(ran), ran  # each payload ran, for the job itself
    assert all(uid == user.pw_uid for uids in ran.values() for uid in uids), ran  # never as root
    assert shim in seen and len(seen) >= 2, seen  # the shim, and the job (bash execs python)
    for pid, (uid, env, maps) in seen.items():
        if uid == 0:  # only the shim: it sees none of the job's env and loads none of its files
            assert pid == shim, (pid, env)
            assert not set(env) & {*job_env, "CORRAL_TEST_SECRET"}, env
            assert not [k for k in env if k.startswith(("LD_", "PYTHON"))], env
            assert str(payloads) not in maps
        else:
            assert uid == user.pw_uid, (pid, uid)
    env = json.loads((payloads / "env.json").read_text())
    assert SECRET not in json.dumps(env) and "CORRAL_TEST_SECRET" not in env
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == (user.pw_dir, "nobody", "nobody")
    assert env["LC_ALL"] == "C.UTF-8"  # allowlisted from the agent's environment
    assert all(env[k] == v for k, v in job_env.items())  # the job gets what it asked for
    assert env["CORRAL_JOB_ID"] == job_id and env["WORLD_SIZE"] == "1"
    # its control folder (the agent's, written as root) and its record (the job's env) are closed
    tries = json.loads((payloads / "tries.json").read_text())
    assert tries == {"control": "PermissionError", "record": "PermissionError"}, tries


def test_a_link_planted_in_the_checkpoint_folder_is_refused_not_followed(
    node: tuple[Server, AgentProcess, Path],
) -> None:
    """Attempt 1 plants `attempt-2 -> a root folder` and fails: attempt 2 must not give that
    folder to the job's user (a chown as root through the link would)."""
    server, _, _ = node
    target = Path(tempfile.mkdtemp(prefix="corral-root-owned-"))
    try:
        plant = 'ln -s "$0" "$CORRAL_CHECKPOINT_DIR/attempt-2"; exit 3'
        member = server.token("trudy", "member", team="research", run_as="nobody")
        job_id = submit(server, member, command=["/bin/sh", "-c", plant, str(target)], max_restarts=1)
        done = ended(server, job_id, timeout=60)
        info = target.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700), info
        assert done["state"] == "failed" and done["attempt"] == 2, done
        assert "is not a folder (a link or a file)" in done["reason"], done
        assert [e["event"] for e in events(server, job_id)][-1] == "fail"
    finally:
        shutil.rmtree(target)


def test_root_runs_no_job_unless_the_node_allows_it(node: tuple[Server, AgentProcess, Path]) -> None:
    server, _, _ = node
    with server.client() as c:
        for name in ("root", "0"):
            body = {"name": "eve", "role": "member", "team": "research", "run_as": name}
            r = c.post("/v1/tokens", json=body)
            assert r.status_code == 422, r.text
            assert "jobs never run as root" in r.json()["error"] and "--run-as" in r.json()["fix"]
        # an admin who insists gets the token, and a node without --allow-root-jobs still refuses
        r = c.post(
            "/v1/tokens",
            json={"name": "eve", "role": "member", "team": "research", "run_as": "root", "allow_root": True},
        )
        assert r.status_code == 201, r.text
        rooted = str(r.json()["token"])
    job_id = submit(server, rooted, command=["/bin/sh", "-c", "id -u"])
    done = ended(server, job_id)
    assert done["state"] == "failed" and "does not run jobs as root" in done["reason"], done
    assert "--allow-root-jobs" in done["reason"]


def test_records_and_logs_are_private_to_the_agent_and_the_jobs_user(
    node: tuple[Server, AgentProcess, Path],
) -> None:
    server, agent, _ = node
    user = nobody()
    job_id = submit(server, command=["/bin/sh", "-c", "id -u"])  # no --run-as: the node's default
    assert ended(server, job_id)["state"] == "finished", agent.output()
    mode = stat.S_IMODE(agent.data_dir.stat().st_mode)
    assert mode == 0o711, oct(mode)  # others pass through to their own files, never list
    record = run_dir(agent, job_id) / "attempt.json"
    info = record.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o600)
    log = agent.data_dir / "logs" / job_id / "attempt-1" / "rank-0.log"
    info = log.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (user.pw_uid, 0o600)
    assert log.read_text() == f"{user.pw_uid}\n"  # a root agent's default user is nobody
    for folder in (record.parent, log.parent):
        assert stat.S_IMODE(folder.stat().st_mode) & 0o022 == 0 and folder.stat().st_uid == 0

    def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", "nobody", "--", *argv], capture_output=True, text=True)

    assert as_nobody("cat", str(log)).stdout == f"{user.pw_uid}\n"  # the job's user reads its log
    denied = as_nobody("cat", str(record))
    assert denied.returncode != 0 and "Permission denied" in denied.stderr
    assert as_nobody("ls", str(agent.data_dir)).returncode != 0
    assert as_nobody("ls", str(agent.data_dir / "run")).returncode != 0


def test_a_working_dir_the_jobs_user_cannot_enter_fails_at_once(
    node: tuple[Server, AgentProcess, Path], tmp_path: Path
) -> None:
    """The agent (root) could enter it; the job's user enters it itself, so it is refused first."""
    server, _, _ = node
    closed = tmp_path / "closed"  # under pytest's folders, which only root may enter
    closed.mkdir()
    closed.chmod(0o777)
    job_id = submit(server, command=["/bin/sh", "-c", "ls"], working_dir=str(closed))
    done = ended(server, job_id)
    assert done["state"] == "failed" and done["attempt"] == 1, done
    assert "user 'nobody' cannot enter" in done["reason"] and "is closed to it" in done["reason"], done
