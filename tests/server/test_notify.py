"""Webhook notifications against a real control plane (SQLite and PostgreSQL) and a real receiver
on loopback: each subscribed event arrives once per delivery id, signed with the sink's secret,
also across a `kill -9` and restart of the control plane; a failing receiver gets it on retry
and the metrics count the failures; a sink outside the allowlist is refused."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.server.conftest import LAB
from tests.server.harness import FakeAgent, Server, wait_for

SECRET = b"s3cret-for-tests"


class Receiver:
    """A webhook receiver on loopback: records every request; answers 503 while `failing` or for
    the next `fail_next` requests, else 204."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.failing = False
        self.fail_next = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    refuse = receiver.failing or receiver.fail_next > 0
                    receiver.fail_next = max(0, receiver.fail_next - 1)
                    receiver.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body, "ok": not refuse}
                    )
                self.send_response(503 if refuse else 204)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def delivered(self) -> list[dict[str, Any]]:
        """The requests answered 2xx, each checked: signature, ids, path."""
        with self.lock:
            done = [r for r in self.requests if r["ok"]]
        for r in done:
            expected = "sha256=" + hmac.new(SECRET, r["body"], hashlib.sha256).hexdigest()
            assert hmac.compare_digest(r["headers"]["Corral-Signature-256"], expected)
            payload = json.loads(r["body"])
            assert r["headers"]["Corral-Delivery"] == payload["id"] and r["path"] == "/hooks/corral"
            assert r["headers"]["Corral-Event"] == payload["kind"]
        return done

    def kinds(self) -> list[tuple[str, str]]:
        """(job, kind) of each delivered notification, in arrival order."""
        return [(p["job"]["id"], p["kind"]) for p in (json.loads(r["body"]) for r in self.delivered())]

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def cluster_file(tmp_path: Path, port: int, url: str | None = None) -> Path:
    secret = tmp_path / "webhook.secret"
    secret.write_bytes(SECRET + b"\n")
    path = tmp_path / "cluster.yaml"
    path.write_text(
        LAB.read_text()
        + f"""notify:
  allow: ["http://127.0.0.1:{port}/hooks/"]
  backoff: 0.2
  backoff_max: 1
  sinks:
    - name: ops
      url: {url or f"http://127.0.0.1:{port}/hooks/corral"}
      secret_file: {secret}
      queues: [research]
"""
    )
    return path


def submit(srv: Server, notify: list[str], **spec: Any) -> str:
    body = {"queue": "research", "command": ["true"], "notify": notify, "max_restarts": 0, **spec}
    with srv.client() as c:
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def start(agent: FakeAgent, job: str) -> None:
    wait_for(lambda: any(o.get("job") == job for o in agent.orders(wait=1)), timeout=20)
    assert agent.report(job, 1, "running").status_code == 200


def metric(srv: Server, name: str) -> float:
    with srv.client() as c:
        text = c.get("/metrics").text
    found = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_each_notification_once_signed_across_a_restart(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    srv = Server(database_url, tmp_path / "data", cluster_file(tmp_path, receiver.port))
    srv.start()
    try:
        agent = FakeAgent(srv, "dgx01", 8, "H100-80GB")
        agent.register()
        quiet = submit(srv, [])  # no subscription: nothing is sent for it
        start(agent, quiet)
        assert agent.report(quiet, 1, "exited", 0).status_code == 200
        first = submit(srv, ["start", "end"])
        start(agent, first)
        wait_for(lambda: receiver.kinds() == [(first, "start")], timeout=20)
        assert agent.report(first, 1, "exited", 0).status_code == 200
        wait_for(lambda: receiver.kinds() == [(first, "start"), (first, "end")], timeout=20)

        receiver.failing = True  # what follows waits in the outbox, then the control plane dies
        second = submit(srv, ["start", "end", "fail"])
        start(agent, second)
        wait_for(lambda: len(receiver.requests) >= 4, timeout=20)  # refused at least twice
        assert metric(srv, 'corral_notify_queue_depth{sink="ops"}') >= 1
        assert agent.report(second, 1, "exited", 7).status_code == 200  # acknowledged: journaled
        srv.kill()
        agent.close()
        receiver.failing = False
        srv.start()
        wait_for(lambda: len(receiver.kinds()) == 4, timeout=30)
        # both waited in the outbox, retried apart and sent concurrently: in either order (the
        # documented rule; a receiver orders them by the event's `seq`)
        assert sorted(receiver.kinds()[2:]) == [(second, "fail"), (second, "start")]
        ids = Counter(json.loads(r["body"])["id"] for r in receiver.delivered())
        assert set(ids.values()) == {1}, ids  # none twice, though the server was killed
        bodies = [json.loads(r["body"]) for r in receiver.delivered()[2:]]
        by_seq = sorted(bodies, key=lambda b: b["event"]["seq"])
        assert [b["kind"] for b in by_seq] == ["start", "fail"]  # the events' order, by seq
        failed = by_seq[1]
        assert failed["subscribed"] == ["fail", "end"] and failed["job"]["state"] == "failed"
        assert failed["event"]["event"] == "fail" and failed["event"]["exit_code"] == 7
        assert failed["sink"] == "ops" and failed["cluster"] == "lab"
        wait_for(lambda: metric(srv, 'corral_notify_queue_depth{sink="ops"}') == 0, timeout=10)
        with srv.client() as c:  # nothing more arrives later (e.g. a second pass over the journal)
            assert c.get(f"/v1/jobs/{second}").json()["state"] == "failed"
        assert len(receiver.kinds()) == 4
    finally:
        srv.stop()


def test_an_event_committed_while_the_api_is_down_is_sent_once_it_is_back(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    """The API (which sends notifications) is killed; the scheduler, a process of its own, goes
    on and starts a job that subscribed to `start` meanwhile; the restarted API sends it, once
    (were the start committed before the kill, it must still arrive once)."""
    cluster = cluster_file(tmp_path, receiver.port)
    srv = Server(database_url, tmp_path / "data", cluster, extra=["--no-scheduler"])
    srv.start()
    scheduler = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from corral.cli.main import main; main()",
            "scheduler",
            "--database-url",
            database_url,
        ],
        env=srv.env,
        start_new_session=True,
    )
    engine = create_engine(database_url)
    try:
        agent = FakeAgent(srv, "dgx01", 8, "H100-80GB")
        agent.register()
        first = submit(srv, [], replicas=1, gpus_per_replica=8)
        start(agent, first)
        waiting = submit(srv, ["start"], replicas=1, gpus_per_replica=8)  # behind `first`
        assert agent.report(first, 1, "exited", 0).status_code == 200
        srv.kill()  # the API; the scheduler ends `first` and starts `waiting` without it
        agent.close()

        def started() -> bool:
            with engine.connect() as conn:
                query = text("SELECT count(*) FROM events WHERE kind = 'start' AND job = :job")
                return bool(conn.execute(query, {"job": waiting}).scalar())

        wait_for(started, timeout=30)  # (almost always after the kill: the scheduler needs a cycle)
        srv.start()
        wait_for(lambda: receiver.kinds() == [(waiting, "start")], timeout=30)
        assert len(receiver.requests) == 1
    finally:
        srv.stop()
        os.killpg(scheduler.pid, signal.SIGTERM)
        scheduler.wait(10)
        engine.dispose()


def test_a_receiver_that_fails_twice_gets_it_on_retry_and_metrics_count_the_failures(
    tmp_path: Path, receiver: Receiver
) -> None:
    srv = Server(
        f"sqlite:///{tmp_path / 'corral.db'}", tmp_path / "data", cluster_file(tmp_path, receiver.port)
    )
    srv.start()
    try:
        agent = FakeAgent(srv, "dgx01", 8, "H100-80GB")
        agent.register()
        receiver.fail_next = 2
        job = submit(srv, ["start"])
        start(agent, job)
        wait_for(lambda: receiver.kinds() == [(job, "start")], timeout=20)
        attempts = receiver.requests
        assert [r["ok"] for r in attempts] == [False, False, True]
        assert len({r["body"] for r in attempts}) == 1  # the same body and id each time
        assert len({r["headers"]["Corral-Delivery"] for r in attempts}) == 1
        wait_for(lambda: metric(srv, 'corral_notify_deliveries_total{outcome="delivered",sink="ops"}') == 1)
        assert metric(srv, 'corral_notify_failures_total{sink="ops"}') == 2
        assert metric(srv, 'corral_notify_retries_total{sink="ops"}') == 2
        assert metric(srv, 'corral_notify_queue_depth{sink="ops"}') == 0
        agent.close()
    finally:
        srv.stop()


def test_a_sink_outside_the_allowlist_is_refused_and_members_do_not_see_sinks(
    tmp_path: Path, receiver: Receiver
) -> None:
    srv = Server(
        f"sqlite:///{tmp_path / 'corral.db'}", tmp_path / "data", cluster_file(tmp_path, receiver.port)
    )
    srv.start()
    try:
        with srv.client() as c:
            config = c.get("/v1/config").json()["config"]
            assert config["notify"]["sinks"][0]["name"] == "ops"
            config["notify"]["sinks"][0]["url"] = "http://169.254.169.254/latest/meta-data"
            refused = c.put("/v1/config", json=config)
            assert refused.status_code == 422
            error = refused.json()["error"]
            assert "notify.sinks[0].url" in error and "is not under any URL of notify.allow" in error
            assert c.get("/v1/config").json()["config"]["notify"]["sinks"][0]["url"].endswith("/hooks/corral")
            config["notify"]["sinks"][0]["url"] = f"http://127.0.0.1:{receiver.port}/hooks/other"
            config["notify"]["sinks"][0]["secret_file"] = str(tmp_path / "missing.secret")
            unreadable = c.put("/v1/config", json=config)
            assert unreadable.status_code == 422
            assert (
                "secret_file " + str(tmp_path / "missing.secret") + " cannot be read"
                in unreadable.json()["error"]
            )
            bad = c.post(
                "/v1/jobs", json={"queue": "research", "command": ["true"], "notify": ["end", "ends"]}
            )
            assert bad.status_code == 422 and "unknown notification event 'ends'" in bad.json()["error"]
        member = srv.token("alice", "member", team="research")
        with srv.client(member) as c:
            assert "notify" not in c.get("/v1/config").json()["config"]
    finally:
        srv.stop()
    outside = cluster_file(tmp_path, receiver.port, url=f"http://127.0.0.1:{receiver.port}/elsewhere")
    with pytest.raises(RuntimeError, match=r"is not under any URL of notify\.allow"):
        Server(f"sqlite:///{tmp_path / 'other.db'}", tmp_path / "other", outside).start()
