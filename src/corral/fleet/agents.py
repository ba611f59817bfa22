"""The fleet: thousands of node agents in one asyncio process, over the agents' real HTTP API.

Each simulated node registers (with its own agent token), heartbeats every `heartbeat` seconds
(the server's `heartbeat_interval_s`), keeps one long poll of its assignments open on its own
connection, and "runs" each start order: it reports `running` at once, then `exited` 0 after
the job's run time (a command `["sleep", "N"]` runs N / `speed` seconds, anything else
`default_run`). A stop order ends the run: the node reports `exited` 143 (SIGTERM) promptly,
or after the order's signal delay and grace when `honour_grace` is set (as the simulator
models a victim that uses its whole grace). Heartbeats and reports share a pool of keep-alive
connections; every request's latency is recorded (`stats.Recorder`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from corral.fleet.stats import Recorder
from corral.fleet.wire import Answer, Conn, Pool, WireError, auth_headers, split_url
from corral.protocol import (
    Heartbeat,
    LocalAttempt,
    Orders,
    Registered,
    Registration,
    Report,
    ReportStatus,
    StartOrder,
    StopOrder,
    TerminalOrder,
    check_version,
)

STOPPED_EXIT = 143  # 128 + SIGTERM: how a worker told to stop ends


@dataclass(frozen=True, slots=True)
class FleetOptions:
    heartbeat: float = 5.0  # seconds between heartbeats (until the server says otherwise)
    poll_wait: float = 30.0  # seconds each long poll waits for an order
    pool: int = 64  # keep-alive connections for heartbeats, reports and registrations
    speed: float = 1.0  # a job of `sleep N` runs N / speed seconds
    default_run: float = 60.0  # seconds a job runs whose command is not `sleep N`
    honour_grace: bool = False  # a stop order: exit after its signal delay and grace, not at once
    seed: int = 0  # spreads the first heartbeats and polls


@dataclass(slots=True, eq=False)
class Node:
    inventory: dict[str, Any]
    headers: bytes
    incarnation: int = 0
    after: int = 0
    jobs: dict[tuple[str, int], asyncio.TimerHandle | None] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.inventory["node"])


class Fleet:
    """`register()` every node, then `run()` until `stop()`; `recorder` holds the latencies."""

    def __init__(
        self, url: str, nodes: list[dict[str, Any]], tokens: dict[str, str], options: FleetOptions
    ) -> None:
        self.host, self.port = split_url(url)
        self.options = options
        self.nodes = [Node(inv, auth_headers(tokens[inv["node"]])) for inv in nodes]
        self.recorder = Recorder()
        self.counts: Counter[str] = Counter()  # starts, finishes, stops, polls, reregistrations
        self.pool: Pool | None = None
        self.interval = options.heartbeat
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._rng = random.Random(options.seed)

    # ---- requests ---------------------------------------------------------------------------
    async def call(
        self, kind: str, method: str, path: str, headers: bytes, body: Any = None
    ) -> Answer | None:
        """One request on a pooled connection; its latency is recorded from the moment it is sent
        (the time spent waiting for a free connection is recorded apart, as `<kind>.queued`)."""
        if self.pool is None:
            self.pool = Pool(self.host, self.port, self.options.pool)
        asked = time.perf_counter()
        conn = await self.pool.idle.get()
        sent_at, sent = time.time(), time.perf_counter()
        try:
            status, answer = await conn.request(method, path, headers, body)
        except WireError as exc:
            self.recorder.error(kind, "wire")
            self.counts[f"wire error: {str(exc)[:80]}"] += 1
            return None
        finally:
            self.pool.idle.put_nowait(conn)
        self.recorder.add(kind, sent_at, time.perf_counter() - sent)
        self.recorder.add(f"{kind}.queued", sent_at, sent - asked)
        if status >= 400:
            self.recorder.error(kind, str(status))
        return status, answer

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- joining ----------------------------------------------------------------------------
    async def register(self, concurrency: int = 32) -> None:
        """Register every node, `concurrency` at a time, in order (with 1, nodes come up in exactly
        the order of the list, as the simulator's nodes do); raises if one is refused."""
        todo = collections.deque(self.nodes)

        async def worker() -> None:
            while todo:
                await self._register(todo.popleft())

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(todo)) or 1)))

    async def _register(self, node: Node) -> None:
        running = [LocalAttempt(job=job, attempt=attempt) for job, attempt in node.jobs]
        body = Registration(**node.inventory, running=running).model_dump(mode="json")
        for _ in range(5):
            answer = await self.call(
                "register",
                "POST",
                "/v1/agents/register",
                node.headers,
                body,
            )
            if answer is not None and answer[0] == 200:
                break
            if answer is not None and answer[0] < 500:
                raise RuntimeError(f"registration of {node.name} refused: {answer[0]} {answer[1]}")
            await asyncio.sleep(1.0)
        else:
            raise RuntimeError(f"registration of {node.name} failed five times")
        out = Registered.model_validate(answer[1])
        check_version(out.protocol)
        node.incarnation = out.incarnation
        node.after = max(node.after, out.after)
        self.interval = out.heartbeat_interval_s or self.interval
        for key in out.stale_keys():
            self._forget(node, key)

    # ---- running ----------------------------------------------------------------------------
    async def run(self) -> None:
        """Heartbeat and long-poll for every node until `stop()`."""
        for i, node in enumerate(self.nodes):
            phase = self.interval * i / max(1, len(self.nodes))
            self.spawn(self._beats(node, phase))
            self.spawn(self._polls(node, self._rng.uniform(0.0, self.poll_spread)))
        await self._stopping.wait()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.pool is not None:
            self.pool.close()

    def stop(self) -> None:
        self._stopping.set()

    @property
    def poll_spread(self) -> float:
        """Seconds over which the first long polls are sent (2,000 a second at most)."""
        return max(0.5, len(self.nodes) / 2000)

    async def _beats(self, node: Node, phase: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + phase
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            late = loop.time() - due
            self.recorder.add("heartbeat.late", time.time(), late)
            path = f"/v1/agents/{node.name}/heartbeat"
            beat = Heartbeat(incarnation=node.incarnation).model_dump(exclude_none=True)
            answer = await self.call("heartbeat", "POST", path, node.headers, beat)
            if answer is not None and answer[0] == 409:  # declared lost, or registered again elsewhere
                self.counts["reregistrations"] += 1
                with contextlib.suppress(RuntimeError):
                    await self._register(node)
            due += self.interval
            if due < loop.time():  # more than a whole interval late: do not burst to catch up
                due = loop.time()

    async def _polls(self, node: Node, delay: float) -> None:
        await asyncio.sleep(delay)
        conn = Conn(self.host, self.port, timeout=self.options.poll_wait + 60.0)
        wait = self.options.poll_wait
        try:
            while True:
                path = f"/v1/agents/{node.name}/assignments?after={node.after}&wait={wait:g}"
                try:
                    status, body = await conn.request("GET", path, node.headers)
                except WireError:
                    self.recorder.error("poll", "wire")
                    await asyncio.sleep(1.0)
                    continue
                self.counts["polls"] += 1
                if status != 200:
                    self.recorder.error("poll", str(status))
                    await asyncio.sleep(1.0)
                    continue
                orders = Orders.model_validate(body).orders
                if orders:
                    node.after = max(node.after, orders[-1].seq)
                    self._handle(node, orders)
        finally:
            conn.close()

    def _handle(self, node: Node, orders: list[StartOrder | StopOrder | TerminalOrder]) -> None:
        loop = asyncio.get_running_loop()
        for order in orders:
            key = (order.job, order.attempt)
            if isinstance(order, TerminalOrder):  # no processes here: no shell to open
                continue
            if isinstance(order, StartOrder):
                if key in node.jobs:
                    continue
                self.counts["starts"] += 1
                running = self.spawn(self._report(node, key, "running"))
                node.jobs[key] = loop.call_later(self._run_time(order), self._exit, node, key, 0, running)
            elif key in node.jobs:
                timer = node.jobs[key]
                if timer is None:  # already told to stop
                    continue
                timer.cancel()
                node.jobs[key] = None
                self.counts["stops"] += 1
                delay = 0.0
                if self.options.honour_grace:
                    delay = (order.signal_in or 0.0) + order.grace
                loop.call_later(delay, self._exit, node, key, STOPPED_EXIT, None)

    def _run_time(self, order: StartOrder) -> float:
        command = order.spec.get("command") or []
        if len(command) == 2 and command[0] == "sleep":
            with contextlib.suppress(ValueError):
                return max(0.0, float(command[1]) / self.options.speed)
        return self.options.default_run

    def _exit(self, node: Node, key: tuple[str, int], code: int, running: asyncio.Task[Any] | None) -> None:
        if key in node.jobs:
            node.jobs[key] = None  # exiting: a stop order now changes nothing

        async def report() -> None:
            if running is not None:
                await running  # `running` is sent before `exited`
            await self._report(node, key, "exited", code)
            self._forget(node, key)

        self.counts["finishes" if code == 0 else "stopped exits"] += 1
        self.spawn(report())

    def _forget(self, node: Node, key: tuple[str, int]) -> None:
        timer = node.jobs.pop(key, None)
        if timer is not None:
            timer.cancel()

    async def _report(self, node: Node, key: tuple[str, int], status: str, code: int | None = None) -> None:
        report = Report(
            incarnation=node.incarnation,
            job=key[0],
            attempt=key[1],
            status=ReportStatus(status),
            exit_code=code if status == "exited" else None,
        )
        body = report.body()
        for _ in range(10):
            answer = await self.call(
                f"report.{status}", "POST", f"/v1/agents/{node.name}/reports", node.headers, body
            )
            if answer is not None and answer[0] < 500:
                return  # 200, or 404/409 for an attempt that has ended: nothing more to say
            await asyncio.sleep(1.0)

    def summary(self) -> dict[str, Any]:
        return {
            "nodes": len(self.nodes),
            "counts": dict(self.counts),
            "connections_opened": (self.pool.opened if self.pool else 0),
            "heartbeat_interval_s": self.interval,
        }


async def create_tokens(
    url: str, admin_token: str, names: list[str], concurrency: int = 32
) -> dict[str, str]:
    """One agent token per node, bound to it (`POST /v1/tokens`), as an operator would make them."""
    host, port = split_url(url)
    pool = Pool(host, port, concurrency)
    headers = auth_headers(admin_token)
    out: dict[str, str] = {}
    todo = list(names)

    async def worker() -> None:
        while todo:
            name = todo.pop()
            body = {"name": f"agent-{name}", "role": "agent", "node": name}
            status, answer = await pool.request("POST", "/v1/tokens", headers, body)
            if status != 201:
                raise RuntimeError(f"token for {name}: {status} {answer}")
            out[name] = str(answer["token"])

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        pool.close()
    return out
