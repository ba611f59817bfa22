"""`bench/estimate_quality.py --live` reads a live event log right: the estimate each job's first
`start` event carries (compressed seconds, scaled back by the speed) against its trace duration,
the queue's mean over the run times finished before its submission, and the time limit as
submitted. A small made-up log; no server (the live run is the benchmark's business)."""

from __future__ import annotations

import sys
from pathlib import Path

from corral.sim.trace import TraceJob

ROOT = Path(__file__).resolve().parents[2]


def test_live_errors_read_from_the_start_events() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import estimate_quality

    jobs = {
        name: TraceJob(
            job_id=name,
            submit_time=0.0,
            duration=duration,
            gpus=1,
            replicas=1,
            gpus_per_replica=1,
            queue="qa",
        )
        for name, duration in (("a", 1000.0), ("b", 3000.0), ("c", 1500.0), ("d", 800.0))
    }
    names = {"s1": "a", "s2": "b", "s3": "c", "s4": "d"}
    est = {"estimate": 2.0, "estimate_drawn_on": 7, "estimate_basis": "this queue and size"}
    events = [
        {"event": "submit", "t": 0.0, "job": "s1", "time_limit": None},
        {"event": "start", "t": 0.0, "job": "s1", "attempt": 1, "placement": []},  # no history yet
        {"event": "submit", "t": 0.5, "job": "s2", "time_limit": None},
        {"event": "start", "t": 0.5, "job": "s2", "attempt": 1, "placement": []},
        {"event": "finish", "t": 1.2, "job": "s1", "attempt": 1},  # ran 1.2 s: 1,200 trace seconds
        {"event": "submit", "t": 2.0, "job": "s3", "time_limit": 4.0},
        {"event": "start", "t": 2.0, "job": "s3", "attempt": 1, "placement": [], **est},
        {"event": "preempt", "t": 2.5, "job": "s3", "attempt": 1},
        {"event": "start", "t": 2.6, "job": "s3", "attempt": 2, "placement": [], "estimate": 9.0,
         "estimate_drawn_on": 300, "estimate_basis": "the cluster"},  # a later attempt: not counted
        {"event": "finish", "t": 3.5, "job": "s2", "attempt": 1},  # 3,000 s: after s3's submission
        {"event": "submit", "t": 4.0, "job": "s4", "time_limit": None},
        {"event": "start", "t": 4.0, "job": "s4", "attempt": 1, "placement": [],
         "estimate": 1.0, "estimate_drawn_on": 300, "estimate_basis": "the cluster"},
    ]  # fmt: skip
    rows, none, overheads = estimate_quality.measured(events, names, jobs, 1000.0)
    assert none == 2  # s1 (no estimate, no finished queue-mate) and s2 (nothing finished yet)
    # s3: estimate 2,000 against 1,500; queue mean 1,200 (s1 only); limit 4,000
    assert rows[2] == [(500.0, 300.0, 2500.0)]
    # s4: estimate 1,000 against 800; queue mean of 1,200 and 3,000
    assert rows[5] == [(200.0, 1300.0)]
    assert sorted(overheads) == [0.0, 200.0]  # s2 ran its 3,000 s; s1 200 s more than its 1,000
