"""Submissions refused at the door (DESIGN.md 4.2, 4.8, 6.6), on SQLite and PostgreSQL.

Each bad submission gets the right status and a message that says what to change; nothing is
written (no job, no event); and the submission with that change made is accepted.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.harness import Server
from tests.server.scenario import LAB, events, queue_entry, running_server, write_cluster

# research: only low and normal, mounts from /datasets, at most a day; prod: the lab's
CLUSTER = copy.deepcopy(LAB)
queue_entry(CLUSTER, "research").update(
    priorities=["low", "normal"], mount_allowlist=["/datasets"], default_time_limit="4h", max_time_limit="1d"
)

OK = {"queue": "research", "command": ["python", "train.py"]}

# label: (the bad spec, status, fragments of the error text, fragments of the fix, the spec fixed)
CASES: dict[str, tuple[dict[str, Any], int, list[str], list[str], dict[str, Any]]] = {
    "unknown queue": (
        {**OK, "queue": "reserach"}, 422, ["queue", "unknown queue 'reserach'"], ["research, prod"], OK,
    ),
    "gang no node can hold": (
        {**OK, "gpus_per_replica": 16}, 422,
        ["can never run", "needs 16 GPUs per replica; the largest node has 8"],
        ["use more replicas of at most 8 GPUs each"],
        {**OK, "replicas": 2, "gpus_per_replica": 8},
    ),
    "gang no leaf can hold": (
        {**OK, "replicas": 3, "gpus_per_replica": 8, "topology": {"pack": "leaf", "required": True}}, 422,
        ["can never run", "3 replicas of 8 GPUs inside one leaf (required)",
         "the largest leaf holds 2 replicas"],
        ["without --pack-required", "at most 2 replicas"],
        {**OK, "replicas": 3, "gpus_per_replica": 8, "topology": {"pack": "leaf", "required": False}},
    ),
    "gang over the queue's limit": (
        {**OK, "replicas": 5, "gpus_per_replica": 8}, 422, ["needs 40 GPUs", "limited to 32"],
        ["at most 32 GPUs"],
        {**OK, "replicas": 4, "gpus_per_replica": 8},
    ),
    "unknown GPU model": (
        {**OK, "gpu_model": "A100-40GB"}, 422,
        ["no node has GPUs of model A100-40GB", "models in the cluster: H100-80GB"],
        ["--gpu-model"],
        {**OK, "gpu_model": "H100*"},
    ),
    "unknown pack level": (
        {**OK, "topology": {"pack": "rack"}}, 422, ["topology.pack", "unknown pack level 'rack'"],
        ["nvlink, node, leaf, spine"], {**OK, "topology": {"pack": "leaf"}},
    ),
    "command as one string with spaces": (
        {**OK, "command": ["python train.py --epochs 3"]}, 422, ["command", "contains spaces"],
        ['["python", "train.py", "--epochs", "3"]'],
        {**OK, "command": ["python", "train.py", "--epochs", "3"]},
    ),
    "command as a shell string": (
        {**OK, "command": "python train.py"}, 422, ["command", "never run by a shell"],
        ['["python", "train.py"]'], OK,
    ),
    "no command": ({"queue": "research"}, 422, ["command", "needs a command"], ["as a list"], OK),
    "mount outside the allowlist": (
        {**OK, "mounts": [{"source": "/home/ana/data", "target": "/data"}]}, 422,
        ["mounts[0].source", "/home/ana/data", "mount_allowlist"], ["/datasets"],
        {**OK, "mounts": [{"source": "/datasets/imagenet", "target": "/data", "read_only": True}]},
    ),
    "mount escaping the allowlist": (
        {**OK, "mounts": [{"source": "/datasets/../etc", "target": "/data"}]}, 422, ["mount_allowlist"],
        ["/datasets"], OK,
    ),
    "mount on a queue without an allowlist": (
        {**OK, "queue": "prod", "mounts": [{"source": "/datasets/x", "target": "/data"}]}, 422,
        ["mount_allowlist"], ["ask an admin"], {**OK, "queue": "prod"},
    ),
    "priority class not allowed": (
        {**OK, "priority": "urgent"}, 422, ["priority", "does not allow priority class 'urgent'"],
        ["low, normal"], {**OK, "priority": "low"},
    ),
    "unknown priority class": (
        {**OK, "priority": "ultra"}, 422, ["unknown priority class 'ultra'"], ["low, normal, high, urgent"],
        {**OK, "priority": "normal"},
    ),
    "time limit above the queue's maximum": (
        {**OK, "time_limit": "2d"}, 422, ["time_limit", "exceeds the queue's maximum 1d"], ["at most 1d"],
        {**OK, "time_limit": "1d"},
    ),
    "time limit without units": (
        {**OK, "time_limit": 3600}, 422, ["time_limit"], [], {**OK, "time_limit": "1h"},
    ),
    "a field name with a typo": (
        {**OK, "gpu_per_replica": 4}, 422, ["gpu_per_replica", "unknown field"],
        ["did you mean `gpus_per_replica`?"], {**OK, "gpus_per_replica": 4},
    ),
    "a nested field name with a typo": (
        {**OK, "checkpoint": {"grase": "60s"}}, 422, ["checkpoint.grase", "unknown field"],
        ["did you mean `grace`?"], {**OK, "checkpoint": {"grace": "60s"}},
    ),
    "a spec that is not a mapping": (
        ["python", "train.py"], 422, [], [], OK,  # type: ignore[dict-item]
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("submit")
    with running_server(request.param, tmp, write_cluster(tmp, CLUSTER)) as srv:
        yield srv


def written(c: httpx.Client) -> tuple[list[str], list[int]]:
    return [j["id"] for j in c.get("/v1/jobs").json()["jobs"]], [e["seq"] for e in events(c)]


def refused(r: httpx.Response, status: int) -> str:
    """The whole error text (error and fix) of a refusal, after checking its status and shape."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) <= {"error", "fix", "code"} and body["error"], body
    return f"{body['error']} {body.get('fix', '')}"


@pytest.mark.parametrize("label", list(CASES))
def test_bad_submission_says_what_to_change(server: Server, label: str) -> None:
    spec, status, error, fix, fixed = CASES[label]
    with server.client() as c:
        before = written(c)
        r = c.post("/v1/jobs", json=spec)
        message = refused(r, status)
        for fragment in error + fix:
            assert fragment in message, (fragment, message)
        assert written(c) == before  # no job, no event
        ok = c.post("/v1/jobs", json=fixed)
        assert ok.status_code == 201, (label, ok.text)
        assert written(c)[0] == [*before[0], ok.json()["id"]]


def test_a_job_object_sent_back_is_accepted(server: Server) -> None:
    """`corral show --json` output, submitted again: the fields the server added are dropped."""
    with server.client() as c:
        first = c.post("/v1/jobs", json={**OK, "replicas": 2, "gpus_per_replica": 2, "name": "again"})
        shown = c.get(f"/v1/jobs/{first.json()['id']}").json()
        assert {"id", "state", "reason", "gpus", "submit_time"} <= set(shown)
        assert "time_limit: duration 14400.0 has no unit" in refused(c.post("/v1/jobs", json=shown), 422)
        shown["time_limit"] = f"{shown['time_limit']:.0f}s"  # seconds in the object; units in a spec
        again = c.post("/v1/jobs", json=shown)
        assert again.status_code == 201, again.text
        copy_ = again.json()
        assert copy_["id"] != shown["id"] and copy_["state"] == "pending"
        assert (copy_["name"], copy_["replicas"], copy_["gpus_per_replica"]) == ("again", 2, 2)


def test_never_fits_has_its_code(server: Server) -> None:
    with server.client() as c:
        for spec in (CASES["gang no node can hold"][0], CASES["unknown GPU model"][0]):
            r = c.post("/v1/jobs", json=spec)
            assert r.status_code == 422 and r.json()["code"] == "never_fits", r.text
            assert r.json()["fix"], r.text  # what to change, as docs/cli.md promises


def test_member_outside_the_team(server: Server) -> None:
    member = server.token("ana", "member", team="prod")
    with server.client(member) as m:
        before = written(m)
        message = refused(m.post("/v1/jobs", json=OK), 403)
        assert "team prod may not submit to queue research" in message and "one of: prod" in message
        assert written(m) == before
        # a member's default queue is its team's
        ok = m.post("/v1/jobs", json={"command": ["true"]})
        assert ok.status_code == 201 and ok.json()["queue"] == "prod"


def test_bodies_too_large_or_not_json(server: Server) -> None:
    with server.client() as c:
        before = written(c)
        big = {**OK, "env": {"BLOB": "x" * (1 << 20)}}
        message = refused(c.post("/v1/jobs", json=big), 413)
        assert "over 1048576 bytes" in message
        # the same without Content-Length (chunked): counted as it arrives
        chunks = iter(
            [json.dumps(big).encode()[i : i + 65536] for i in range(0, (1 << 20) + 65536 * 2, 65536)]
        )
        r = c.post("/v1/jobs", content=chunks, headers={"content-type": "application/json"})
        assert "over 1048576 bytes" in refused(r, 413)
        for body in (b"{not json", b'{"command": ["true"]', b""):
            r = c.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
            assert "invalid request" in refused(r, 422), body
        assert written(c) == before
        # just under the limit is fine (padded with white space: a 1 MB value could never launch)
        text = json.dumps(OK)
        fits = text + " " * ((1 << 20) - 10 - len(text))
        r = c.post("/v1/jobs", content=fits, headers={"content-type": "application/json"})
        assert r.status_code == 201, r.text
