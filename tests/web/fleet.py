"""Fake node agents for the dashboard tests: each registers its node, heartbeats, and answers
the control plane's orders over HTTP as a node agent does (a start is reported running at once,
a stop is reported exited), without launching workers."""

from __future__ import annotations

import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tests.server.harness import FakeAgent, Server


class Fleet:
    """One fake agent per node, each in a thread that long-polls its orders."""

    def __init__(self, server: Server, nodes: dict[str, int], gpu_model: str = "H100-80GB") -> None:
        self.server = server
        with ThreadPoolExecutor(len(nodes)) as pool:  # a token each: in parallel
            made = pool.map(lambda item: FakeAgent(server, item[0], item[1], gpu_model), nodes.items())
        self.agents = {agent.node: agent for agent in made}
        self.running: dict[str, tuple[int, list[str]]] = {}  # job -> (attempt, nodes)
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.simulation: subprocess.Popen[str] | None = None  # a `corral simulate` writing a report
        self.simulation_output = ""

    def start(self) -> None:
        with ThreadPoolExecutor(len(self.agents)) as pool:
            list(pool.map(FakeAgent.register, self.agents.values()))
        for agent in self.agents.values():
            thread = threading.Thread(target=self._serve, args=(agent,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(5)
        for agent in self.agents.values():
            agent.close()

    def _serve(self, agent: FakeAgent) -> None:
        beat = 0.0
        while not self.stopping.is_set():
            try:
                if time.monotonic() - beat > 4.0:
                    beat_body = {"incarnation": agent.incarnation}
                    agent.http.post(f"/v1/agents/{agent.node}/heartbeat", json=beat_body)
                    beat = time.monotonic()
                for order in agent.orders(wait=1.0):
                    self._obey(agent, order)
            except httpx.HTTPError:
                if self.stopping.wait(0.2):
                    return

    def _obey(self, agent: FakeAgent, order: dict[str, Any]) -> None:
        job, attempt = order["job"], order["attempt"]
        if order["kind"] == "start":
            agent.report(job, attempt, "running")
            with self.lock:
                seen, nodes = self.running.get(job, (attempt, []))
                self.running[job] = (attempt, [*(nodes if seen == attempt else []), agent.node])
        elif order["kind"] == "stop":
            agent.report(job, attempt, "exited", exit_code=143)
            with self.lock:
                self.running.pop(job, None)

    def finish(self, job: str, exit_code: int = 0) -> None:
        """The job's workers exit with `exit_code` on every node it runs on."""
        with self.lock:
            attempt, nodes = self.running.pop(job)
        for node in nodes:  # the first report may end the attempt: the others are then refused (409)
            status = self.agents[node].report(job, attempt, "exited", exit_code=exit_code).status_code
            assert status in (200, 409), status

    def is_running(self, job: str) -> bool:
        with self.lock:
            return job in self.running
