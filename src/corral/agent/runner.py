"""The agent's loop: register, heartbeat, long-poll orders, run and supervise attempts
(`attempt.py`, `ranks.py`).

Each worker is its own session (process group) inside the attempt's cgroup where the machine
allows (`corral.agent.sandbox`): signals go to every worker's group at once, kills go to the
cgroup, so a grandchild that calls `setsid` does not escape. Each attempt has a supervisor
thread that sends exactly one `exited` report for this node, with why it ended when the agent
knows (time limit, set-up failure, launch failure) and the tail of the failing rank's log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

from corral.agent import fence, files, records
from corral.agent.attempt import Attempt
from corral.agent.health import Health
from corral.agent.logserver import LogServer
from corral.agent.ranks import (
    HEARTBEAT_RETRY,
    HEARTBEAT_RETRY_MAX,
    HEARTBEAT_TIMEOUT,
    KILL_AFTER,
    POLL_WAIT,
    TICK,
    exit_code_of,
    signal_number,
)
from corral.agent.sandbox import (
    Capabilities,
    Group,
    closed_data_dir,
    remove_empty_groups,
)
from corral.agent.terminal import open_session
from corral.client import Client, ClientError
from corral.protocol import (
    HeartbeatAnswer,
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

__all__ = ["Agent", "Attempt", "exit_code_of", "retry_delay", "signal_number"]

log = logging.getLogger("corral.agent")


def retry_delay(failures: int, interval: float, draw: float) -> float:
    """Seconds before the next heartbeat after `failures` + 1 failed ones in a row: 0.2 s doubling
    to 2 s (at most the interval), times a jitter from `draw` in [0, 1) of 0.5 to 1.5, so that a
    restarted control plane is not met by every agent at once."""
    base = min(HEARTBEAT_RETRY * 2.0 ** min(failures, 16), HEARTBEAT_RETRY_MAX, interval)
    return float(base * (0.5 + draw))


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
        *,
        default_user: str | None = None,
        allow_root: bool = False,
        pass_env: tuple[str, ...] = (),
        logs_port: int = 0,
        nvml: Any = None,
        fail_gpus: dict[str, str] | None = None,
    ) -> None:
        self.server = server
        self.token = token  # the node's: its terminal sessions' WebSockets (`agent/terminal.py`)
        self.poll_wait = poll_wait
        self.inventory = inventory
        self.node = str(inventory["node"])
        self.data_dir = data_dir
        self.checkpoint_root = checkpoint_root or data_dir / "checkpoints"
        self.pass_env = pass_env  # names of the agent's environment that workers also get
        files.private_dir(data_dir, files.PASS_THROUGH, exact=True)  # jobs pass to their logs
        self.nvml = nvml  # corral.agent.nvml.Nvml when the GPUs came from NVML: samples at heartbeats
        self.health = Health(data_dir, int(inventory.get("gpus") or 0), fail_gpus or {}, nvml)
        self.caps = Capabilities.detect(self.node, default_user, data_dir, allow_root)
        for note in [*self.caps.notes, *closed_data_dir(self.caps, data_dir)]:
            log.warning("%s", note)
        log.info("%s", self.caps.summary())
        self.check_checkpoint_root()
        host = str(inventory.get("address") or "127.0.0.1")
        self.logs = LogServer(data_dir / "logs", token, host, logs_port)
        self.inventory = {**inventory, "logs_url": self.logs.url}
        self.api = Client(server, token)
        self.poller = Client(server, token)
        self.beats = Client(server, token, timeout=HEARTBEAT_TIMEOUT)
        self._jitter = random.Random()
        self.incarnation = 0
        self.interval = 5.0
        self.after = 0
        self.attempts: dict[tuple[str, int], Attempt] = {}
        self.unclean: dict[str, Group] = {}  # "job/attempt" -> its cgroup, where processes survive
        self.done: set[tuple[str, int]] = set()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._register_lock = threading.Lock()

    def check_checkpoint_root(self) -> None:
        """DESIGN.md 4.4: the checkpoint root must exist and be writable before the node joins."""
        root = self.checkpoint_root
        try:
            if not root.exists():  # made here: jobs pass through to their own folders
                files.private_dir(root)
            probe = root / f".corral-probe-{os.getpid()}"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise ValueError(
                f"checkpoint root {root} is not a writable folder ({exc.strerror}): "
                "create it (a shared file system for multi-node jobs) or pass --checkpoint-root"
            ) from None

    # ---- the control plane ----------------------------------------------------------------
    def register(self) -> dict[str, Any]:
        """Join (again): say which attempts run here and which GPUs are unhealthy; kill the workers
        of attempts the server has ended, then join again clean (DESIGN.md 6.1)."""
        with self._register_lock:
            with self._lock:
                running = [LocalAttempt(job=j, attempt=n) for j, n in self.attempts]
            sent = time.monotonic()
            body = Registration(**self.inventory, running=running, unhealthy=self.health.unhealthy())
            answer = self.api.register_agent(body.model_dump(mode="json"))
            out = Registered.model_validate(answer)
            check_version(out.protocol)
            self.incarnation = out.incarnation
            self.after = max(self.after, out.after)
            self.interval = out.heartbeat_interval_s
            records.write_lease(self.data_dir, sent + out.lease_s)
            log.info("node %s registered, incarnation %s (%s)", self.node, self.incarnation, out.state)
            stale = out.stale_keys()
            if stale:
                threading.Thread(target=self._clean, args=(stale,), daemon=True).start()
            return dict(answer)

    def _clean(self, stale: list[tuple[str, int]]) -> None:
        """Kill what the server says has ended here, wait for it, and join again clean."""
        with self._lock:
            runs = [self.attempts.get(key) for key in stale]
        for run in runs:
            if run is not None:
                log.warning("job %s attempt %s has ended on the server: killing it", run.job, run.number)
                run.request_stop(0.0, 0.0, "ended")
        for run in runs:
            if run is None:
                continue
            started = time.monotonic()  # an adopted attempt's thread starts once `run()` registered
            while run.thread.ident is None and time.monotonic() - started < KILL_AFTER:
                time.sleep(TICK)
            if run.thread.ident is not None:
                run.thread.join(KILL_AFTER * 3)
        with contextlib.suppress(ClientError):
            self.register()

    def adopt_leftovers(self) -> list[Attempt]:
        """Attempts an earlier incarnation launched and never reported ended: supervised again
        (running ones keep running; ended ones are reported from their shims' exit files)."""
        found = []
        for path in remove_empty_groups(self.caps):
            log.info("removed %s, an empty cgroup an earlier agent left", path)
        for run_dir, record in records.unended(self.data_dir):
            try:
                run = Attempt.adopt(self, run_dir, record)
            except (KeyError, ValueError, TypeError) as exc:
                log.warning("cannot read %s: %s", run_dir, exc)
                continue
            with self._lock:
                self.attempts[(run.job, run.number)] = run
            found.append(run)
        return found

    def _heartbeats(self) -> None:
        """One heartbeat per interval; after a failure, retries quickly with jittered exponential
        backoff (`retry_delay`), well inside the lease, so that a control plane that restarts (or
        drops a request) between two beats does not let the lease lapse and the fence kill work."""
        failures = 0
        delay = self.interval
        while not self.stopping.wait(delay):
            if self._heartbeat(say=failures % 10 == 0):  # a refusal said once per 10 tries in a row
                if failures:
                    log.info("heartbeat: answered again after %d failed tries", failures)
                failures, delay = 0, self.interval
            else:
                delay = retry_delay(failures, self.interval, self._jitter.random())
                failures += 1

    def _heartbeat(self, say: bool = True) -> bool:
        """One heartbeat (or, when the server asks for it, a registration); True when accepted."""
        try:
            samples = None
            if self.nvml is not None:
                try:
                    samples = self.nvml.sample()
                except Exception as exc:  # a failing NVML must not stop the lease
                    log.warning("NVML sample: %s", exc)
            sent = time.monotonic()
            unclean = self._still_unclean()
            out = self.beats.heartbeat(
                self.node, self.incarnation, samples, self.health.unhealthy(), unclean=unclean
            )
            records.write_lease(self.data_dir, sent + HeartbeatAnswer.model_validate(out).lease_s)
            if self.attempts:
                fence.ensure(self.data_dir)
            return True
        except ClientError as err:
            if err.status in (404, 409):
                try:
                    self.register()  # writes the lease too
                    return True
                except ClientError as again:
                    err = again
            if say and not err.is_unreachable:
                log.warning("heartbeat: %s", err.message)
            return False

    def _still_unclean(self) -> list[str]:
        """Attempts whose processes survived their kill (a task stuck in the kernel): killed again
        at each heartbeat; the server gives the node no work while any remain (DESIGN.md 6.1)."""
        for name, group in list(self.unclean.items()):
            group.kill()
            if group.empty(wait=0.2):
                group.remove()
                del self.unclean[name]
                log.info("attempt %s: its cgroup is empty at last", name)
        return sorted(self.unclean)

    def report(
        self,
        job: str,
        attempt: int,
        status: str,
        exit_code: int | None = None,
        rank: int | None = None,
        **more: Any,
    ) -> bool:
        """Send one report; False when the server could not be reached before the agent stopped
        (an `exited` report is retried until then: a lost exit would strand the job's GPUs)."""
        fields = {k: v for k, v in more.items() if v not in (None, "")}
        tries = 0
        while status == "exited" or tries < 20:
            tries += 1
            try:
                body = Report(
                    incarnation=self.incarnation,
                    job=job,
                    attempt=attempt,
                    status=ReportStatus(status),
                    exit_code=exit_code,
                    rank=rank,
                    **fields,
                )
                self.api.request("POST", f"/v1/agents/{self.node}/reports", body=body.body())
                return True
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
                    return True
                if not err.is_unreachable:
                    log.warning("report %s of %s/%s: %s", status, job, attempt, err.message)
                    return True
            if self.stopping.wait(min(5.0, float(tries))):
                return False
        return False

    # ---- orders ---------------------------------------------------------------------------
    def handle(self, orders: list[StartOrder | StopOrder | TerminalOrder]) -> None:
        stops = {(o.job, o.attempt) for o in orders if isinstance(o, StopOrder)}
        latest: dict[str, int] = {}
        for o in orders:
            if isinstance(o, StartOrder):
                latest[o.job] = max(latest.get(o.job, 0), o.attempt)
        for o in orders:
            key = (o.job, o.attempt)
            if isinstance(o, TerminalOrder):  # a shell inside a running attempt (`agent/terminal.py`)
                open_session(self, o.model_dump(mode="json"))
            elif isinstance(o, StartOrder):
                # a start already stopped, or superseded, in the same batch (a replay) is not run
                if key in stops or key[1] < latest[key[0]]:
                    self.done.add(key)
                    continue
                with self._lock:
                    if key in self.attempts or key in self.done:
                        continue
                    run = Attempt(self, o.model_dump(mode="json"))
                    self.attempts[key] = run
                log.info("job %s attempt %s: starting", *key)
                run.thread.start()
            else:
                with self._lock:
                    run_or_none = self.attempts.get(key)
                if run_or_none is not None:
                    log.info("job %s attempt %s: stop (%s)", key[0], key[1], o.why.value)
                    run_or_none.request_stop(o.grace, o.signal_in or 0.0, o.why.value)
                else:
                    self.done.add(key)

    def forget(self, run: Attempt) -> None:
        with self._lock:
            self.attempts.pop((run.job, run.number), None)
            self.done.add((run.job, run.number))

    def run(self, on_registered: Any = None) -> None:
        """Register, then heartbeat and follow orders until `shutdown()`."""
        self.logs.start()
        adopted = self.adopt_leftovers()
        while True:
            try:
                joined = self.register()
                break
            except ClientError as err:
                if not err.is_unreachable or self.stopping.wait(1.0):
                    raise
        for run in adopted:
            run.thread.start()
        if on_registered is not None:
            on_registered(joined)
        beat = threading.Thread(target=self._heartbeats, name="corral-agent-heartbeat", daemon=True)
        beat.start()
        while not self.stopping.is_set():
            incarnation = self.incarnation
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
            orders = Orders.model_validate(out).orders
            if self.incarnation != incarnation:
                # registered again while this poll was out (a cut link delivers its answer late):
                # orders up to the registration's cursor are for attempts it found live or ended
                orders = [o for o in orders if o.seq > self.after]
            if orders:
                self.after = orders[-1].seq
                self.handle(orders)

    def shutdown(self, kill: bool = True) -> int:
        """Stop; with `kill`, SIGKILL every attempt's workers now and wait for them (a few
        seconds at most). Returns how many attempts were running here."""
        self.stopping.set()
        with contextlib.suppress(Exception):
            self.logs.stop()
        runs: list[Attempt] = []
        if kill:
            with self._lock:
                runs = list(self.attempts.values())
            for run in runs:
                with contextlib.suppress(OSError):
                    (run.run_dir / "fenced").write_text("the agent was stopped\n")
                run._kill_all(signal.SIGKILL)
            for run in runs:
                run._wait_all(KILL_AFTER)
                run._clean_up()
            for base in [self.caps.cgroup_base, *self.caps.v1_bases.values()]:
                with contextlib.suppress(OSError):  # the agent's own group, once empty
                    if base is not None:
                        base.rmdir()
        return len(runs)
