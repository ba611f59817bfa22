"""The scenario suite through the simulator: every scenario replayed on its virtual clock.

Every `*.yaml` scenario that test_scenarios.py runs through the core runs here through the
engine of `corral simulate` (`GivenSimulation`, stepped one instant at a time). Steps translate as
follows:
- `running`: the job is restored on exactly its node and GPUs (`GivenSimulation.restore`);
- `submit`: the job arrives at the step's `at` (`GivenSimulation.add`);
- `end`: nothing is told to the simulator. A job's duration is what makes it finish at the
  step that lists it under `end`, counted from the step where it started (a `running` entry,
  or the first step that expects it to start); a job that never ends runs past the scenario;
- `stop`: nothing is told either. A victim stops by itself at its preemption deadline (its
  checkpoint grace), which must be that step's `at`.
The topology slowdown and the restart overhead are off, so durations are exact. Checks: every
event of the replay falls on a step's `at`, and nothing is left to play before a step; each
step's expectations hold for the cycle the simulator ran at that instant, and for its event
log (starts, preemptions, rejections, the endings of `end` and the stops of `stop`); and the
decisions equal the core's on the same step (test_scenarios.Scenario): the same GPUs started,
the same victims, the same rejections, the same reason codes for the jobs left pending.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.config.cluster_file import parse_cluster_config
from corral.config.job_spec import parse_job_spec, to_job_spec
from corral.core.decisions import CycleResult
from corral.core.model import JobId, JobSpec, NodeName
from corral.policies.registry import load_policy
from corral.sim.engine import SimOptions
from corral.sim.eventlog import EventLog
from corral.sim.given import GivenSimulation
from corral.sim.jobmodel import PreemptionCost, Slowdown
from tests.helpers import check_no_double_allocation
from tests.scenarios.test_scenarios import SCENARIOS, Scenario, check, load

PAST_THE_END = 1e9  # seconds of work of a job that no step ends


def durations(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Work per job that some step ends: from the step where it starts to the one that ends it."""
    started: dict[str, float] = {}
    work: dict[str, float] = {}
    for step in steps:
        at = float(step.get("at", 0.0))
        for entry in step.get("running", []):
            started[entry["id"]] = float(entry.get("started", at))
        for job_id in step.get("expect", {}).get("start", {}):
            started.setdefault(job_id, at)
        for job_id in step.get("end", []):
            assert job_id in started, f"{job_id} ends at {at} but no step starts it"
            work[job_id] = at - started[job_id]
    return work


class SimScenario:
    """One scenario replayed by the simulator, step by step, beside the core."""

    def __init__(self, path: Path) -> None:
        self.name = path.name
        self.doc: dict[str, Any] = load(path)
        self.cluster = parse_cluster_config(self.doc["cluster"], source=path.name)
        self.events: list[dict[str, Any]] = []
        self.cycles: dict[float, CycleResult] = {}
        options = SimOptions(
            slowdown=Slowdown(0.0, 0.0, 0.0), preemption=PreemptionCost(restart_overhead=0.0)
        )
        profile = load_policy(self.doc.get("policy", "default"), self.doc.get("policy_args"))
        self.sim = GivenSimulation(self.cluster, [], profile, EventLog([self.events.append]), options)
        self.sim.on_cycle = self.record
        self.work = durations(self.doc["steps"])
        self.restored: set[str] = set()
        self.core = Scenario(path)  # the same steps through the core, to compare decisions
        self.seq = 0

    def record(self, result: CycleResult) -> None:
        assert result.now not in self.cycles, f"{self.name}: two cycles at t={result.now}"
        self.cycles[result.now] = result

    def spec(self, entry: dict[str, Any], at: float) -> JobSpec:
        entry = dict(entry)
        job_id = entry.pop("id")
        entry.setdefault("command", ["true"])
        self.seq += 1
        return to_job_spec(
            parse_job_spec(entry, source=f"job {job_id}"),
            job_id=job_id,
            seq=self.seq,
            submit_time=at,
            cluster=self.cluster,
            default_queue=self.cluster.queues[0].name,
        )

    def step(self, i: int, step: dict[str, Any]) -> None:
        where = f"{self.name} step {i} (simulator)"
        at = float(step.get("at", 0.0))
        sim = self.sim
        while sim.next_time() < at and sim.step():
            pass
        assert sim.next_time() >= at, f"{where}: the replay is at t={sim.next_time()}"
        for entry in step.get("running", []):
            gpus = entry["gpus"]
            skip = ("node", "gpus", "started")
            spec = self.spec(
                {k: v for k, v in entry.items() if k not in skip} | {"gpus_per_replica": len(gpus)}, at
            )
            work = self.work.get(spec.id, PAST_THE_END)
            sim.restore(spec, work, [(NodeName(entry["node"]), gpus)], float(entry.get("started", at)))
            self.restored.add(spec.id)
        for entry in step.get("submit", []):
            spec = self.spec(entry, at)
            sim.add(spec, self.work.get(spec.id, PAST_THE_END))
        while sim.next_time() <= at and sim.step():
            pass
        check_no_double_allocation(sim.state)
        result = self.cycles.get(at, CycleResult(at))
        check(step.get("expect", {}), result, where)
        self.check_events(step, at, result, where)
        self.check_same_as_core(self.core.step(step), result, at in self.cycles, where)

    def check_events(self, step: dict[str, Any], at: float, result: CycleResult, where: str) -> None:
        """The event log says what the cycle decided, and the endings the step lists happened."""
        now = [e for e in self.events if e.get("t") == at]
        starts = {
            e["job"]: e["placement"] for e in now if e["event"] == "start" and e["job"] not in self.restored
        }
        decided = {
            s.job: [{"node": r.node, "gpus": list(r.gpus)} for r in s.placement] for s in result.starts
        }
        assert starts == decided, f"{where}: started {starts}, the cycle decided {decided}"
        told = {e["job"]: e["by"] for e in now if e["event"] == "preempting"}
        assert told == {p.job: p.by for p in result.preemptions}, f"{where}: preempting events {told}"
        rejected = {e["job"] for e in now if e["event"] == "reject"}
        assert rejected == {r.job for r in result.rejections}, f"{where}: reject events {rejected}"
        for kind, job_ids in (("finish", step.get("end", [])), ("preempt", step.get("stop", []))):
            for job_id in job_ids:
                assert any(e["event"] == kind and e["job"] == job_id for e in now), (
                    f"{where}: no {kind} of {job_id} at t={at}: {now}"
                )

    def check_same_as_core(self, core: CycleResult, result: CycleResult, cycled: bool, where: str) -> None:
        """The simulator's decisions are the core's: starts, victims, rejections, reason codes."""
        where = f"{where} vs the core"
        starts = {s.job: [(r.node, sorted(r.gpus)) for r in s.placement] for s in result.starts}
        core_starts = {s.job: [(r.node, sorted(r.gpus)) for r in s.placement] for s in core.starts}
        assert starts == core_starts, f"{where}: started {starts}, the core {core_starts}"
        preempted = {p.job: p.by for p in result.preemptions}
        core_preempted = {p.job: p.by for p in core.preemptions}
        assert preempted == core_preempted, f"{where}: preempted {preempted}, the core {core_preempted}"
        rejected = {r.job for r in result.rejections}
        assert rejected == {r.job for r in core.rejections}, f"{where}: rejected {rejected}, the core {core}"
        pending = set(self.sim.state.jobs)
        assert pending == set(self.core.state.jobs), (
            f"{where}: pending {pending}, the core {self.core.state.jobs}"
        )
        if not cycled:
            return  # nothing happened at this instant: the simulator ran no cycle, so no reasons
        codes = {j: _code(result, j) for j in pending}
        core_codes = {j: _code(core, j) for j in pending}
        assert codes == core_codes, f"{where}: reason codes {codes}, the core {core_codes}"

    def finish(self) -> None:
        """Every event of the replay fell on a step's `at` (the translation left nothing out)."""
        times = {float(step.get("at", 0.0)) for step in self.doc["steps"]}
        stray = [e for e in self.events if "t" in e and e["t"] not in times]
        assert not stray, f"{self.name}: events between the steps: {stray}"


def _code(result: CycleResult, job_id: JobId) -> str:
    reason = result.reason_of(job_id)
    return reason.code.value if reason is not None else ""


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_through_the_simulator(path: Path) -> None:
    scenario = SimScenario(path)
    scenario.sim.begin()
    for i, step in enumerate(scenario.doc["steps"], 1):
        scenario.step(i, step)
    scenario.finish()
