"""The client with several server addresses (client/failover.py), against real HTTP on loopback.

Each "replica" here is a small HTTP server in a thread that answers, answers 503, or reads the
request and drops the connection without answering (a replica killed mid-request); a closed
port stands for a dead one. What is checked: which requests move to the next address and
which do not (a POST without an Idempotency-Key never goes out twice), that the address that
answered stays in use, and what is said when none answers.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from corral.cli.settings import resolve_connection, write_config
from corral.client import Client, ClientError
from corral.client.failover import parse_servers


class Replica:
    """A loopback HTTP server; `mode` is "ok", "503" or "drop"; `seen` lists (method, path, key)."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.seen: list[tuple[str, str, str | None]] = []
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                replica.seen.append((self.command, self.path, self.headers.get("Idempotency-Key")))
                if replica.mode == "drop":  # read it, then die without a word
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                status = 503 if replica.mode == "503" else 200
                answer = {"error": "replica going away"} if status == 503 else {"echo": body.decode()}
                out = json.dumps(answer)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out.encode())

            do_GET = do_POST = do_PUT = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def dead_url() -> str:
    with socket.socket() as s:  # a port just freed: connections to it are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    made = [Replica(), Replica()]
    yield made
    for r in made:
        r.close()


def test_a_dead_address_is_skipped_and_the_live_one_stays_in_use(replicas: list[Replica]) -> None:
    dead, live = dead_url(), replicas[0]
    with Client(f"{dead},{live.url}", "t") as c:
        assert c.request("GET", "/v1/jobs") == {"echo": ""}
        assert c.server == live.url
        c.request("POST", "/v1/admin/pause")  # not sent anywhere before: a refused connect moves on
        assert c.server == live.url and [m for m, *_ in live.seen] == ["GET", "POST"]


def test_a_post_without_a_key_is_never_sent_twice(replicas: list[Replica]) -> None:
    dying, other = replicas
    dying.mode = "drop"
    with Client(f"{dying.url},{other.url}", "t") as c, pytest.raises(ClientError) as caught:
        c.request("POST", "/v1/jobs/j1/requeue")
    assert caught.value.is_unreachable and "dropped before its answer" in caught.value.message
    assert "look whether the POST /v1/jobs/j1/requeue was done" in caught.value.fix
    assert len(dying.seen) == 1 and other.seen == []
    # the next call goes to the other address: the dying one is no longer in use
    assert c.server == other.url


def test_a_keyed_submission_is_sent_again_with_the_same_key(replicas: list[Replica]) -> None:
    dying, other = replicas
    dying.mode = "drop"
    with Client(f"{dying.url},{other.url}", "t") as c:
        out = c.submit({"command": ["true"]})
        assert json.loads(out["echo"]) == {"command": ["true"]}
        key = dying.seen[0][2]
        assert key and other.seen == [("POST", "/v1/jobs", key)]
        c.submit({"command": ["true"]})
        assert other.seen[1][2] not in (None, key)  # a fresh key per submission


def test_503_moves_a_repeatable_request_on_but_not_a_plain_post(replicas: list[Replica]) -> None:
    going, other = replicas
    going.mode = "503"
    with Client(f"{going.url},{other.url}", "t") as c:
        assert c.request("GET", "/v1/nodes") == {"echo": ""}
        assert len(other.seen) == 1
    with Client(f"{going.url},{other.url}", "t") as c, pytest.raises(ClientError) as caught:
        c.request("POST", "/v1/admin/pause")
    assert caught.value.status == 503 and "going away" in caught.value.message
    assert len(other.seen) == 1  # the plain POST was not sent on


def test_heartbeats_are_repeatable(replicas: list[Replica]) -> None:
    dying, other = replicas
    dying.mode = "drop"
    with Client(f"{dying.url},{other.url}", "t") as c:
        c.heartbeat("n1", 3)
    assert [p for _, p, _ in other.seen] == ["/v1/agents/n1/heartbeat"]


def test_when_no_address_answers_each_is_named() -> None:
    one, two = dead_url(), dead_url()
    with Client(f"{one}, {two}", "t") as c, pytest.raises(ClientError) as caught:
        c.request("GET", "/healthz")
    message = caught.value.message
    assert message.startswith("none of the Corral servers answered")
    assert f"{one}: connection refused" in message and f"{two}: connection refused" in message
    # one address: the message of a single server, as before
    with Client(one, "t") as c, pytest.raises(ClientError) as caught:
        c.request("GET", "/healthz")
    assert caught.value.message == f"the Corral server at {one} is not reachable (connection refused)"
    assert "--server URL" in caught.value.fix


def test_addresses_are_checked() -> None:
    assert parse_servers(" http://a:1/ , https://b:2 ") == ["http://a:1", "https://b:2"]
    for bad, said in (("", "names no URL"), (",", "names no URL"), ("http://a:1,b:2", "'b:2' must start")):
        with pytest.raises(ValueError, match=said):
            parse_servers(bad)


def test_the_config_file_may_list_replicas(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.delenv("CORRAL_SERVER", raising=False)
    write_config({"server": ["http://a:8400", "http://b:8400"]})
    assert resolve_connection(None, None)[0] == "http://a:8400,http://b:8400"
    monkeypatch.setenv("CORRAL_SERVER", "http://c:8400,http://d:8400")
    assert resolve_connection(None, None)[0] == "http://c:8400,http://d:8400"
