"""Quotas under contention (issue 16): how long a queue sits below its quota while it has jobs
waiting, split by whether a waiting job fits inside what the quota has left.

The simulator's `below_quota_fraction` counts every moment a queue holds fewer GPUs than its
quota while any of its jobs waits. A queue's guarantee (docs/queues-and-quotas.md) is that a
job which keeps it within its quota can take back borrowed GPUs; a job that would take it above
its quota borrows, and may wait. So this splits that time in two:
- `fits, GPUs lent`: some waiting job would keep the queue within its quota and another queue
  holds GPUs above its own quota (the guarantee applies: this should end within a cycle plus
  the victims' grace);
- `fits, none lent`: the same, but no other queue is above its quota (the GPUs missing are
  idle: held for a reservation, or fragments no waiting job fits);
- `too big`: every waiting job would take it above its quota (it may wait like any borrower).
It also prints the longest single stretch of `fits, GPUs lent` per queue.

Run: .venv/bin/python bench/quota_guarantee.py [--jobs 5000] [--nodes 128] [--policy default]
(the `overload128` case of bench/sim_speed.py: the overload trace's first 5,000 jobs on 128
nodes x 8 GPUs, two queues each guaranteed half).
"""

from __future__ import annotations

import argparse
import sys
from bisect import insort
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corral.policies.registry import load_policy, parse_plugin_args
from corral.sim.engine import Simulation
from corral.sim.eventlog import EventLog
from overload_trace import overload_cluster, overload_trace

ENDS = ("finish", "fail", "cancel", "reject", "preempt", "lost", "restart")


class Guarantee:
    def __init__(self, quotas: dict[str, int]) -> None:
        self.quota = quotas
        self.used = dict.fromkeys(quotas, 0)
        self.waiting: dict[str, list[int]] = {q: [] for q in quotas}  # GPUs of waiting jobs, sorted
        self.job: dict[str, tuple[str, int]] = {}
        self.running: set[str] = set()
        self.state = dict.fromkeys(quotas, "")
        self.since = dict.fromkeys(quotas, 0.0)
        self.seconds = {q: {"fits": 0.0, "fits, none lent": 0.0, "too big": 0.0} for q in quotas}
        self.longest = dict.fromkeys(quotas, 0.0)
        self.end = 0.0

    def _check(self, q: str, t: float) -> None:
        waiting, headroom = self.waiting[q], self.quota[q] - self.used[q]
        now = ""
        if headroom > 0 and waiting:
            now = "fits" if waiting[0] <= headroom else "too big"
            lent = sum(max(0, self.used[o] - self.quota[o]) for o in self.quota if o != q)
            if now == "fits" and not lent:
                now = "fits, none lent"  # no other queue is above its quota: nothing to take back
        if now != self.state[q]:
            if self.state[q]:
                self.seconds[q][self.state[q]] += t - self.since[q]
                if self.state[q] == "fits":
                    self.longest[q] = max(self.longest[q], t - self.since[q])
            self.state[q], self.since[q] = now, t

    def feed(self, event: dict[str, Any]) -> None:
        kind, t = event["event"], float(event.get("t", 0.0))
        self.end = max(self.end, t)
        name = event.get("job")
        if kind == "submit":
            q, gpus = event["queue"], event["replicas"] * event["gpus_per_replica"]
            self.job[name] = (q, gpus)
            insort(self.waiting[q], gpus)
        elif kind == "start" and name in self.job:
            q, gpus = self.job[name]
            self.waiting[q].remove(gpus)
            self.used[q] += gpus
            self.running.add(name)
        elif kind in ENDS and name in self.job:
            q, gpus = self.job[name]
            if name in self.running:
                self.running.discard(name)
                self.used[q] -= gpus
                if kind in ("preempt", "lost", "restart"):
                    insort(self.waiting[q], gpus)
            elif kind not in ("preempt", "lost", "restart"):
                self.waiting[q].remove(gpus)
            if kind not in ("preempt", "lost", "restart"):
                del self.job[name]
        else:
            return
        for q in self.quota:
            self._check(q, t)

    def report(self) -> dict[str, dict[str, float]]:
        for q in self.quota:
            if self.state[q]:
                self.seconds[q][self.state[q]] += self.end - self.since[q]
                if self.state[q] == "fits":
                    self.longest[q] = max(self.longest[q], self.end - self.since[q])
        span = self.end or 1.0
        return {
            q: {
                "below, fits, GPUs lent %": 100 * self.seconds[q]["fits"] / span,
                "below, fits, none lent %": 100 * self.seconds[q]["fits, none lent"] / span,
                "below, too big %": 100 * self.seconds[q]["too big"] / span,
                "longest fits s": self.longest[q],
            }
            for q in self.quota
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--policy", default="default")
    parser.add_argument("--arg", action="append", default=[], help="PLUGIN.KEY=VALUE (tiresias.patience=0)")
    args = parser.parse_args()
    cluster = overload_cluster(args.nodes)
    jobs = overload_trace()[: args.jobs]
    check = Guarantee({q.name: q.quota for q in cluster.queues})
    from corral.sim.metrics import Measures

    measures = Measures()
    policy = load_policy(args.policy, parse_plugin_args(args.arg))
    Simulation(cluster, jobs, policy, EventLog([check.feed, measures.feed])).run()
    queues = measures.summary()["queues"]
    for q, row in check.report().items():
        below = queues.get(q, {}).get("below_quota_fraction")
        print(q, {"below_quota_fraction (sim metric) %": 100 * float(below or 0.0), **row})


if __name__ == "__main__":
    main()
