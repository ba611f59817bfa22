"""The cost of one look of the scheduler's reason book (server/reasons.py `ReasonBook.changes`)
at a long backlog, in process (issue 15; docs/benchmarks.md, "A long backlog, live").

A full cluster of 500 nodes x 8 GPUs (bench/core_backlog.py's fill) and `N` pending jobs (default
100,000) in arrays of 500 of one shape and one time limit each, as bench/server_backlog.py submits
them; twelve cycles of the core, 20 running attempts ended before the ninth; per cycle, the CPU
time of `schedule()` and of the look that follows, and how many reasons it writes.

    .venv/bin/python bench/reason_look.py [N]
    PYTHONPATH=/tmp/before/src .venv/bin/python bench/reason_look.py   # a snapshot of before
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core_backlog import QUEUES, fill_running
from core_fixtures import LEVELS, QUICK, Jobs, node_specs
from corral import native
from corral.core.cycle import schedule
from corral.core.model import QueueName, QueueSpec
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from corral.server.reasons import ReasonBook

SHAPES = (((1, 1), 0.55), ((2, 1), 0.15), ((4, 1), 0.10), ((8, 1), 0.12), ((8, 2), 0.05), ((8, 4), 0.03))


def main() -> None:
    pending = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    rng = random.Random(1)
    size = QUICK  # 500 nodes
    queues = [QueueSpec(QueueName(q), quota=size.total_gpus // 2, cohort="all") for q in QUEUES]
    state = ClusterState.build(LEVELS, node_specs(size), queues)
    profile = load_policy("default")
    jobs, now = Jobs(), 1.8e9
    fill_running(state, size, rng, jobs, 2000, now)
    limits = [600.0 + 180.0 * k for k in range(200)]
    for a in range(pending // 500):
        ((gpus, replicas),) = rng.choices([s for s, _ in SHAPES], [w for _, w in SHAPES])
        limit = rng.choice(limits)
        for t in range(500):
            spec = jobs.make(f"p{a}_{t}", QUEUES[a % 2], gpus, replicas, submit=now + a, time_limit=limit)
            state.submit(spec)
    print(f"compiled core: {native.active()}; {len(state.jobs)} pending")
    book = ReasonBook()
    t = now + 10
    for k in range(12):
        t += 1.0
        if k == 8:
            for job_id in rng.sample(sorted(state.running), 20):
                state.end(job_id, requeue=False, now=t)
        c0 = time.process_time()
        result = schedule(state, profile, t)
        c1 = time.process_time()
        changes = book.changes(state, result)
        c2 = time.process_time()
        print(
            f"cycle {k}: schedule {1000 * (c1 - c0):.0f} ms, look {1000 * (c2 - c1):.0f} ms, "
            f"{len(changes)} reasons written, {len(result.starts)} starts"
        )


if __name__ == "__main__":
    main()
