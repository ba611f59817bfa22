"""The measures of a run (DESIGN.md 6.7), computed in one pass over the event log of 4.6."""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from corral.sim.report_series import Sample, Sampler, Series, State
from corral.sim.summary import QueueTotals, distribution, jain, queue_summary

__all__ = ["Event", "Measures", "Series", "measures_from_log", "replay_log"]

_OFF = -math.inf  # "not below quota now" / "not running now"

Event = dict[str, Any]


class _Job:
    """A job not yet ended: when it came, where it runs now (if it does)."""

    __slots__ = ("first_start", "gpus", "ideal", "nodes", "queue", "start", "submit")

    def __init__(self, submit: float, queue: int, ideal: float) -> None:
        self.submit = submit
        self.queue = queue
        self.ideal = ideal  # T_ideal of finish-time fairness; 0 when the log carries no duration
        self.first_start = _OFF
        self.start = _OFF  # start of the running attempt; _OFF while pending
        self.gpus = 0
        self.nodes: list[tuple[int, int]] = []  # (node index, GPUs) per replica of the running attempt


class Measures:
    """Feed it every event of a log, in order; `summary()` and `series()` may be asked at any time."""

    __slots__ = (  # fast attribute access on the hot path
        "_alloc", "_allocated", "_backfilled", "_below_seconds", "_below_since", "_big", "_capacity",
        "_count", "_frag", "_frag_area", "_frag_t", "_free", "_free_total", "_gpu_seconds", "_gpus",
        "_handlers", "_jcts", "_jobs", "_levels", "_lost", "_next_sample", "_node_index", "_open",
        "_origin", "_pending", "_pending_area", "_queue_index", "_queue_names", "_queue_seconds",
        "_queued", "_quota", "_rhos", "_sampler", "_spanless", "_spans", "_submitted", "_t", "_t0",
        "_tightest", "_waits", "_weight", "_whole",
    )  # fmt: skip

    def __init__(self) -> None:
        self._t0: float | None = None
        self._t = _OFF
        self._jobs: dict[str, _Job] = {}
        self._count = dict.fromkeys(("failed", "failed_time_limit", "cancelled", "rejected"), 0)
        self._count.update(preemptions=0, node_failures=0, restarts=0)
        self._lost = {"preempt": 0.0, "lost": 0.0}
        self._jcts = array("d")
        self._waits = array("d")
        self._rhos = array("d")
        self._spans: dict[str, int] = {}
        self._levels: list[str] = []  # the cluster's topology levels, top down
        self._tightest = self._spanless = self._backfilled = 0
        self._init_cluster()
        self._init_queues()
        self._sampler = Sampler()
        self._next_sample = _OFF  # a copy of the sampler's next_at, for feed's fast path
        self._handlers: dict[str, Callable[[Event], None]] = {
            "cluster": self._on_cluster,
            "submit": self._on_submit,
            "start": self._on_start,
            "preempting": lambda event: None,  # ends nothing: the GPUs stay busy until `preempt`
            **dict.fromkeys(("preempt", "lost", "restart"), self._on_requeue),
            **dict.fromkeys(("finish", "fail", "cancel", "reject"), self._on_end),
        }

    def _init_cluster(self) -> None:
        self._node_index: dict[str, int] = {}
        self._capacity: list[int] = []
        self._free: list[int] = []
        self._gpus = 0  # GPUs in the cluster
        self._free_total = 0
        self._big = 0  # G: the largest node's GPUs
        self._whole = 0  # sum over nodes of floor(free / G)
        self._frag = 0.0  # fragmentation now
        self._frag_t = _OFF
        self._frag_area = 0.0
        self._allocated = 0
        self._gpu_seconds = 0.0

    def _init_queues(self) -> None:
        self._queue_index: dict[str, int] = {}
        self._queue_names: list[str] = []
        self._weight: list[float] = []
        self._quota: list[int] = []
        self._alloc: list[int] = []
        self._queued: list[int] = []  # pending jobs per queue
        self._submitted: list[int] = []
        self._queue_seconds: list[float] = []
        self._below_since: list[float] = []
        self._below_seconds: list[float] = []
        self._open: list[float] = []  # per queue: sum of GPUs x (start - origin) of running attempts
        self._pending = 0
        self._pending_area = 0.0  # job-seconds spent pending, up to now
        self._origin = 0.0  # the first event's t

    # ---- feeding ---------------------------------------------------------------------------
    def feed(self, event: Event) -> None:
        """Account one event; events must come in log order."""
        t = event.get("t")
        if t is not None and t != self._t:
            if t > self._t and self._t < self._next_sample:  # the usual case: no sample due
                self._pending_area += self._pending * (t - self._t)
                self._t = t
            else:
                self._advance(t)
        try:
            self._handlers[event["event"]](event)
        except KeyError as e:
            raise ValueError(f"event seq={event.get('seq')}: unknown or missing {e} in {event}") from e

    def feed_all(self, events: Iterable[Event]) -> Measures:
        feed = self.feed
        for event in events:
            feed(event)
        return self

    def _advance(self, t: float) -> None:
        last = self._t
        if t < last:
            raise ValueError(f"event log goes back in time: t={t} after t={last}")
        if self._t0 is None:
            self._t0 = self._frag_t = self._origin = t
            self._sampler.begin(t)
        else:
            if last >= self._sampler.next_at:
                self._sampler.add(self._sample())
            self._pending_area += self._pending * (t - last)
        self._next_sample = self._sampler.next_at
        self._t = t

    def _on_cluster(self, event: Event) -> None:
        if self._t0 is not None:
            self._frag_area += self._frag * (self._t - self._frag_t)
            self._frag_t = self._t
        for node in event["nodes"]:
            i = self._node_index.setdefault(node["name"], len(self._capacity))
            if i == len(self._capacity):
                self._capacity.append(0)
                self._free.append(0)
            self._free[i] += int(node["gpus"]) - self._capacity[i]
            self._capacity[i] = int(node["gpus"])
        self._gpus = sum(self._capacity)
        self._free_total = sum(self._free)
        self._big = max(self._capacity, default=0)
        self._whole = sum(f // self._big for f in self._free) if self._big else 0
        left, big = self._free_total, self._big
        self._frag = 1.0 - self._whole / (left // big) if big and left >= big else 0.0
        self._levels = list(event.get("topology", self._levels))
        for q in event.get("queues", ()):
            i = self._queue(q["name"])
            self._weight[i] = float(q.get("weight", 1.0))
            self._quota[i] = int(q.get("quota") or 0)

    def _queue(self, name: str) -> int:
        i = self._queue_index.get(name)
        if i is None:
            i = self._queue_index[name] = len(self._queue_names)
            self._queue_names.append(name)
            self._weight.append(1.0)
            for ints in (self._quota, self._alloc, self._queued, self._submitted):
                ints.append(0)
            for floats in (self._queue_seconds, self._below_seconds, self._open):
                floats.append(0.0)
            self._below_since.append(_OFF)
        return i

    def _on_submit(self, event: Event) -> None:
        q = self._queue_index.get(event["queue"])
        if q is None:
            q = self._queue(event["queue"])
        gpus = event["replicas"] * event["gpus_per_replica"]
        duration = event.get("duration")
        ideal = 0.0
        if duration and self._gpus:
            active = len(self._jobs) + 1  # N: the jobs pending or running once this one is submitted
            over = gpus * active / self._gpus  # the job's GPUs over its fair share C / N
            ideal = duration * over if over > 1.0 else duration
        self._jobs[event["job"]] = _Job(self._t, q, ideal)
        self._submitted[q] += 1
        self._queued[q] += 1
        self._pending += 1
        if self._quota[q]:
            self._check_quota(q)

    def _on_start(self, event: Event) -> None:
        job = self._jobs[event["job"]]
        t = self._t
        if job.first_start == _OFF:
            job.first_start = t
            self._waits.append(t - job.submit)
        self._frag_area += self._frag * (t - self._frag_t)
        self._frag_t = t
        free, index, big = self._free, self._node_index, self._big
        whole, gpus, nodes = self._whole, 0, []
        for replica in event["placement"]:
            n = index[replica["node"]]
            c = len(replica["gpus"])
            if free[n] == big:  # floor(free / G) is 1 for a whole free largest node, else 0
                whole -= 1
            free[n] -= c
            nodes.append((n, c))
            gpus += c
        self._whole = whole
        self._free_total = left = self._free_total - gpus
        self._frag = 1.0 - whole / (left // big) if big and left >= big else 0.0
        job.start, job.gpus, job.nodes = t, gpus, nodes
        self._allocated += gpus
        q = job.queue
        self._alloc[q] += gpus
        self._open[q] += gpus * (t - self._origin)
        self._queued[q] -= 1
        self._pending -= 1
        if self._quota[q]:
            self._check_quota(q)
        span = event.get("span")
        if span is not None:
            self._spans[span] = self._spans.get(span, 0) + 1
            if span == event.get("ideal_span"):
                self._tightest += 1
        else:
            self._spanless += 1
        if event.get("backfilled"):
            self._backfilled += 1

    def _stop(self, job: _Job) -> None:
        """End the running attempt of `job` at the current time, freeing its GPUs."""
        t = self._t
        gpus = job.gpus
        gpu_seconds = gpus * (t - job.start)
        self._gpu_seconds += gpu_seconds
        self._queue_seconds[job.queue] += gpu_seconds
        self._frag_area += self._frag * (t - self._frag_t)
        self._frag_t = t
        free, big = self._free, self._big
        whole = self._whole
        for n, c in job.nodes:
            free[n] += c
            if free[n] == big:
                whole += 1
        self._whole = whole
        self._free_total = left = self._free_total + gpus
        self._frag = 1.0 - whole / (left // big) if big and left >= big else 0.0
        self._allocated -= gpus
        self._alloc[job.queue] -= gpus
        self._open[job.queue] -= gpus * (job.start - self._origin)
        job.start, job.gpus, job.nodes = _OFF, 0, []

    def _on_requeue(self, event: Event) -> None:
        kind = event["event"]
        job = self._jobs[event["job"]]
        if job.start != _OFF:
            self._stop(job)
            self._queued[job.queue] += 1
            self._pending += 1
        if kind == "restart":
            self._count["restarts"] += 1
        else:
            self._count["preemptions" if kind == "preempt" else "node_failures"] += 1
            self._lost[kind] += float(event.get("lost_gpu_seconds") or 0.0)
        if self._quota[job.queue]:
            self._check_quota(job.queue)

    def _on_end(self, event: Event) -> None:
        kind = event["event"]
        job = self._jobs.pop(event["job"], None)
        if kind != "finish":
            self._count[_ENDED[kind]] += 1
        if job is None:
            return  # e.g. a reject for a job the log never submitted
        if job.start != _OFF:
            self._stop(job)
        else:
            self._queued[job.queue] -= 1
            self._pending -= 1
        if kind == "finish":
            jct = self._t - job.submit
            self._jcts.append(jct)
            if job.ideal > 0:
                self._rhos.append(jct / job.ideal)
        elif kind == "fail" and event.get("reason") == "time_limit":
            self._count["failed_time_limit"] += 1
        if self._quota[job.queue]:
            self._check_quota(job.queue)

    # ---- integrals ----------------------------------------------------------------------------
    def _check_quota(self, q: int) -> None:
        """Open or close queue q's interval of "below its quota while jobs wait"."""
        below = self._alloc[q] < self._quota[q] and self._queued[q] > 0
        since = self._below_since[q]
        if below and since == _OFF:
            self._below_since[q] = self._t
        elif not below and since != _OFF:
            self._below_seconds[q] += self._t - since
            self._below_since[q] = _OFF

    # ---- results -----------------------------------------------------------------------------
    def _sample(self) -> Sample:
        now = self._t - self._origin
        areas = zip(self._queue_seconds, self._alloc, self._open, strict=True)
        return Sample(now, self._pending_area, [s + a * now - o for s, a, o in areas], self._gpus)

    def series(self) -> Series:
        """Averages between sampled times, the state after the last event, and the JCT quantiles."""
        queues = [(i, name) for i, name in enumerate(self._queue_names) if self._submitted[i]]
        if self._t0 is None:
            return Series([], [], [], {name: [] for _, name in queues}, [])
        now = State(self._pending, list(self._alloc), self._gpus)
        return self._sampler.series(self._sample(), now, queues, self._jcts)

    def summary(self) -> dict[str, Any]:
        """Every measure as plain JSON numbers (see docs/simulator-metrics.md)."""
        start = self._t0 if self._t0 is not None else 0.0
        end = self._t if self._t0 is not None else 0.0
        makespan = end - start
        open_seconds = [0.0] * len(self._queue_names)
        running = 0
        for job in self._jobs.values():
            if job.start != _OFF:
                open_seconds[job.queue] += job.gpus * (end - job.start)
                running += 1
        gpu_seconds = self._gpu_seconds + sum(open_seconds)
        frag_area = self._frag_area + self._frag * (end - self._frag_t) if self._t0 is not None else 0.0
        below = [
            seconds + (end - since if since != _OFF else 0.0)
            for seconds, since in zip(self._below_seconds, self._below_since, strict=True)
        ]
        queues = queue_summary(
            QueueTotals(self._queue_names, self._weight, self._quota, self._submitted),
            [s + o for s, o in zip(self._queue_seconds, open_seconds, strict=True)],
            below,
            makespan,
        )
        with_span = sum(self._spans.values())
        started, finished = with_span + self._spanless, len(self._jcts)
        return {
            "jobs": {"submitted": sum(self._submitted), "started": started, "finished": finished}
            | self._count
            | {"running": running, "pending": len(self._jobs) - running},
            "start": start,
            "end": end,
            "makespan": makespan,
            "cluster_gpus": self._gpus,
            "allocated_gpu_hours": gpu_seconds / 3600.0,
            "gpu_utilisation": gpu_seconds / (self._gpus * makespan) if self._gpus and makespan else 0.0,
            "jct": distribution(self._jcts),
            "queueing_delay": distribution(self._waits),
            "finish_time_fairness": distribution(self._rhos, quantiles=False),
            "jain_fairness": jain(queues),
            "queues": queues,
            "preempted_gpu_hours_lost": self._lost["preempt"] / 3600.0,
            "node_failure_gpu_hours_lost": self._lost["lost"] / 3600.0,
            "topology": {
                "starts_with_span": with_span,
                "tightest": self._tightest,
                "tightest_fraction": self._tightest / with_span if with_span else None,
                "spans": dict(self._spans),
                "backfilled": self._backfilled,
                "levels": list(self._levels),
            },
            "fragmentation": frag_area / makespan if makespan else 0.0,
        }


_ENDED = {"fail": "failed", "cancel": "cancelled", "reject": "rejected"}


def replay_log(path: str | Path) -> Measures:
    """Feed every line of a JSON Lines event log to a fresh `Measures`."""
    measures = Measures()
    feed = measures.feed
    loads = json.loads
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                feed(loads(line))
    return measures


def measures_from_log(path: str | Path) -> dict[str, Any]:
    """The summary of a JSON Lines event log: what any report of that run must print."""
    return replay_log(path).summary()
