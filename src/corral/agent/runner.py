"""The agent's loop: register, heartbeat, long-poll orders, run and supervise attempts.

Workers are process groups (`start_new_session=True`, then `os.killpg`); a grandchild that calls
`setsid` escapes them (cgroups are not used yet). Each attempt has a supervisor thread that sends
exactly one `exited` report for this node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.agent.launch import Worker, hostfile_lines, workers
from corral.client import Client, ClientError

log = logging.getLogger("corral.agent")

KILL_AFTER = 5.0  # SIGTERM, then SIGKILL after this long, for the survivors of a failed rank
POLL_WAIT = 30.0
TICK = 0.05


def exit_code_of(returncode: int) -> int:
    """A Popen return code as a shell shows it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_number(value: object) -> int:
    if isinstance(value, int):
        return value
    name = str(value or "SIGTERM").upper()
    if name.isdigit():
        return int(name)
    if not name.startswith("SIG"):
        name = "SIG" + name
    return int(getattr(signal, name, signal.SIGTERM))


@dataclass
class Stop:
    signal_at: float  # monotonic
    grace: float
    why: str


class Attempt:
    """One attempt's local workers and the thread that watches them."""

    def __init__(self, agent: Agent, order: dict[str, Any]) -> None:
        self.agent = agent
        self.order = order
        self.job = str(order["job"])
        self.number = int(order["attempt"])
        spec = order["spec"]
        checkpoint = spec.get("checkpoint") or {}
        self.signal = signal_number(checkpoint.get("signal"))
        self.grace = float(checkpoint.get("grace") or 30.0)
        limit = spec.get("time_limit")
        self.time_limit = float(limit) if limit else None
        self.procs: list[tuple[int, subprocess.Popen[bytes]]] = []
        self._stop: Stop | None = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(
            target=self._run, name=f"attempt-{self.job}-{self.number}", daemon=True
        )

    def request_stop(self, grace: float, signal_in: float, why: str) -> None:
        with self._lock:
            stop = Stop(time.monotonic() + signal_in, grace, why)
            if self._stop is None or stop.signal_at + stop.grace < self._stop.signal_at + self._stop.grace:
                self._stop = stop

    # ---- launching ------------------------------------------------------------------------
    def _launch(self) -> tuple[int, int | None] | None:
        """Start every local worker; None when all started, else (127, the rank that did not)."""
        agent = self.agent
        root = agent.checkpoint_root / self.job
        (root / f"attempt-{self.number}").mkdir(parents=True, exist_ok=True)
        logs = agent.data_dir / "logs" / self.job / f"attempt-{self.number}"
        logs.mkdir(parents=True, exist_ok=True)
        hostfile = agent.data_dir / "run" / self.job / f"attempt-{self.number}" / "hostfile"
        hostfile.parent.mkdir(parents=True, exist_ok=True)
        hostfile.write_text("".join(line + "\n" for line in hostfile_lines(self.order)))
        todo: list[Worker] = workers(self.order, agent.node, root, hostfile)
        for w in todo:
            try:
                with open(logs / f"rank-{w.rank}.log", "ab") as out:
                    proc = subprocess.Popen(
                        w.argv,
                        env={**os.environ, **w.env},
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        cwd=str(agent.data_dir),
                    )
            except OSError as exc:
                log.warning(
                    "job %s attempt %s rank %s did not launch: %s", self.job, self.number, w.rank, exc
                )
                with contextlib.suppress(OSError), open(logs / f"rank-{w.rank}.log", "a") as out_text:
                    out_text.write(f"corral agent: could not launch {w.argv!r}: {exc}\n")
                self._kill_all(signal.SIGKILL)
                for _, p in self.procs:
                    p.wait()
                return 127, w.rank
            self.procs.append((w.rank, proc))
        return None

    # ---- supervising ----------------------------------------------------------------------
    def _signal(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)

    def _kill_all(self, sig: int) -> None:
        for _, p in self.procs:
            self._signal(p, sig)

    def _wait_all(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for _, p in self.procs):
            if time.monotonic() >= deadline:
                return False
            time.sleep(TICK)
        return True

    def _finish_stop(self, stop: Stop) -> tuple[int, int | None]:
        self._kill_all(self.signal)
        if not self._wait_all(stop.grace):
            self._kill_all(signal.SIGKILL)
            self._wait_all(KILL_AFTER)
        by_rank = dict(self.procs)
        first = by_rank.get(min(by_rank)) if by_rank else None
        code = exit_code_of(first.returncode) if first is not None and first.returncode is not None else 137
        return code, (min(by_rank) if by_rank else None)

    def _run(self) -> None:
        try:
            code, rank = self._supervise()
        except Exception:  # the report must still go out
            log.exception("supervising job %s attempt %s", self.job, self.number)
            self._kill_all(signal.SIGKILL)
            code, rank = 1, None
        self.agent.report(self.job, self.number, "exited", code, rank)
        self.agent.forget(self)

    def _supervise(self) -> tuple[int, int | None]:
        started = time.monotonic()
        failed = self._launch()
        if failed is not None:
            return failed
        self.agent.report(self.job, self.number, "running")
        while True:
            with self._lock:
                stop = self._stop
            now = time.monotonic()
            if stop is None and self.time_limit is not None and now - started >= self.time_limit:
                log.info("job %s attempt %s reached its time limit", self.job, self.number)
                stop = Stop(now, self.grace, "time_limit")
            if stop is not None and now >= stop.signal_at:
                return self._finish_stop(stop)
            for rank, proc in self.procs:
                code = proc.poll()
                if code is not None and code != 0:
                    self._kill_all(signal.SIGTERM)
                    if not self._wait_all(KILL_AFTER):
                        self._kill_all(signal.SIGKILL)
                        self._wait_all(KILL_AFTER)
                    return exit_code_of(code), rank
            if all(p.poll() == 0 for _, p in self.procs):
                return 0, None
            time.sleep(TICK)


class Agent:
    """One node's agent; `run()` until `shutdown()` (which also kills what it runs)."""

    def __init__(
        self,
        server: str,
        token: str,
        inventory: dict[str, Any],
        data_dir: Path,
        checkpoint_root: Path | None = None,
        poll_wait: float = POLL_WAIT,
    ) -> None:
        self.server = server
        self.poll_wait = poll_wait
        self.inventory = inventory
        self.node = str(inventory["node"])
        self.data_dir = data_dir
        self.checkpoint_root = checkpoint_root or data_dir / "checkpoints"
        self.api = Client(server, token)
        self.poller = Client(server, token)
        self.incarnation = 0
        self.interval = 5.0
        self.after = 0
        self.attempts: dict[tuple[str, int], Attempt] = {}
        self.done: set[tuple[str, int]] = set()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._register_lock = threading.Lock()

    # ---- the control plane ----------------------------------------------------------------
    def register(self) -> dict[str, Any]:
        with self._register_lock:
            out = self.api.register_agent(self.inventory)
            self.incarnation = int(out["incarnation"])
            self.interval = float(out.get("heartbeat_interval_s", 5.0))
            log.info("node %s registered, incarnation %s", self.node, self.incarnation)
            return dict(out)

    def _heartbeats(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self.api.heartbeat(self.node, self.incarnation)
            except ClientError as err:
                if err.status in (404, 409):
                    with contextlib.suppress(ClientError):
                        self.register()
                elif not err.is_unreachable:
                    log.warning("heartbeat: %s", err.message)

    def report(
        self, job: str, attempt: int, status: str, exit_code: int | None = None, rank: int | None = None
    ) -> None:
        body = {
            "job": job,
            "attempt": attempt,
            "status": status,
            "exit_code": exit_code,
            "rank": rank,
        }
        for _ in range(20):
            try:
                self.api.request(
                    "POST", f"/v1/agents/{self.node}/reports", body={"incarnation": self.incarnation, **body}
                )
                return
            except ClientError as err:
                if err.status == 409 and "incarnation" in err.message:
                    with contextlib.suppress(ClientError):
                        self.register()
                    continue
                if err.status in (404, 409):  # the attempt has ended or is unknown: nothing to run
                    if status == "running":
                        attempt_run = self.attempts.get((job, attempt))
                        if attempt_run is not None:
                            attempt_run.request_stop(0.0, 0.0, "ended")
                    return
                if not err.is_unreachable:
                    log.warning("report %s of %s/%s: %s", status, job, attempt, err.message)
                    return
            if self.stopping.wait(1.0):
                return

    # ---- orders ---------------------------------------------------------------------------
    def handle(self, orders: list[dict[str, Any]]) -> None:
        stops = {(str(o["job"]), int(o["attempt"])) for o in orders if o.get("kind") == "stop"}
        latest: dict[str, int] = {}
        for o in orders:
            if o.get("kind") == "start":
                latest[str(o["job"])] = max(latest.get(str(o["job"]), 0), int(o["attempt"]))
        for o in orders:
            key = (str(o["job"]), int(o["attempt"]))
            if o.get("kind") == "start":
                # a start already stopped, or superseded, in the same batch (a replay) is not run
                if key in stops or key[1] < latest[key[0]]:
                    self.done.add(key)
                    continue
                with self._lock:
                    if key in self.attempts or key in self.done:
                        continue
                    run = Attempt(self, o)
                    self.attempts[key] = run
                log.info("job %s attempt %s: starting", *key)
                run.thread.start()
            elif o.get("kind") == "stop":
                with self._lock:
                    run_or_none = self.attempts.get(key)
                if run_or_none is not None:
                    log.info("job %s attempt %s: stop (%s)", key[0], key[1], o.get("why", ""))
                    run_or_none.request_stop(
                        float(o.get("grace") or 0.0), float(o.get("signal_in") or 0.0), str(o.get("why", ""))
                    )
                else:
                    self.done.add(key)

    def forget(self, run: Attempt) -> None:
        with self._lock:
            self.attempts.pop((run.job, run.number), None)
            self.done.add((run.job, run.number))

    def run(self, on_registered: Any = None) -> None:
        """Register, then heartbeat and follow orders until `shutdown()`."""
        while True:
            try:
                joined = self.register()
                break
            except ClientError as err:
                if not err.is_unreachable or self.stopping.wait(1.0):
                    raise
        if on_registered is not None:
            on_registered(joined)
        beat = threading.Thread(target=self._heartbeats, name="corral-agent-heartbeat", daemon=True)
        beat.start()
        while not self.stopping.is_set():
            try:
                out = self.poller.request(
                    "GET",
                    f"/v1/agents/{self.node}/assignments",
                    params={"after": self.after, "wait": self.poll_wait},
                    wait=self.poll_wait,
                )
            except ClientError as err:
                if err.status in (401, 403):
                    raise
                if not err.is_unreachable:
                    log.warning("assignments: %s", err.message)
                self.stopping.wait(1.0)
                continue
            orders = out.get("orders") or []
            if orders:
                self.after = int(orders[-1]["seq"])
                self.handle(orders)

    def shutdown(self, kill: bool = True) -> None:
        self.stopping.set()
        if kill:
            with self._lock:
                runs = list(self.attempts.values())
            for run in runs:
                run._kill_all(signal.SIGKILL)
