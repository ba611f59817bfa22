"""Bad input against a live server gets a clear 4xx, never a 500 (issue 13, findings 7 and 8).

Deep nesting, numbers too large for the database, backup paths that would overwrite a file,
land in the server's working directory or be the live database itself; job specs that could
never launch (a NUL byte, an argument over what exec accepts, absurd restart counts and time
limits, mounts over the job's own system). Each answer names the field and a fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.harness import Server
from tests.server.scenario import running_server, write_cluster


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("hostile")
    with running_server(request.param, tmp, write_cluster(tmp)) as srv:
        with srv.client() as c:
            r = c.put("/v1/queues/research", json={"mount_allowlist": ["/datasets"]})
            assert r.status_code == 200, r.text
        yield srv


def refused(r: httpx.Response, *words: str) -> dict[str, Any]:
    assert r.status_code == 422, (r.status_code, r.text)
    body: dict[str, Any] = r.json()
    assert body.get("fix"), body
    for word in words:
        assert word in body["error"], (word, body)
    return body


def test_deep_nesting_and_huge_numbers(server: Server) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with server.client() as c:
        r = c.post("/v1/jobs", content=deep, headers={"Content-Type": "application/json"})
        refused(r, "nested too deeply")
        nested_env = '{"queue": "research", "command": ["true"], "env": {"A": ' + deep + "}}"
        r = c.post("/v1/jobs", content=nested_env, headers={"Content-Type": "application/json"})
        refused(r, "nested too deeply")
        r = c.put("/v1/config", content=deep, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text  # FastAPI's own answer to a body it cannot parse
        refused(c.post("/v1/config/rollback", json={"revision": 10**30}), "revision")
        refused(c.get("/v1/events", params={"after": 10**30}), "after")
        refused(c.get("/v1/jobs", params={"after": 2**63}), "after")
    agent = server.token("agent-huge", "agent", node="dgx04")
    with server.client(agent) as a:
        r = a.post("/v1/agents/register", json={"node": "dgx04", "gpus": 10**30, "gpu_model": "H100-80GB"})
        refused(r, "gpus")
        r = a.post("/v1/agents/register", json={"node": "dgx04", "gpus": 8, "nvlink": [[0, 10**30]]})
        refused(r, "nvlink")
        r = a.post("/v1/agents/register", json={"node": "dgx04", "gpus": 8, "cpus": 2**70})
        refused(r, "cpus")


def test_backup_paths(server: Server, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("precious\n")
    with server.client() as c:
        refused(c.post("/v1/admin/backup", json={"path": str(notes)}), "not an earlier backup")
        assert notes.read_text() == "precious\n"
        refused(c.post("/v1/admin/backup", json={"path": "backup.db"}), "not an absolute path")
        assert not (Path.cwd() / "backup.db").exists()
        refused(c.post("/v1/admin/backup", json={"path": str(tmp_path)}), "directory")
        if server.database_url.startswith("sqlite"):
            live = server.database_url.removeprefix("sqlite:///")
            for path in (live, live + "-wal", str(Path(live).parent / "." / Path(live).name)):
                refused(c.post("/v1/admin/backup", json={"path": path}), "live database")
        # a new file, then the same path again (an earlier backup is overwritten)
        good = tmp_path / "corral-backup.db"
        for _ in range(2):
            r = c.post("/v1/admin/backup", json={"path": str(good)})
            assert r.status_code == 200 and r.json()["bytes"] > 0, r.text


SPEC = {"queue": "research", "command": ["true"]}
NEVER_LAUNCH: list[tuple[dict[str, Any], tuple[str, ...]]] = [
    ({"command": ["echo", "a\x00b"]}, ("command", "NUL")),
    ({"env": {"TOKEN": "x\x00y"}}, ("env", "NUL")),
    ({"command": ["echo", "x" * 500_000]}, ("command", "argument 1 is 500000 bytes")),
    ({"command": ["echo", *(["y" * 100_000] * 3)]}, ("command", "the command is")),
    ({"env": {f"V{i}": "z" * 100_000 for i in range(3)}}, ("env", "bytes")),
    ({"max_restarts": 10**9}, ("max_restarts",)),
    ({"cpus_per_replica": 10**30}, ("cpus_per_replica",)),
    ({"memory_gib_per_replica": 1e300}, ("memory_gib_per_replica",)),
    ({"name": "n" * 100_000}, ("name",)),
    ({"time_limit": "100000d"}, ("time_limit", "365d")),
    ({"mounts": [{"source": "/datasets/a", "target": "/"}]}, ("mounts", "target", "root")),
    ({"mounts": [{"source": "/datasets/a", "target": "/etc"}]}, ("mounts", "target", "/etc")),
    ({"mounts": [{"source": "/datasets/a", "target": "/../../etc"}]}, ("mounts", "not a normalised")),
    ({"mounts": [{"source": "/datasets/a", "target": "/usr/lib/x"}]}, ("mounts", "/usr")),
    ({"mounts": [{"source": "/datasets/a", "target": "/data/"}]}, ("mounts", "not a normalised")),
    ({"mounts": [{"source": "/datasets/a\x00", "target": "/data"}]}, ("mounts", "NUL")),
]


@pytest.mark.parametrize(("change", "words"), NEVER_LAUNCH, ids=lambda x: str(x)[:40])
def test_specs_that_could_never_launch_are_refused(
    server: Server, change: dict[str, Any], words: tuple[str, ...]
) -> None:
    with server.client() as c:
        refused(c.post("/v1/jobs", json={**SPEC, **change}), *words)


def test_specs_inside_the_bounds_are_accepted(server: Server) -> None:
    with server.client() as c:
        for change in (
            {"command": ["echo", "x" * 100_000]},
            {"max_restarts": 100, "time_limit": "365d"},
            {
                "mounts": [
                    {"source": "/datasets/a", "target": "/data"},
                    {"source": "/datasets/b", "target": "/mnt/b"},
                ]
            },
        ):
            r = c.post("/v1/jobs", json={**SPEC, **change})
            assert r.status_code == 201, r.text
