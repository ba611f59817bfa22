"""A scheduling cycle leaves no reference cycle behind: its objects (its walks, its preemption
phase, its result's lazy reasons) die with its result, not at the next collection of the cyclic
garbage collector. Each cycle's objects were held until a collection when a result's lazy reason
referred to its walk, the walk to the cycle and the cycle to the result: `las` on the overload
trace's first 2,500 jobs grew by about 200 MiB with the collector off (`docs/benchmarks.md`,
issue 15).

The overload trace's first 300 jobs on 8 nodes (a backlog whose reasons are given in runs,
victim searches, nominations) replay with the collector off; at each cycle, nothing the earlier
ones left is there for it to collect.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from corral.policies.registry import load_policy
from corral.sim.engine import Simulation
from corral.sim.eventlog import EventLog

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("policy", ["las", "default"])
def test_cycles_leave_no_garbage_cycle(policy: str) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from overload_trace import overload_cluster, overload_trace
    finally:
        sys.path.pop(0)
    sim = Simulation(overload_cluster(8), overload_trace()[:300], load_policy(policy), EventLog([]))
    left: list[int] = []
    sim.on_cycle = lambda result: left.append(gc.collect())
    gc.collect()
    gc.disable()
    try:
        sim.run()
    finally:
        gc.enable()
    assert len(left) > 500  # the cycles ran
    assert sum(left) == 0
