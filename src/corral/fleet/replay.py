"""Submitting a trace to a live control plane on its own clock, and reading its event log back.

`submit_paced` posts each job at `t0 + offset` (wall clock) over one keep-alive connection, as
users would, and records each submission's latency; `fetch_events` pages through
`GET /v1/events` (DESIGN.md 4.6). The fleet (`corral.fleet.agents`) plays the nodes meanwhile.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.fleet.wire import split_url

Submission = tuple[float, str, dict[str, Any]]  # (seconds after t0, the trace's job id, the job spec)


@dataclass(slots=True)
class Submitted:
    ids: dict[str, str] = field(default_factory=dict)  # trace job id -> the server's job id
    refused: dict[str, str] = field(default_factory=dict)  # trace job id -> the server's answer
    sent: list[float] = field(default_factory=list)  # wall time each submission was sent
    took: list[float] = field(default_factory=list)  # its round trip, seconds
    late: list[float] = field(default_factory=list)  # how far behind its offset it was sent


class Http:
    """A keep-alive `http.client` connection with one token; reconnects once on a dropped one."""

    def __init__(self, url: str, token: str, timeout: float = 60.0) -> None:
        self.host, self.port = split_url(url)
        self.timeout = timeout
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body) if body is not None else None
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.conn.request(method, path, data, self.headers)
                response = self.conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == 2:
                    raise
                continue
            return response.status, json.loads(raw) if raw else None
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None


def submit_paced(
    url: str, token: str, jobs: Sequence[Submission], t0: float, stop_at: float | None = None
) -> Submitted:
    """Submit each job at `t0 + offset` by the wall clock (at once when already late), in order;
    none after the wall time `stop_at` (a server that cannot keep up does not hold a benchmark)."""
    out = Submitted()
    client = Http(url, token)
    try:
        for offset, key, spec in jobs:
            if stop_at is not None and time.time() >= stop_at:
                break
            due = t0 + offset
            pause = due - time.time()
            if pause > 0:
                time.sleep(pause)
            sent = time.time()
            began = time.perf_counter()
            status, body = client.call("POST", "/v1/jobs", spec)
            out.took.append(time.perf_counter() - began)
            out.sent.append(sent)
            out.late.append(max(0.0, sent - due))
            if status == 201:
                out.ids[key] = str(body["id"])
            else:
                out.refused[key] = f"{status} {body}"
    finally:
        client.close()
    return out


class EventTail:
    """The event log read incrementally: `poll()` appends what was committed since the last call."""

    def __init__(self, url: str, token: str, page: int = 10_000) -> None:
        self.client = Http(url, token)
        self.page = page
        self.events: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        new: list[dict[str, Any]] = []
        while True:
            after = self.events[-1]["seq"] if self.events else 0
            status, body = self.client.call("GET", f"/v1/events?after={after}&limit={self.page}")
            if status != 200:
                raise RuntimeError(f"GET /v1/events: {status} {body}")
            self.events.extend(body)
            new.extend(body)
            if len(body) < self.page:
                return new

    def close(self) -> None:
        self.client.close()


def fetch_events(url: str, token: str) -> list[dict[str, Any]]:
    """The whole event log, oldest first."""
    tail = EventTail(url, token)
    try:
        tail.poll()
        return tail.events
    finally:
        tail.close()
