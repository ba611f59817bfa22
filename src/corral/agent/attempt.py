"""One attempt's workers on this node and the supervisor thread that watches them: prepare (user,
mounts, cgroup), launch each rank under its shim, watch for checkpoints, a stop or the time limit,
and send exactly one `exited` report with why it ended (docs/node-protocol.md 5)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.agent import fence, files, records
from corral.agent.launch import Worker, base_env, hostfile_lines, workers
from corral.agent.ranks import (
    CHECKPOINT_POLL,
    KILL_AFTER,
    RECORD,
    SHIM,
    SHIM_ENV,
    TICK,
    Identity,
    Outcome,
    Rank,
    Stop,
    exit_code_of,
    signal_number,
    tail_of,
)
from corral.agent.sandbox import (
    Group,
    SetupError,
    check_mounts,
    check_reach,
    preexec,
    user_of,
    wrap,
)

if TYPE_CHECKING:
    from corral.agent.runner import Agent

log = logging.getLogger("corral.agent")


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
