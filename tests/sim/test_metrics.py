"""The measures of sim/metrics.py on hand-built event logs whose answers are worked out by hand."""

from __future__ import annotations

import heapq
import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest

from corral.sim.metrics import Measures, measures_from_log, replay_log
from corral.sim.report_series import Sample, Sampler

Event = dict[str, Any]


def cluster(nodes: dict[str, int], queues: list[tuple[str, float, int]]) -> Event:
    return {
        "event": "cluster",
        "topology": ["leaf"],
        "nodes": [
            {"name": n, "gpus": g, "gpu_model": "V100", "labels": {"leaf": "l1"}} for n, g in nodes.items()
        ],
        "queues": [
            {"name": q, "weight": w, "quota": quota, "limit": None, "cohort": ""} for q, w, quota in queues
        ],
        "priority_classes": {"normal": 100},
    }


def submit(t: float, job: str, queue: str, replicas: int, gpus: int, duration: float | None = None) -> Event:
    event = {"t": t, "event": "submit", "job": job, "queue": queue, "replicas": replicas}
    event.update(gpus_per_replica=gpus, priority=100, priority_class="normal", gpu_model=[])
    event.update(topology={"pack": None, "required": False}, time_limit=None, preemptible=True, user="")
    if duration is not None:
        event["duration"] = duration
    return event


def start(
    t: float, job: str, placement: list[tuple[str, list[int]]], span: str = "node", ideal: str = "node"
) -> Event:
    return {
        "t": t,
        "event": "start",
        "job": job,
        "attempt": 1,
        "placement": [{"node": n, "gpus": g} for n, g in placement],
        "span": span,
        "ideal_span": ideal,
        "backfilled": False,
    }


def end(t: float, kind: str, job: str, **fields: Any) -> Event:
    return {"t": t, "event": kind, "job": job, "attempt": 1, **fields}


def numbered(events: list[Event]) -> list[Event]:
    return [{"seq": i + 1, **e} for i, e in enumerate(events)]


# Two 8-GPU nodes. j1 (queue a) and j2 (queue b) take half a node each at t=0, so the free GPUs
# (4 + 4) could hold one 8-GPU replica with ideal packing but hold none: fragmentation 1 until t=50.
# j3 (a, 8 GPUs) waits from t=10 to t=50 while a holds 4 of its 8 guaranteed GPUs.
SCENARIO_A = numbered(
    [
        cluster({"n1": 8, "n2": 8}, [("a", 2.0, 8), ("b", 1.0, 0)]),
        submit(0, "j1", "a", 1, 4, duration=100),
        submit(0, "j2", "b", 1, 4, duration=50),
        start(0, "j1", [("n1", [0, 1, 2, 3])], span="nvlink", ideal="nvlink"),
        start(0, "j2", [("n2", [0, 1, 4, 5])], span="node", ideal="nvlink"),
        submit(10, "j3", "a", 1, 8, duration=20),
        end(50, "finish", "j2"),
        start(50, "j3", [("n2", list(range(8)))]),
        end(70, "finish", "j3"),
        end(100, "finish", "j1"),
    ]
)

# One 8-GPU node: a preemption, a node failure, a worker restart, a cancel, a reject, a time-limit kill.
SCENARIO_B = numbered(
    [
        cluster({"n1": 8}, [("q", 1.0, 0)]),
        submit(0, "j1", "q", 1, 8),
        start(0, "j1", [("n1", list(range(8)))]),
        submit(5, "j2", "q", 1, 8),
        {"t": 5, "event": "preempting", "job": "j1", "attempt": 1, "by": "j2", "deadline": 15.0},
        end(15, "preempt", "j1", reason="preempted by j2", lost_gpu_seconds=40.0),
        start(15, "j2", [("n1", list(range(8)))]),
        submit(20, "j3", "q", 1, 4),
        end(25, "cancel", "j3"),
        end(30, "lost", "j2", reason="node n1 failed", lost_gpu_seconds=80.0),
        start(30, "j1", [("n1", list(range(8)))]),
        end(40, "restart", "j1", exit_code=1, rank=0),
        start(40, "j1", [("n1", list(range(8)))]),
        end(50, "fail", "j1", reason="time_limit"),
        submit(50, "j4", "q", 2, 8),
        {"t": 55, "event": "reject", "job": "j4", "reason": "can never start"},
        start(60, "j2", [("n1", list(range(8)))]),
        end(80, "finish", "j2"),
    ]
)


def measure(events: list[Event]) -> dict[str, Any]:
    return Measures().feed_all(events).summary()


def test_completion_and_queueing_times() -> None:
    s = measure(SCENARIO_A)
    # JCTs 100, 50, 60; numpy's linear interpolation: p95 = 60 + 0.9 * 40, p99 = 60 + 0.98 * 40
    assert s["jct"] == pytest.approx({"count": 3, "mean": 70.0, "median": 60.0, "p95": 96.0, "p99": 99.2})
    # waits 0, 0, 40
    assert s["queueing_delay"] == pytest.approx(
        {"count": 3, "mean": 40 / 3, "median": 0.0, "p95": 36.0, "p99": 39.2}
    )
    assert s["start"] == 0.0 and s["end"] == 100.0 and s["makespan"] == 100.0


def test_utilisation_counts_each_attempt_from_start_to_end() -> None:
    s = measure(SCENARIO_A)
    assert s["cluster_gpus"] == 16
    assert s["allocated_gpu_hours"] == pytest.approx((400 + 200 + 160) / 3600)  # j1, j2, j3
    assert s["gpu_utilisation"] == pytest.approx(760 / (16 * 100))


def test_queue_shares_quota_time_and_jain() -> None:
    s = measure(SCENARIO_A)
    a, b = s["queues"]["a"], s["queues"]["b"]
    assert a["gpu_hours"] == pytest.approx(560 / 3600) and b["gpu_hours"] == pytest.approx(200 / 3600)
    assert a["share"] == pytest.approx(560 / 760)
    assert (a["weight_share"], b["weight_share"]) == pytest.approx((2 / 3, 1 / 3))
    assert (a["quota_share"], b["quota_share"]) == (1.0, 0.0)
    assert a["below_quota_seconds"] == pytest.approx(40.0)  # t=10..50: 4 of 8 GPUs, j3 waiting
    assert a["below_quota_fraction"] == pytest.approx(0.4)
    assert b["below_quota_seconds"] == 0.0
    x_a, x_b = 560 / 2, 200 / 1  # GPU-seconds over weight
    assert s["jain_fairness"] == pytest.approx((x_a + x_b) ** 2 / (2 * (x_a**2 + x_b**2)))


def test_finish_time_fairness() -> None:
    s = measure(SCENARIO_A)
    # j1: N=1, 4 GPUs of a 16 share: T=100, rho 1. j2: N=2, share 8: T=50, rho 1.
    # j3: N=3, share 16/3 < 8 GPUs: T = 20 * 8 / (16/3) = 30; JCT 60: rho 2.
    assert s["finish_time_fairness"] == pytest.approx({"count": 3, "mean": 4 / 3, "max": 2.0})
    assert measure(SCENARIO_B)["finish_time_fairness"] == {"count": 0, "mean": None, "max": None}


def test_fragmentation_and_topology() -> None:
    s = measure(SCENARIO_A)
    assert s["fragmentation"] == pytest.approx(0.5)  # 1 over t=0..50, 0 after
    assert s["topology"] == {
        "starts_with_span": 3,
        "tightest": 2,
        "tightest_fraction": pytest.approx(2 / 3),
        "spans": {"nvlink": 1, "node": 2},
        "backfilled": 0,
        "levels": ["leaf"],
    }


def test_fragmentation_of_an_idle_mixed_cluster() -> None:
    # 16 free GPUs pack into two 8-GPU replicas, but only one node holds a whole one.
    events = [
        cluster({"big": 8, "s1": 4, "s2": 4}, [("q", 1.0, 0)]),
        submit(0, "j", "q", 1, 1),
        submit(10, "k", "q", 1, 1),
    ]
    assert measure(events)["fragmentation"] == pytest.approx(0.5)


def test_preemption_failure_and_endings() -> None:
    s = measure(SCENARIO_B)
    assert s["jobs"] == {
        "submitted": 4,
        "started": 5,
        "finished": 1,
        "failed": 1,
        "failed_time_limit": 1,
        "cancelled": 1,
        "rejected": 1,
        "preemptions": 1,
        "node_failures": 1,
        "restarts": 1,
        "running": 0,
        "pending": 0,
    }
    # attempts: j1 0..15, j2 15..30, j1 30..40, j1 40..50, j2 60..80; `preempting` ends nothing
    assert s["gpu_utilisation"] == pytest.approx(8 * (15 + 15 + 10 + 10 + 20) / (8 * 80))
    assert s["jct"]["count"] == 1 and s["jct"]["mean"] == 75.0
    assert s["queueing_delay"]["count"] == 2 and s["queueing_delay"]["mean"] == 5.0
    assert s["preempted_gpu_hours_lost"] == pytest.approx(40 / 3600)
    assert s["node_failure_gpu_hours_lost"] == pytest.approx(80 / 3600)
    assert s["fragmentation"] == 0.0


def test_a_summary_mid_run_counts_open_attempts_to_now() -> None:
    up_to_j3_start = SCENARIO_A[:8]
    s = measure(up_to_j3_start)
    assert (s["jobs"]["running"], s["jobs"]["pending"]) == (2, 0)
    assert s["gpu_utilisation"] == pytest.approx((4 * 50 + 4 * 50) / (16 * 50))
    assert s["queues"]["a"]["below_quota_seconds"] == pytest.approx(40.0)
    s = measure(SCENARIO_A[:6])  # j3 just submitted: below quota from t=10, and now is t=10
    assert (s["jobs"]["running"], s["jobs"]["pending"]) == (2, 1)
    assert s["queues"]["a"]["below_quota_seconds"] == 0.0


def test_an_empty_log() -> None:
    s = measure([])
    assert s["makespan"] == 0.0 and s["gpu_utilisation"] == 0.0 and s["jain_fairness"] is None
    assert s["jct"]["mean"] is None and Measures().series().t == []


def test_bad_logs_are_refused() -> None:
    with pytest.raises(ValueError, match="back in time"):
        measure([submit(5, "j", "q", 1, 1), submit(4, "k", "q", 1, 1)])
    with pytest.raises(ValueError, match="unknown or missing"):
        measure([cluster({"n": 8}, []), start(0, "ghost", [("n", [0])])])
    with pytest.raises(ValueError, match="unknown or missing"):
        measure([{"event": "teleport", "t": 0}])


def test_series_of_a_run() -> None:
    series = Measures().feed_all(SCENARIO_A).series()
    assert series.t == [0.0, 10.0, 50.0, 70.0, 100.0]
    assert series.pending == [0, 1, 0, 0, 0]
    assert series.utilisation == [0.5, 0.5, 0.75, 0.25, 0.0]
    assert series.queue_gpus == {"a": [4, 4, 12, 4, 0], "b": [4, 4, 0, 0, 0]}
    assert series.jct_quantiles[0] == 50.0 and series.jct_quantiles[-1] == 100.0
    assert len(series.jct_quantiles) == 1001 and series.jct_quantiles[500] == 60.0


def test_sampler_thins_to_what_a_wider_sampler_keeps() -> None:
    def sampled(sampler: Sampler) -> list[float]:
        sampler.begin(0.0)
        for t in (i * 0.7 for i in range(400)):
            if t >= sampler.next_at:
                sampler.add(Sample(t, 0.0, [], 8))
        return [s.t for s in sampler.samples]

    small = Sampler(capacity=10)
    kept = sampled(small)
    assert len(kept) <= 10 and small.step > 1.0
    assert kept == sampled(Sampler(capacity=10**6, step=small.step))


def test_series_stay_bounded_and_their_averages_exact_on_a_long_run() -> None:
    m = Measures().feed_all(synthetic_events(3000, seed=1))
    series, s = m.series(), m.summary()
    assert 100 < len(series.t) <= 2001
    assert all(a < b for a, b in itertools.pairwise(series.t))
    spans = [b - a for a, b in itertools.pairwise(series.t)]
    gpu_seconds = sum(u * s["cluster_gpus"] * d for u, d in zip(series.utilisation, spans, strict=False))
    assert gpu_seconds == pytest.approx(s["allocated_gpu_hours"] * 3600)
    for name, gpus in series.queue_gpus.items():
        area = sum(g * d for g, d in zip(gpus, spans, strict=False))
        assert area == pytest.approx(s["queues"][name]["gpu_hours"] * 3600)


def test_a_log_file_gives_the_numbers_of_the_stream(tmp_path: Path) -> None:
    events = synthetic_events(2000, seed=7)
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    streamed = Measures()
    for e in events:
        streamed.feed(e)
    assert measures_from_log(path) == streamed.summary()
    assert replay_log(path).series() == streamed.series()
    assert json.loads(json.dumps(streamed.summary())) == streamed.summary()  # plain JSON


def synthetic_events(jobs: int, seed: int = 0, nodes: int = 16, preempt: float = 0.05) -> list[Event]:
    """A tiny FIFO simulator's log: Poisson arrivals, gangs placed first fit, some preemptions.

    Keeps the log order of DESIGN.md 4.6: at equal t, endings, then submissions, then starts.
    """
    rng = random.Random(seed)
    free = {f"n{i:03}": list(range(8)) for i in range(nodes)}
    queues = [("prod", 2.0, 32), ("research", 1.0, 16), ("batch", 1.0, 0)]
    out: list[Event] = [cluster(dict.fromkeys(free, 8), queues)]
    shapes = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8)]
    arrivals = [(t := 0.0)] + [t := t + rng.expovariate(1 / 400.0) for _ in range(jobs - 1)]
    ends: list[tuple[float, str, int]] = []
    pending: list[str] = []
    spec: dict[str, tuple[int, int, float]] = {}
    placed: dict[str, list[tuple[str, list[int]]]] = {}
    i = 0
    while i < len(arrivals) or ends:
        now = min(arrivals[i] if i < len(arrivals) else float("inf"), ends[0][0] if ends else float("inf"))
        while ends and ends[0][0] == now:
            _, job, attempt = heapq.heappop(ends)
            for node, gpus in placed.pop(job):
                free[node].extend(gpus)
            kind = "preempt" if rng.random() < preempt else "finish"
            out.append({"t": now, "event": kind, "job": job, "attempt": attempt, "lost_gpu_seconds": 10.0})
            if kind == "preempt":
                pending.append(job)
        while i < len(arrivals) and arrivals[i] == now:
            job, (replicas, gpr) = f"j{i}", rng.choice(shapes)
            spec[job] = (replicas, gpr, float(rng.randint(60, 20000)))
            out.append(submit(now, job, queues[i % 3][0], replicas, gpr, duration=spec[job][2]))
            pending.append(job)
            i += 1
        while pending and (placement := _first_fit(free, *spec[pending[0]][:2])):
            job = pending.pop(0)
            placed[job] = placement
            span = "node" if len({n for n, _ in placement}) == 1 else "cluster"
            out.append(start(now, job, placement, span, "node" if spec[job][0] == 1 else "cluster"))
            heapq.heappush(ends, (now + spec[job][2], job, 1))
    return numbered(out)


def _first_fit(free: dict[str, list[int]], replicas: int, gpus: int) -> list[tuple[str, list[int]]] | None:
    room = {n: len(g) for n, g in free.items()}
    chosen = []
    for _ in range(replicas):
        node = next((n for n, c in room.items() if c >= gpus), None)
        if node is None:
            return None
        room[node] -= gpus
        chosen.append(node)
    placement = []
    for node in chosen:
        free[node].sort()
        placement.append((node, free[node][:gpus]))
        del free[node][:gpus]
    return placement
