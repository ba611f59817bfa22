"""Small builders shared by the tests: clusters, jobs, and a driver that plays cycles forward."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Sequence

from corral.core import invariants
from corral.core.cycle import schedule
from corral.core.decisions import CycleResult
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, QueueSpec, Topology
from corral.core.plugins import Profile
from corral.core.state import ClusterState
from corral.policies.registry import load_policy

PRIORITY = {"low": 0, "normal": 100, "high": 1000, "urgent": 10000}


def nodes(
    count: int,
    gpus: int = 8,
    *,
    prefix: str = "n",
    leaves: int = 1,
    spines: int = 1,
    model: str = "H100-80GB",
    nvlink: tuple[tuple[int, ...], ...] = (),
) -> list[NodeSpec]:
    """`count` nodes spread evenly over `spines` x `leaves` leaf switches, in order."""
    per_leaf = max(1, count // (leaves * spines))
    result = []
    for i in range(count):
        leaf = i // per_leaf
        labels = {"spine": f"s{leaf // leaves}", "leaf": f"l{leaf}"}
        result.append(NodeSpec(NodeName(f"{prefix}{i:02d}"), gpus, model, 80.0, labels=labels, nvlink=nvlink))
    return result


def queues(*specs: tuple[str, int] | QueueSpec) -> list[QueueSpec]:
    return [s if isinstance(s, QueueSpec) else QueueSpec(QueueName(s[0]), quota=s[1]) for s in specs]


_seq = [0]


def job(
    job_id: str,
    queue: str = "default",
    gpus: int = 1,
    replicas: int = 1,
    *,
    priority: str = "normal",
    submit: float = 0.0,
    time_limit: float | None = None,
    pack: str | None = None,
    required: bool = False,
    preemptible: bool = True,
    model: Sequence[str] = (),
) -> JobSpec:
    _seq[0] += 1
    return JobSpec(
        JobId(job_id),
        QueueName(queue),
        replicas=replicas,
        gpus_per_replica=gpus,
        priority=PRIORITY[priority],
        priority_class=priority,
        submit_time=submit,
        seq=_seq[0],
        time_limit=time_limit,
        preemptible=preemptible,
        topology=Topology(pack, required),
        gpu_model=tuple(model),
    )


def state_of(
    node_specs: Iterable[NodeSpec],
    queue_specs: Iterable[QueueSpec] = (),
    levels: Sequence[str] = ("spine", "leaf"),
) -> ClusterState:
    qs = list(queue_specs) or [QueueSpec(QueueName("default"))]
    return ClusterState.build(levels, node_specs, qs)


def run(state: ClusterState, now: float = 0.0, policy: str | Profile = "default") -> CycleResult:
    profile = load_policy(policy) if isinstance(policy, str) else policy
    return schedule(state, profile, now)


def started_on(result: CycleResult) -> dict[str, list[str]]:
    """Job id -> distinct nodes of its placement, for the starts of one cycle."""
    return {s.job: list(dict.fromkeys(r.node for r in s.placement)) for s in result.starts}


def check_no_double_allocation(state: ClusterState) -> None:
    """Every allocated GPU bit belongs to exactly one running attempt, and the rest of the invariants."""
    invariants.check(state)


def occupy(
    state: ClusterState,
    job_id: str,
    node: str,
    gpus: Sequence[int],
    *,
    queue: str = "default",
    priority: str = "normal",
    now: float = 0.0,
    time_limit: float | None = None,
) -> None:
    """Start a one-replica job on exactly these GPUs, as an adapter restoring state would."""
    spec = job(job_id, queue, gpus=len(gpus), priority=priority, time_limit=time_limit, submit=now)
    pending = state.submit(spec)
    state.unchecked.remove(pending)
    state.remove_pending(spec.id)
    mask = sum(1 << g for g in gpus)
    state.start(pending, [(state.node_ids[NodeName(node)], mask)], now)
    state.plan.commit()


def ran_interpreted(test_file: str, name: str) -> bool:
    """Under the compiled core, run the test `name` of `test_file` interpreted in a subprocess
    (`CORRAL_PURE_PYTHON=1`: a compiled module calls its own functions directly, so switches and
    counters patched from a test are seen only interpreted), assert it passed, and answer True;
    interpreted already, answer False (the caller runs the test's body). A skip would fail CI."""
    from corral import native

    if not native.active():
        return False
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{test_file}::{name}"],
        env={**os.environ, "CORRAL_PURE_PYTHON": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return True
