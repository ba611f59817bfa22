"""Declarative scenarios (KAI-style): a cluster file, steps of submissions and endings, expectations.

Each `*.yaml` beside this file is one scenario, run through the core cycle. A step:
`at` (time), `running` (attempts already placed: id, node, gpus, priority, time_limit, queue),
`submit` (job specs as in DESIGN.md 4.2, plus `id`), `end` (attempts that finished),
`stop` (preempted victims that stopped: requeued), then `expect`:
`start` {job: [nodes]}, `no_start` [jobs], `wait` {job: reason substring}, `code` {job: reason code},
`preempt` {victim: preemptor}, `not_preempted` [jobs], `no_preempt` true, `reserve` {job: start time},
`reject` {job: substring}.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from corral.config.cluster_file import parse_cluster_config
from corral.config.job_spec import parse_job_spec, to_job_spec
from corral.core.cycle import schedule
from corral.core.decisions import CycleResult
from corral.core.model import JobId, NodeName
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.helpers import check_no_double_allocation

HERE = Path(__file__).parent
SCENARIOS = sorted(HERE.glob("*.yaml"))

KEYS = {"description", "cluster", "steps", "policy", "policy_args"}
STEP_KEYS = {"at", "running", "submit", "end", "stop", "expect"}
EXPECT_KEYS = {
    "start",
    "no_start",
    "wait",
    "code",
    "preempt",
    "not_preempted",
    "no_preempt",
    "reserve",
    "reject",
}


def load(path: Path) -> dict[str, Any]:
    """A scenario file, with every key known: a misspelt expectation would check nothing."""
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    _known(doc, KEYS, path.name)
    for i, step in enumerate(doc["steps"], 1):
        _known(step, STEP_KEYS, f"{path.name} step {i}")
        _known(step.get("expect") or {}, EXPECT_KEYS, f"{path.name} step {i} expect")
    return doc


def _known(mapping: dict[str, Any], keys: set[str], where: str) -> None:
    unknown = sorted(set(mapping) - keys)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(keys))}")


class Scenario:
    def __init__(self, path: Path) -> None:
        self.doc: dict[str, Any] = load(path)
        self.cluster = parse_cluster_config(self.doc["cluster"], source=path.name)
        c = self.cluster
        self.state = ClusterState.build(c.topology, c.nodes, c.queues, c.priority_classes)
        self.profile = load_policy(self.doc.get("policy", "default"), self.doc.get("policy_args"))
        self.seq = 0

    def submit(self, entry: dict[str, Any], now: float) -> None:
        entry = dict(entry)
        job_id = JobId(entry.pop("id"))
        entry.setdefault("command", ["true"])
        request = parse_job_spec(entry, source=f"job {job_id}")
        self.seq += 1
        spec = to_job_spec(
            request,
            job_id=job_id,
            seq=self.seq,
            submit_time=now,
            cluster=self.cluster,
            default_queue=self.cluster.queues[0].name,
        )
        self.state.submit(spec)

    def occupy(self, entry: dict[str, Any], now: float) -> None:
        gpus = entry["gpus"]
        self.submit(
            {k: v for k, v in entry.items() if k not in ("node", "gpus", "started")}
            | {"gpus_per_replica": len(gpus)},
            now,
        )
        state = self.state
        pending = state.unchecked.pop()
        state.remove_pending(pending.spec.id)
        mask = sum(1 << g for g in gpus)
        state.start(
            pending, [(state.node_ids[NodeName(entry["node"])], mask)], float(entry.get("started", now))
        )
        state.plan.commit()

    def step(self, step: dict[str, Any]) -> CycleResult:
        now = float(step.get("at", 0.0))
        for job_id in step.get("end", []):
            self.state.end(JobId(job_id), requeue=False, now=now)
        for job_id in step.get("stop", []):
            self.state.end(JobId(job_id), requeue=True, now=now)
        for entry in step.get("running", []):
            self.occupy(entry, now)
        for entry in step.get("submit", []):
            self.submit(entry, now)
        result = schedule(self.state, self.profile, now)
        check_no_double_allocation(self.state)
        return result


def check(expect: dict[str, Any], result: CycleResult, where: str) -> None:
    started = {s.job: list(dict.fromkeys(r.node for r in s.placement)) for s in result.starts}
    for job_id, want in expect.get("start", {}).items():
        assert job_id in started, f"{where}: {job_id} did not start: {result.reasons.get(JobId(job_id))}"
        if want != "any":
            assert sorted(started[job_id]) == sorted(want), f"{where}: {job_id} placed on {started[job_id]}"
    for job_id in expect.get("no_start", []):
        assert job_id not in started, f"{where}: {job_id} started on {started.get(job_id)}"
    for job_id, text in expect.get("wait", {}).items():
        reason = result.reasons.get(JobId(job_id))
        assert reason is not None and text in reason.message, f"{where}: {job_id}: {reason}"
    for job_id, code in expect.get("code", {}).items():
        reason = result.reasons.get(JobId(job_id))
        assert reason is not None and reason.code.value == code, f"{where}: {job_id}: {reason}"
    preempted = {p.job: p.by for p in result.preemptions}
    for victim, by in expect.get("preempt", {}).items():
        assert preempted.get(victim) == by, f"{where}: preemptions were {preempted}"
    for job_id in expect.get("not_preempted", []):
        assert job_id not in preempted, f"{where}: {job_id} was preempted by {preempted[job_id]}"
    if expect.get("no_preempt"):
        assert not preempted, f"{where}: unexpected preemptions {preempted}"
    reserved = {r.job: r.start for r in result.reservations}
    for job_id, at in expect.get("reserve", {}).items():
        assert reserved.get(job_id) == at, f"{where}: reservations were {reserved}"
    rejected = {r.job: r.reason for r in result.rejections}
    for job_id, text in expect.get("reject", {}).items():
        assert text in rejected.get(job_id, ""), f"{where}: rejections were {rejected}"


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    scenario = Scenario(path)
    for i, step in enumerate(scenario.doc["steps"]):
        result = scenario.step(step)
        check(step.get("expect", {}), result, f"{path.name} step {i + 1}")


def test_there_are_scenarios() -> None:
    assert len(SCENARIOS) >= 6


@pytest.mark.parametrize(
    ("where", "text"),
    [("expect", "preemt: {a1: b1}"), ("step", "stopp: [a1]"), ("top", "polcy: fifo")],
)
def test_a_misspelt_key_is_rejected_naming_it(tmp_path: Path, where: str, text: str) -> None:
    doc = (HERE / "borrow_reclaim.yaml").read_text()
    if where == "expect":
        doc = doc.replace("      preempt: {a1: b1}", "      " + text)
    elif where == "step":
        doc = doc.replace("    stop: [a1]", "    " + text)
    else:
        doc = text + "\n" + doc
    path = tmp_path / "typo.yaml"
    path.write_text(doc)
    with pytest.raises(ValueError, match=f"unknown key.s. {text.split(':')[0]}; known: "):
        Scenario(path)
