"""The scenario suite through the control plane: stored and API-driven, on SQLite and PostgreSQL.

Every `*.yaml` scenario that test_scenarios.py runs through the core runs here as well, on a
fresh database: the scenario's cluster (and policy) is applied as a configuration revision,
every node registers through the agents' API, the API (`create_app`) runs in process behind
httpx's ASGITransport, and a `Scheduler` is stepped by hand (`step(force=True)`) on a virtual
clock set to each step's `at`. Steps translate as follows:
- `submit`: `POST /v1/jobs` (scenario ids map to server ids; a 422 is the control plane's
  rejection of a job that can never run);
- `running`: the job is submitted, then its attempt written the way the scheduler writes one
  (job row, attempt, allocations, `start` event) and the scheduler reloaded, as after a restart;
- `end`: the agent reports that the workers exited 0; `stop`: the agent reports that a victim
  told to stop has exited (the scheduler turns it into `preempt` and requeues the job).
Expectations are read from what was stored: the step's `start`, `preempting` and ending events
in the journal, the agents' orders from the outbox, and the job objects of `GET /v1/jobs/{id}`
(state, placement, reason, reason code). Reservations are not stored: `reserve` is checked
through the job's reason (code `reserved`, text `reserved to start at t=...`, time `reason_at`). Beyond the
expectations, each step also runs through the core beside it (test_scenarios.Scenario), and
the stored decisions must be the core's: the same GPUs started, the same victims, the same
rejections, the same pending jobs with the same reason codes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, insert, select, update

from corral.config.cluster_file import parse_cluster_config
from corral.core.decisions import CycleResult
from corral.core.model import NodeSpec
from corral.server.app import create_app
from corral.server.auth import create_token
from corral.server.cluster import apply_revision
from corral.server.context import Context
from corral.server.scheduler import Scheduler
from corral.store import schema
from corral.store.engine import append_events, dumps, make_engines, upgrade
from tests.helpers import check_no_double_allocation
from tests.scenarios.test_scenarios import SCENARIOS, Scenario, load

STOPPED_EXIT = 143  # how a worker ends on the checkpoint signal (128 + SIGTERM)
LIVE = ("starting", "running", "stopping")


class Clock:
    """The virtual time of the API and the scheduler: the current step's `at`."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Api:
    """The API in process: httpx over ASGITransport, driven from the test's thread on one event loop."""

    def __init__(self, ctx: Context, token: str) -> None:
        self.ctx = ctx
        self.runner = asyncio.Runner()
        ctx.notifier.bind(self.runner.get_loop())  # what the app's lifespan does
        ctx.start()
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(ctx)),
            base_url="http://corral",
            headers={"Authorization": f"Bearer {token}"},
        )

    def get(self, url: str, **kw: Any) -> httpx.Response:
        return self.runner.run(self.client.get(url, **kw))

    def post(self, url: str, **kw: Any) -> httpx.Response:
        return self.runner.run(self.client.post(url, **kw))

    def close(self) -> None:
        self.runner.run(self.client.aclose())
        self.runner.close()
        self.ctx.close()
        self.ctx.scheduler_bell.close()


Order = dict[str, Any]


class Stored:
    """A step's journal entries, with scenario ids: who started where, who was told to stop for whom."""

    def __init__(self, events: list[dict[str, Any]], names: dict[str, str]) -> None:
        self.events = events
        self.kinds = {(e["event"], names.get(e.get("job") or "", "")) for e in events}
        self.started = {names[e["job"]]: e["placement"] for e in events if e["event"] == "start"}
        self.preempted = {names[e["job"]]: names[e["by"]] for e in events if e["event"] == "preempting"}


class ServerScenario:
    """One scenario on one database: the API in process, the scheduler stepped by hand."""

    def __init__(self, path: Path, url: str) -> None:
        self.name = path.name
        self.where = path.name
        self.doc: dict[str, Any] = load(path)
        self.cluster = parse_cluster_config(self.doc["cluster"], source=path.name)
        self.clock = Clock()
        self.ids: dict[str, str] = {}  # scenario id -> server id
        self.names: dict[str, str] = {}  # server id -> scenario id
        self.refused: dict[str, str] = {}  # scenario id -> the error of its refused submission
        self.core = Scenario(path)  # the same steps through the core, to compare decisions
        self.agents: dict[str, dict[str, str]] = {}  # node -> its agent's headers
        self.incarnations: dict[str, int] = {}
        self.after: dict[str, int] = {}  # node -> last outbox order seen
        self.url = url
        self.opened: list[Callable[[], None]] = []  # what close() releases, newest first

    def start(self) -> None:
        """Schema, configuration revision, admin token; the API; the agents; the scheduler."""
        api = make_engines(self.url)
        self.opened.append(api.dispose)
        upgrade(api)
        body = self.doc["cluster"] | {k: self.doc[k] for k in ("policy", "policy_args") if k in self.doc}
        with api.writer.begin() as conn:
            apply_revision(conn, body, "scenario", self.name, now=0.0)
            _, token = create_token(conn, "scenario", "admin")
        self.http = Api(Context(api, clock=self.clock), token)
        self.opened.append(self.http.close)
        for node in self.cluster.nodes:
            self.register(node)
        self.engines = make_engines(self.url)  # the scheduler's own, as in its own process
        self.opened.append(self.engines.dispose)
        self.scheduler = Scheduler(self.engines, clock=self.clock)  # the policy: from the revision
        self.scheduler.reason_flush = 0.0  # every step's reasons are checked: write them at once
        self.opened += [self.scheduler.doorbell.close, self.scheduler.api_bell.close]
        self.opened.append(self.scheduler.reason_writer.close)  # its thread, before the bells
        self.scheduler.reload()

    def close(self) -> None:
        while self.opened:
            self.opened.pop()()

    # ---- the agents ------------------------------------------------------------------------
    def register(self, node: NodeSpec) -> None:
        r = self.http.post(
            "/v1/tokens", json={"name": f"agent-{node.name}", "role": "agent", "node": node.name}
        )
        assert r.status_code == 201, r.text
        self.agents[node.name] = {"Authorization": f"Bearer {r.json()['token']}"}
        inventory = {
            "node": node.name, "gpus": node.gpus, "gpu_model": node.gpu_model,
            "gpu_memory_gib": node.gpu_memory_gib, "cpus": node.cpus, "memory_gib": node.memory_gib,
            "labels": dict(node.labels), "nvlink": [list(g) for g in node.nvlink], "address": "127.0.0.1",
        }  # fmt: skip
        r = self.http.post("/v1/agents/register", json=inventory, headers=self.agents[node.name])
        assert r.status_code == 200 and r.json()["state"] == "up", r.text
        self.incarnations[node.name] = r.json()["incarnation"]
        self.after[node.name] = 0

    def report(self, node: str, job: str, attempt: int, status: str, exit_code: int | None = None) -> None:
        body = {"incarnation": self.incarnations[node], "job": job, "attempt": attempt, "status": status,
                "exit_code": exit_code}  # fmt: skip
        r = self.http.post(f"/v1/agents/{node}/reports", json=body, headers=self.agents[node])
        assert r.status_code == 200, f"{self.where}: report {status} of {job}: {r.text}"

    def exited(self, sid: str, exit_code: int, *, told_to_stop: bool) -> None:
        job = self.job(sid)
        want = ("stopping",) if told_to_stop else LIVE
        assert job["state"] in want, f"{self.where}: {sid} is {job['state']}, expected {' or '.join(want)}"
        self.report(job["placement"][0]["node"], job["id"], job["attempt"], "exited", exit_code)

    def poll_orders(self) -> list[tuple[str, Order]]:
        """Every node's new orders; start orders are answered with a `running` report."""
        orders = []
        for node, headers in self.agents.items():
            r = self.http.get(
                f"/v1/agents/{node}/assignments", params={"after": self.after[node]}, headers=headers
            )
            assert r.status_code == 200, r.text
            for order in r.json()["orders"]:
                self.after[node] = order["seq"]
                orders.append((node, order))
                if order["kind"] == "start":
                    self.report(node, order["job"], order["attempt"], "running")
        return orders

    # ---- users -----------------------------------------------------------------------------
    def submit(self, entry: dict[str, Any]) -> None:
        spec = dict(entry)
        sid = spec.pop("id")
        spec.setdefault("command", ["true"])
        r = self.http.post("/v1/jobs", json=spec)
        if r.status_code == 422:
            self.refused[sid] = r.json()["error"]
            return
        assert r.status_code == 201, f"{self.where}: submit {sid}: {r.text}"
        self.ids[sid] = r.json()["id"]
        self.names[r.json()["id"]] = sid

    def job(self, sid: str) -> dict[str, Any]:
        assert sid in self.ids, f"{self.where}: {sid} was refused: {self.refused.get(sid)}"
        r = self.http.get(f"/v1/jobs/{self.ids[sid]}")
        assert r.status_code == 200, r.text
        job: dict[str, Any] = r.json()
        return job

    # ---- attempts placed before the scenario's cycle ---------------------------------------
    def occupy(self, entry: dict[str, Any]) -> None:
        """Submit the job, then write its attempt on exactly the given node and GPUs."""
        gpus = list(entry["gpus"])
        skip = ("node", "gpus", "started")
        self.submit({k: v for k, v in entry.items() if k not in skip} | {"gpus_per_replica": len(gpus)})
        job_id = self.ids[entry["id"]]
        started = float(entry.get("started", self.clock.now))
        placement = [{"node": entry["node"], "gpus": gpus}]
        j = schema.jobs
        with self.engines.writer.begin() as conn:
            changed = conn.execute(
                update(j)
                .where(j.c.id == job_id, j.c.state == "pending")
                .values(state="running", attempt=1, start_time=started, version=j.c.version + 1)
            ).rowcount
            assert changed == 1
            conn.execute(
                insert(schema.attempts).values(
                    job_id=job_id, attempt=1, state="running", placement=dumps(placement), started_at=started
                )
            )
            conn.execute(
                insert(schema.allocations),
                [{"job_id": job_id, "attempt": 1, "node": entry["node"], "gpu": g, "live": 1} for g in gpus],
            )
            conn.execute(
                insert(schema.attempt_nodes).values(job_id=job_id, attempt=1, node=entry["node"], master=True)
            )
            start = {
                "event": "start",
                "t": self.clock.now,
                "job": job_id,
                "attempt": 1,
                "placement": placement,
            }
            append_events(conn, [start], self.engines.is_sqlite)

    def last_seq(self) -> int:
        with self.engines.reader.connect() as conn:
            return int(conn.execute(select(func.max(schema.events.c.seq))).scalar() or 0)

    def events_after(self, seq: int) -> list[dict[str, Any]]:
        e = schema.events
        with self.engines.reader.connect() as conn:
            rows = conn.execute(select(e.c.body).where(e.c.seq > seq).order_by(e.c.seq)).all()
        return [json.loads(r.body) for r in rows]

    # ---- one step --------------------------------------------------------------------------
    def step(self, i: int, step: dict[str, Any]) -> None:
        self.where = f"{self.name} step {i} (server)"
        self.clock.now = float(step.get("at", 0.0))
        for entry in step.get("running", []):
            self.occupy(entry)
        if step.get("running"):
            self.scheduler.reload()
        first = self.last_seq()
        for sid in step.get("end", []):
            self.exited(sid, 0, told_to_stop=False)
        for sid in step.get("stop", []):
            self.exited(sid, STOPPED_EXIT, told_to_stop=True)
        for entry in step.get("submit", []):
            self.submit(entry)
        self.scheduler.step(force=True)
        assert self.scheduler.reason_writer.flush(), f"{self.where}: reasons not written"
        assert self.scheduler.state is not None
        check_no_double_allocation(self.scheduler.state)
        orders = self.poll_orders()
        stored = Stored(self.events_after(first), self.names)
        self.check_stored(step, stored, orders)
        self.check_expectations(step.get("expect", {}), stored)
        refused = {e["id"] for e in step.get("submit", []) if e["id"] in self.refused}
        self.check_same_as_core(self.core.step(step), stored, refused)

    def check_stored(self, step: dict[str, Any], stored: Stored, orders: list[tuple[str, Order]]) -> None:
        """Events at the virtual time, endings journalled, and every node told of its starts and stops."""
        where = self.where
        for e in stored.events:
            assert e["t"] == self.clock.now, f"{where}: event at t={e['t']}, not the virtual {self.clock.now}"
        for kind, sids in (("finish", step.get("end", [])), ("preempt", step.get("stop", []))):
            for sid in sids:
                assert (kind, sid) in stored.kinds, f"{where}: no {kind} of {sid}: {stored.events}"
        told = {(o["kind"], self.names[o["job"]], node) for node, o in orders}
        for kind, sids in (("start", stored.started), ("stop", stored.preempted)):
            for sid in sids:
                job = self.job(sid)
                nodes = {r["node"] for r in job["placement"]}
                assert {n for k, j, n in told if (k, j) == (kind, sid)} == nodes, f"{where}: orders {told}"
                assert job["state"] == ("running" if kind == "start" else "stopping"), f"{where}: {job}"
        for sid, placement in stored.started.items():
            assert self.job(sid)["placement"] == placement, f"{where}: {sid}: {self.job(sid)}"

    def check_expectations(self, expect: dict[str, Any], stored: Stored) -> None:
        where, started, preempted = self.where, stored.started, stored.preempted
        for sid, want in expect.get("start", {}).items():
            assert sid in started, f"{where}: {sid} did not start: {self.reason(sid)}"
            nodes = list(dict.fromkeys(r["node"] for r in started[sid]))
            assert want == "any" or sorted(nodes) == sorted(want), f"{where}: {sid} placed on {nodes}"
        for sid in expect.get("no_start", []):
            assert sid not in started, f"{where}: {sid} started on {started.get(sid)}"
        for sid, text in expect.get("wait", {}).items():
            assert text in self.job(sid)["reason"], f"{where}: {sid}: {self.reason(sid)}"
        for sid, code in expect.get("code", {}).items():
            assert self.job(sid)["reason_code"] == code, f"{where}: {sid}: {self.reason(sid)}"
        for victim, by in expect.get("preempt", {}).items():
            assert preempted.get(victim) == by, f"{where}: preemptions were {preempted}"
        for sid in expect.get("not_preempted", []):
            assert sid not in preempted, f"{where}: {sid} was preempted by {preempted[sid]}"
        assert not (expect.get("no_preempt") and preempted), f"{where}: unexpected preemptions {preempted}"
        for sid, at in expect.get("reserve", {}).items():  # not stored: the reason says it
            job, text = self.job(sid), f"reserved to start at t={at:.0f}s"
            assert job["reason_code"] == "reserved" and text in job["reason"], f"{where}: {self.reason(sid)}"
            assert job["reason_at"] == at, f"{where}: {self.reason(sid)}"
        for sid, text in expect.get("reject", {}).items():
            if sid in self.refused:
                assert text in self.refused[sid], f"{where}: {sid} refused with {self.refused[sid]!r}"
            else:
                job = self.job(sid)
                assert job["state"] == "rejected" and text in job["reason"], f"{where}: {sid}: {job}"

    def check_same_as_core(self, result: CycleResult, stored: Stored, refused: set[str]) -> None:
        """The stored decisions are the core's: same GPUs started, victims, rejections and reason codes."""
        where = f"{self.where} vs the core"
        starts = {sid: [(r["node"], sorted(r["gpus"])) for r in p] for sid, p in stored.started.items()}
        core_starts = {s.job: [(r.node, sorted(r.gpus)) for r in s.placement] for s in result.starts}
        assert starts == core_starts, f"{where}: started {starts}, the core {core_starts}"
        core_preempted = {p.job: p.by for p in result.preemptions}
        assert stored.preempted == core_preempted, f"{where}: {stored.preempted}, the core {core_preempted}"
        rejected = refused | {sid for kind, sid in stored.kinds if kind == "reject"}
        core_rejected = {r.job for r in result.rejections}
        assert rejected == core_rejected, f"{where}: rejected {rejected}, the core {core_rejected}"
        r = self.http.get("/v1/jobs", params={"state": "pending"})
        codes = {self.names[j["id"]]: j["reason_code"] for j in r.json()["jobs"]}
        core_codes = {}
        for job_id in self.core.state.jobs:
            reason = result.reason_of(job_id)
            core_codes[job_id] = reason.code.value if reason is not None else ""
        assert codes == core_codes, f"{where}: pending {codes}, the core {core_codes}"

    def reason(self, sid: str) -> str:
        if sid in self.refused:
            return f"refused at submission: {self.refused[sid]}"
        job = self.job(sid)
        return f"{job['state']}, {job['reason_code']}: {job['reason']}"


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_through_the_control_plane(path: Path, database_url: str) -> None:
    scenario = ServerScenario(path, database_url)
    try:
        scenario.start()
        for i, step in enumerate(scenario.doc["steps"], 1):
            scenario.step(i, step)
    finally:
        scenario.close()
