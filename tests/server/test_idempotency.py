"""`Idempotency-Key` on `POST /v1/jobs` (server/idempotency.py), on SQLite and PostgreSQL.

A retry with the same key and body returns the job the first request made (200, same id, no
second job); the same key with another body is refused (422); keys are per user; a key past
its lifetime may be used again; many copies of one keyed request at once make one job.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from corral.server.idempotency import TTL
from tests.server.harness import Server
from tests.server.scenario import running_server

LAB = Path(__file__).resolve().parents[2] / "examples" / "lab.yaml"
SPEC = {"queue": "research", "command": ["python", "train.py"], "gpus_per_replica": 1}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def srv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(request.param, tmp_path_factory.mktemp(request.param), LAB) as server:
        yield server


def post(c: httpx.Client, key: str | None, spec: object = SPEC) -> httpx.Response:
    return c.post("/v1/jobs", json=spec, headers={"Idempotency-Key": key} if key else {})


def job_count(c: httpx.Client) -> int:
    return len(c.get("/v1/jobs", params={"limit": 10_000}).json()["jobs"])


def submit_events(c: httpx.Client, job_id: str) -> int:
    events = c.get(f"/v1/jobs/{job_id}/events").json()["events"]
    return sum(1 for e in events if e["event"] == "submit")


def test_same_key_same_body_returns_the_same_job(srv: Server) -> None:
    key = str(uuid.uuid4())
    with srv.client() as c:
        before = job_count(c)
        first = post(c, key)
        assert first.status_code == 201, first.text
        again = post(c, key)
        assert again.status_code == 200, again.text
        assert again.json()["id"] == first.json()["id"]
        # key order and spacing in the body do not matter: the body's canonical JSON is compared
        reordered = dict(reversed(list(SPEC.items())))
        assert post(c, key, reordered).json()["id"] == first.json()["id"]
        assert job_count(c) == before + 1
        assert submit_events(c, first.json()["id"]) == 1
        # without a key every request is a new job, as before
        assert post(c, None).json()["id"] != post(c, None).json()["id"]


def test_same_key_other_body_is_refused(srv: Server) -> None:
    key = str(uuid.uuid4())
    with srv.client() as c:
        made = post(c, key).json()["id"]
        before = job_count(c)
        r = post(c, key, {**SPEC, "command": ["python", "eval.py"]})
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["code"] == "idempotency_key_reused"
        assert key in body["error"] and made in body["error"] and "different body" in body["error"]
        assert "new key" in body["fix"]
        assert job_count(c) == before


def test_keys_are_per_user(srv: Server) -> None:
    key = "shared-key-" + uuid.uuid4().hex
    member = srv.token("ana-" + uuid.uuid4().hex[:6], "member", team="research")
    with srv.client() as admin, srv.client(member) as ana:
        mine = post(admin, key)
        theirs = post(ana, key)
        assert mine.status_code == theirs.status_code == 201, theirs.text
        assert mine.json()["id"] != theirs.json()["id"]
        assert post(ana, key).json()["id"] == theirs.json()["id"]


def test_a_keyed_array_is_replayed_as_the_array(srv: Server) -> None:
    key = str(uuid.uuid4())
    spec = {**SPEC, "array": "0-3"}
    with srv.client() as c:
        before = job_count(c)
        first = post(c, key, spec)
        assert first.status_code == 201 and first.json()["array"] is True, first.text
        again = post(c, key, spec)
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text
        assert again.json()["tasks"] == 4
        assert job_count(c) == before + 4
        assert post(c, key, {**spec, "array": "0-4"}).status_code == 422


def test_bad_keys_are_refused_with_the_rule(srv: Server) -> None:
    with srv.client() as c:
        before = job_count(c)
        for bad in ("two words", "x" * 256, "é-key"):
            r = c.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": bad.encode()})
            assert r.status_code == 422, (bad, r.text)
            assert "Idempotency-Key" in r.json()["error"] and "printable ASCII" in r.json()["error"]
            assert "UUID" in r.json()["fix"]
        assert job_count(c) == before
        # a body the key's digest must still read: a lone surrogate in a string
        odd = c.post(
            "/v1/jobs",
            content=b'{"queue": "research", "command": ["echo", "\\ud800"]}',
            headers={"Idempotency-Key": "odd-" + uuid.uuid4().hex, "content-type": "application/json"},
        )
        assert odd.status_code in (201, 422), odd.text
        # the draft's structured-field form (a quoted string) is the same key as the bare one
        made = post(c, '"quoted-' + "k" * 8 + '"').json()["id"]
        assert post(c, "quoted-" + "k" * 8).json()["id"] == made


def test_copies_sent_at_once_make_one_job(srv: Server) -> None:
    key = str(uuid.uuid4())
    with srv.client() as c:
        before = job_count(c)
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda _: post(c, key), range(32)))
        assert {r.status_code for r in answers} <= {200, 201}, [r.text for r in answers]
        assert [r.status_code for r in answers].count(201) == 1
        assert len({r.json()["id"] for r in answers}) == 1
        assert job_count(c) == before + 1


def test_an_expired_key_may_be_used_again(srv: Server) -> None:
    key = str(uuid.uuid4())
    with srv.client() as c:
        first = post(c, key).json()["id"]
        engine = create_engine(srv.database_url)
        with engine.begin() as conn:  # as if the first request were older than the key's lifetime
            conn.execute(
                text('UPDATE idempotency_keys SET created_at = created_at - :age WHERE "key" = :key'),
                {"age": TTL + 60, "key": key},
            )
        again = post(c, key)
        assert again.status_code == 201 and again.json()["id"] != first, again.text
        assert post(c, key).json()["id"] == again.json()["id"]
        with engine.connect() as conn:
            rows = conn.execute(text('SELECT count(*) FROM idempotency_keys WHERE "key" = :k'), {"k": key})
            assert rows.scalar() == 1  # the expired row was deleted, not kept beside the new one
        engine.dispose()


def test_the_sweep_deletes_only_expired_keys(srv: Server) -> None:
    from corral.server.idempotency import sweep

    with srv.client() as c:
        kept = str(uuid.uuid4())
        post(c, kept)
    engine = create_engine(srv.database_url)
    old = "old-" + uuid.uuid4().hex
    with engine.begin() as conn:
        conn.execute(
            text(
                'INSERT INTO idempotency_keys ("user", "key", digest, job_id, created_at) '
                "VALUES ('someone', :key, 'x', 'j1', :t)"
            ),
            {"key": old, "t": time.time() - TTL - 1},
        )
        assert sweep(conn, time.time()) >= 1
        left = {k for (k,) in conn.execute(text('SELECT "key" FROM idempotency_keys'))}
    engine.dispose()
    assert old not in left and kept in left
