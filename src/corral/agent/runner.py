"""The agent's loop: register, heartbeat, long-poll orders, run and supervise attempts.

Each worker is its own session (process group) inside the attempt's cgroup where the machine
allows (`corral.agent.sandbox`): signals go to every worker's group at once, kills go to the
cgroup, so a grandchild that calls `setsid` does not escape. Each attempt has a supervisor
thread that sends exactly one `exited` report for this node, with why it ended when the agent
knows (time limit, set-up failure, launch failure) and the tail of the failing rank's log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.agent import fence, files, records
from corral.agent.health import Health
from corral.agent.launch import Worker, base_env, hostfile_lines, workers
from corral.agent.logserver import LogServer
from corral.agent.sandbox import (
    Capabilities,
    Group,
    SetupError,
    check_mounts,
    check_reach,
    closed_data_dir,
    preexec,
    remove_empty_groups,
    user_of,
    wrap,
)
from corral.client import Client, ClientError

log = logging.getLogger("corral.agent")

KILL_AFTER = 5.0  # SIGTERM, then SIGKILL after this long, for the survivors of a failed rank
POLL_WAIT = 30.0
TICK = 0.05
LEASE = 20.0  # seconds a heartbeat's lease lasts unless the server says otherwise
HEARTBEAT_RETRY = 0.2  # after a failed heartbeat, the next one this soon, doubling ...
HEARTBEAT_RETRY_MAX = 2.0  # ... to at most this (with jitter): many tries inside one lease
HEARTBEAT_TIMEOUT = 5.0  # a heartbeat unanswered this long has failed (then retried)
CHECKPOINT_POLL = 1.0  # how often the agent looks for a newly recorded checkpoint
TAIL_LINES = 20
RECORD = "corral-checkpoint.json"  # written by corral.job.record_checkpoint
SHIM = str(Path(__file__).with_name("shim.py"))  # run as a file: importing `corral` is not needed
SHIM_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # all the (maybe root) shim sees


class Identity:
    """The user a job runs as: its account, and the uid and gid the shim switches to (None when
    that is the agent's own user)."""

    def __init__(self, account: pwd.struct_passwd) -> None:
        self.account = account
        self.name, self.home, self.shell = account.pw_name, account.pw_dir, account.pw_shell
        switch = account.pw_uid != os.geteuid()
        self.uid = account.pw_uid if switch else None
        self.gid = account.pw_gid if switch else None


def retry_delay(failures: int, interval: float, draw: float) -> float:
    """Seconds before the next heartbeat after `failures` + 1 failed ones in a row: 0.2 s doubling
    to 2 s (at most the interval), times a jitter from `draw` in [0, 1) of 0.5 to 1.5, so that a
    restarted control plane is not met by every agent at once."""
    base = min(HEARTBEAT_RETRY * 2.0 ** min(failures, 16), HEARTBEAT_RETRY_MAX, interval)
    return float(base * (0.5 + draw))


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


@dataclass
class Outcome:
    """How this node's part of an attempt ended, as the `exited` report says it."""

    code: int
    rank: int | None = None
    why: str = ""  # time_limit | setup | launch
    message: str = ""
    log_tail: str = ""


class Rank:
    """One rank's shim: a child of this agent (`popen`), or adopted from an earlier incarnation
    (then its exit status comes from the file the shim writes)."""

    def __init__(
        self,
        pid: int,
        exit_file: Path,
        popen: subprocess.Popen[bytes] | None = None,
        start: int | None = None,
    ) -> None:
        self.pid, self.exit_file, self.popen, self.start = pid, exit_file, popen, start
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if self.popen is not None:
            self.returncode = self.popen.poll()
            return self.returncode
        with contextlib.suppress(OSError, ValueError):
            self.returncode = int(self.exit_file.read_text().split()[0])
            return self.returncode
        if not records.alive(self.pid, self.start):
            self.returncode = -signal.SIGKILL  # gone without a word: killed (the fence, an OOM kill)
        return self.returncode


def tail_of(path: Path, lines: int = TAIL_LINES, limit: int = 4000) -> str:
    """The last lines of a log, at most `limit` characters (undecodable bytes replaced)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - limit))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


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
        limit = order.get("time_limit_s")
        self.time_limit = float(limit) if limit else None
        self.procs: list[tuple[int, Rank]] = []
        self.adopted = False
        self.launched = time.monotonic()  # the time limit counts from here (one clock per machine)
        self.group: Group | None = None
        self.checkpoints = agent.checkpoint_root / self.job
        self.logs = agent.data_dir / "logs" / self.job / f"attempt-{self.number}"
        self.run_dir = agent.data_dir / "run" / self.job / f"attempt-{self.number}"
        self._stop: Stop | None = None
        self._lock = threading.Lock()
        self._record_seen = 0.0
        self.thread = threading.Thread(
            target=self._run, name=f"attempt-{self.job}-{self.number}", daemon=True
        )

    def request_stop(self, grace: float, signal_in: float, why: str) -> None:
        with self._lock:
            stop = Stop(time.monotonic() + signal_in, grace, why)
            if self._stop is None or stop.signal_at + stop.grace < self._stop.signal_at + self._stop.grace:
                self._stop = stop

    # ---- launching ------------------------------------------------------------------------
    def _prepare(self) -> tuple[list[Worker], Identity, str, list[dict[str, Any]]]:
        """Folders, checks and the cgroup; SetupError when the node cannot run this attempt."""
        agent, spec = self.agent, self.order["spec"]
        who = Identity(user_of(agent.caps, str(self.order.get("run_as") or "")))
        mounts = [dict(m) for m in spec.get("mounts") or []]
        check_mounts(agent.caps, mounts)
        attempt = f"attempt-{self.number}"
        try:  # the run and log folders are the agent's alone; the checkpoint folders the job's
            files.fresh_dirs(agent.data_dir, ["run", self.job, attempt])
            files.fresh_dirs(agent.data_dir, ["logs", self.job, attempt])
            files.give_dir(agent.checkpoint_root, self.job, who.uid, who.gid)
            files.give_dir(self.checkpoints, attempt, who.uid, who.gid)
            default_cwd = files.give_dir(self.run_dir, "work", who.uid, who.gid)
        except files.UnsafePath as exc:
            raise SetupError(str(exc)) from None
        cwd = str(spec.get("working_dir") or default_cwd)
        if not Path(cwd).is_dir():
            raise SetupError(f"working directory {cwd} does not exist on this node")
        if who.uid is not None and not mounts:  # entered as the job's user (bwrap's is inside)
            check_reach(Path(cwd), who.account)
        hostfile = self.run_dir / "hostfile"
        lines = "".join(line + "\n" for line in hostfile_lines(self.order))
        files.write_file(hostfile, lines.encode(), files.READABLE_FILE)
        todo = workers(self.order, agent.node, self.checkpoints, hostfile, self.run_dir)
        if agent.caps.cgroup_base is not None:
            self.group = Group(agent.caps, f"{self.job}-{self.number}")
            local = len(todo) if spec.get("launch", "per_gpu") == "per_gpu" else len(self._local_replicas())
            self.group.limit(
                float(spec.get("cpus_per_replica") or 0) * local,
                int(float(spec.get("memory_gib_per_replica") or 0) * local * 2**30),
            )
        return todo, who, cwd, mounts

    def _local_replicas(self) -> list[int]:
        return [i for i, r in enumerate(self.order["placement"]) if r["node"] == self.agent.node]

    def _launch(self) -> Outcome | None:
        """Start every local worker; None when all started, else how the attempt ends here."""
        until = records.lease_until(self.agent.data_dir)
        if until is None or time.monotonic() > until:  # DESIGN.md 6.1: no launch without a lease
            log.warning(
                "job %s attempt %s: not launched: the node's lease has expired", self.job, self.number
            )
            return Outcome(1, None, "lost", f"not launched on {self.agent.node}: its lease had expired")
        try:
            todo, who, cwd, mounts = self._prepare()
        except SetupError as exc:
            log.warning("job %s attempt %s cannot run here: %s", self.job, self.number, exc)
            return Outcome(1, None, "setup", f"{exc} (node {self.agent.node})")
        except OSError as exc:
            return Outcome(1, None, "setup", f"could not prepare the attempt on {self.agent.node}: {exc}")
        fds = self.group.entry_fds() if self.group is not None else []
        base = base_env(os.environ, who.home, who.name, who.shell, self.agent.pass_env)
        try:
            for w in todo:
                try:
                    proc = self._start_rank(w, who, {**base, **w.env}, cwd, mounts, fds)
                except (OSError, subprocess.SubprocessError) as exc:
                    log.warning(
                        "job %s attempt %s rank %s did not launch: %s", self.job, self.number, w.rank, exc
                    )
                    with contextlib.suppress(OSError), open(self.logs / f"rank-{w.rank}.log", "a") as out:
                        out.write(f"corral agent: could not launch {w.argv!r}: {exc}\n")
                    self._kill_all(signal.SIGKILL)
                    for _, p in self.procs:
                        if p.popen is not None:
                            p.popen.wait()
                    return Outcome(127, w.rank, "launch", f"rank {w.rank} did not launch: {exc}")
                exit_file = self.run_dir / f"rank-{w.rank}.exit"
                self.procs.append((w.rank, Rank(proc.pid, exit_file, proc, records.start_time(proc.pid))))
        finally:
            for fd in fds:
                os.close(fd)
            self._save()
        return None

    def _start_rank(
        self,
        w: Worker,
        who: Identity,
        env: dict[str, str],
        cwd: str,
        mounts: list[dict[str, Any]],
        fds: list[int],
    ) -> subprocess.Popen[bytes]:
        """Start one rank's shim, as the agent's user, with none of the job's environment: what
        the rank runs with is in its launch file, which the shim reads and deletes."""
        launch = self.run_dir / f"rank-{w.rank}.launch"
        body = {
            "exit_file": str(self.run_dir / f"rank-{w.rank}.exit"),
            "argv": wrap(self.agent.caps, w.argv, mounts, cwd),
            "env": env,
            "cwd": "/" if mounts else cwd,  # bwrap enters `cwd` inside its mounts
            "uid": who.uid,
            "gid": who.gid,
        }
        files.write_file(launch, json.dumps(body).encode())
        out = files.open_log(self.logs / f"rank-{w.rank}.log", who.uid, who.gid)
        try:
            return subprocess.Popen(
                [sys.executable, "-I", "-S", SHIM, str(launch)],
                env=SHIM_ENV,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd="/",
                preexec_fn=preexec(fds) if fds else None,
            )
        finally:
            os.close(out)

    def _save(self) -> None:
        """The record the fence and a restarted agent read (DESIGN.md 6.1)."""
        ranks = [{"rank": r, "pid": p.pid, "start": p.start} for r, p in self.procs]
        cgroup = str(self.group.v2) if self.group is not None and self.group.v2 is not None else None
        records.write_record(self.run_dir, self.order, ranks, cgroup, self.launched)
        if self.procs:
            fence.ensure(self.agent.data_dir)

    @classmethod
    def adopt(cls, agent: Agent, run_dir: Path, record: dict[str, Any]) -> Attempt:
        """An attempt an earlier incarnation of the agent launched, found running (or ended)."""
        run = cls(agent, record["order"])
        run.adopted = True
        run.launched = float(record.get("launched") or time.monotonic())
        run.run_dir = run_dir
        if record.get("cgroup"):
            run.group = Group.existing(agent.caps, Path(record["cgroup"]))
        run.procs = [
            (int(r["rank"]), Rank(int(r["pid"]), run_dir / f"rank-{r['rank']}.exit", None, r.get("start")))
            for r in record.get("ranks", [])
        ]
        return run

    # ---- supervising ----------------------------------------------------------------------
    def _signal(self, proc: Rank, sig: int) -> None:
        """SIGKILL to the rank's whole process group; any other signal to its shim alone, which
        passes it to the rank's main process (its children are the rank's to stop)."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                (os.killpg if sig == signal.SIGKILL else os.kill)(proc.pid, sig)

    def _kill_all(self, sig: int) -> None:
        if sig == signal.SIGKILL and self.group is not None:
            self.group.kill()
        for _, p in self.procs:
            self._signal(p, sig)

    def _sweep(self) -> None:
        """Once the ranks ended: what their main processes left behind in their groups dies too."""
        for _, p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)

    def _wait_all(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for _, p in self.procs):
            if time.monotonic() >= deadline:
                return False
            time.sleep(TICK)
        return True

    def _finish_stop(self, stop: Stop) -> Outcome:
        with contextlib.suppress(OSError):  # for ranks behind a launcher that does not forward signals
            (self.run_dir / "checkpoint-requested").write_text(stop.why + "\n")
        self._kill_all(self.signal)
        if not self._wait_all(stop.grace):
            log.info("job %s attempt %s: grace of %.0f s over, killing", self.job, self.number, stop.grace)
            self._kill_all(signal.SIGKILL)
            self._wait_all(KILL_AFTER)
        self._sweep()
        by_rank = dict(self.procs)
        first = by_rank.get(min(by_rank)) if by_rank else None
        code = exit_code_of(first.returncode) if first is not None and first.returncode is not None else 137
        why = "time_limit" if stop.why == "time_limit" else ""
        return Outcome(code, min(by_rank) if by_rank else None, why)

    def _run(self) -> None:
        try:
            outcome = self._supervise()
        except Exception:  # the report must still go out
            log.exception("supervising job %s attempt %s", self.job, self.number)
            self._kill_all(signal.SIGKILL)
            outcome = Outcome(1, None, "", "the agent failed while supervising the attempt")
        fenced = self.run_dir / "fenced"
        if outcome.code != 0 and fenced.exists():  # not the job's fault: a disruption, not a failure
            why = fenced.read_text().strip() or "its lease expired"
            outcome = Outcome(outcome.code, outcome.rank, "lost", f"killed on {self.agent.node}: {why}")
        self._clean_up()
        delivered = self.agent.report(
            self.job,
            self.number,
            "exited",
            outcome.code,
            outcome.rank,
            why=outcome.why,
            message=outcome.message,
            log_tail=outcome.log_tail,
        )
        if delivered:  # else the next incarnation of the agent reports it, from the shims' files
            with contextlib.suppress(OSError):
                (self.run_dir / records.ENDED).write_text(f"{outcome.code}\n")
        self.agent.forget(self)

    def _clean_up(self) -> None:
        """What the workers left behind (background children, setsid escapees) dies with them."""
        if self.group is None:
            return
        if not self.group.empty():
            self.group.kill()
            if not self.group.empty(wait=KILL_AFTER):
                log.error("job %s attempt %s: processes survive in %s", self.job, self.number, self.group.v2)
                self.agent.unclean[f"{self.job}/{self.number}"] = self.group  # no new work till empty
                return
        self.group.remove()

    def _watch_checkpoint(self) -> None:
        """Report a newly recorded checkpoint's step and age (a duration: DESIGN.md 6.5)."""
        record = self.checkpoints / f"attempt-{self.number}" / RECORD
        try:
            mtime = record.stat().st_mtime
        except OSError:
            return
        if mtime <= self._record_seen:
            return
        self._record_seen = mtime
        # the job's folders and file: no link followed on the way, no FIFO waited on
        data = files.read_small(self.agent.checkpoint_root, [self.job, f"attempt-{self.number}", RECORD])
        try:
            step = int(json.loads(data or b"")["step"])
        except (ValueError, KeyError, TypeError):
            return
        age = max(0.0, time.time() - mtime)
        self.agent.report(self.job, self.number, "checkpoint", step=step, age_s=age)

    def _supervise(self) -> Outcome:
        started = self.launched
        if self.adopted:
            codes = [p.poll() for _, p in self.procs]
            ended = all(c is not None for c in codes) or any(c not in (None, 0) for c in codes)
            live = sum(c is None for c in codes)
            log.info(
                "job %s attempt %s: adopted %d running ranks (%d ended)",
                self.job,
                self.number,
                live,
                len(codes) - live,
            )
        else:
            failed = self._launch()
            if failed is not None:
                return failed
            ended = False
        if not ended:  # an adopted attempt that has ended goes straight to its exit report
            self.agent.report(self.job, self.number, "running")
        next_look = started + CHECKPOINT_POLL
        while True:
            with self._lock:
                stop = self._stop
            now = time.monotonic()
            if stop is None and self.time_limit is not None and now - started >= self.time_limit:
                log.info("job %s attempt %s reached its time limit", self.job, self.number)
                stop = Stop(now, self.grace, "time_limit")
                with self._lock:
                    self._stop = stop
            if stop is not None and now >= stop.signal_at:
                return self._finish_stop(stop)
            if now >= next_look:
                next_look = now + CHECKPOINT_POLL
                self._watch_checkpoint()
            for rank, proc in self.procs:
                code = proc.poll()
                if code is not None and code != 0:
                    with contextlib.suppress(OSError):  # `corral.job.stop_reason()` of the others
                        (self.run_dir / "checkpoint-requested").write_text("peer_failed\n")
                    self._kill_all(signal.SIGTERM)
                    if not self._wait_all(KILL_AFTER):
                        self._kill_all(signal.SIGKILL)
                        self._wait_all(KILL_AFTER)
                    self._sweep()
                    tail = tail_of(self.logs / f"rank-{rank}.log")
                    return Outcome(exit_code_of(code), rank, "", "", tail)
            if all(p.poll() == 0 for _, p in self.procs):
                self._watch_checkpoint()
                return Outcome(0)
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
                running = [{"job": j, "attempt": n} for j, n in self.attempts]
            sent = time.monotonic()
            body = {**self.inventory, "running": running, "unhealthy": self.health.unhealthy()}
            out = self.api.register_agent(body)
            self.incarnation = int(out["incarnation"])
            self.after = max(self.after, int(out.get("after") or 0))
            self.interval = float(out.get("heartbeat_interval_s", 5.0))
            records.write_lease(self.data_dir, sent + float(out.get("lease_s", LEASE)))
            log.info("node %s registered, incarnation %s (%s)", self.node, self.incarnation, out.get("state"))
            stale = [tuple(x.split("/")) for x in out.get("stale") or []]
            if stale:
                threading.Thread(target=self._clean, args=(stale,), daemon=True).start()
            return dict(out)

    def _clean(self, stale: list[tuple[str, ...]]) -> None:
        """Kill what the server says has ended here, wait for it, and join again clean."""
        with self._lock:
            runs = [self.attempts.get((job, int(n))) for job, n in stale]
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
            records.write_lease(self.data_dir, sent + float(out.get("lease_s", LEASE)))
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
        body = {
            "job": job,
            "attempt": attempt,
            "status": status,
            "exit_code": exit_code,
            "rank": rank,
            **{k: v for k, v in more.items() if v not in (None, "")},
        }
        tries = 0
        while status == "exited" or tries < 20:
            tries += 1
            try:
                self.api.request(
                    "POST", f"/v1/agents/{self.node}/reports", body={"incarnation": self.incarnation, **body}
                )
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
            elif o.get("kind") == "terminal":  # a shell inside a running attempt (`agent/terminal.py`)
                from corral.agent.terminal import open_session

                open_session(self, o)

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
            orders = out.get("orders") or []
            if self.incarnation != incarnation:
                # registered again while this poll was out (a cut link delivers its answer late):
                # orders up to the registration's cursor are for attempts it found live or ended
                orders = [o for o in orders if int(o["seq"]) > self.after]
            if orders:
                self.after = int(orders[-1]["seq"])
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
