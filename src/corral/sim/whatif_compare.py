"""What-if figures: per queue and overall, for the baseline and the proposed replay, their
difference, and the baseline's fidelity against what happened live (`corral whatif`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from corral.sim.whatif import OVERALL, Run, mean, p99

# (key, label, format, which way is better)
MEASURES: tuple[tuple[str, str, str, str], ...] = (
    ("jobs", "jobs", "{:,.0f}", ""),
    ("avg_wait", "avg wait (s)", "{:,.1f}", "low"),
    ("p99_wait", "p99 wait (s)", "{:,.1f}", "low"),
    ("avg_jct", "avg JCT (s)", "{:,.1f}", "low"),
    ("p99_jct", "p99 JCT (s)", "{:,.1f}", "low"),
    ("gpu_hours", "GPU-hours used", "{:,.2f}", ""),
    ("quota_gpu_hours", "GPU-hours of quota", "{:,.2f}", ""),
    ("fair_share_gpu_hours", "GPU-hours of fair share", "{:,.2f}", ""),
    ("below_quota_hours", "hours below quota with demand", "{:,.3f}", "low"),
    ("preemptions", "preemptions", "{:,.0f}", "low"),
    ("lost_gpu_hours", "GPU-hours lost to preemption", "{:,.3f}", "low"),
    ("utilisation", "utilisation", "{:.1%}", ""),
)
TOLERANCE = 0.10  # the bar: per queue, average wait within 10 % of live


def _queue_figures(run: Run, queue: str, summary: Mapping[str, Any], q: Mapping[str, Any]) -> dict[str, Any]:
    makespan = float(summary.get("makespan") or 0.0)
    gpus = float(summary.get("cluster_gpus") or 0.0)
    total_hours = float(summary.get("allocated_gpu_hours") or 0.0)
    f = run.queues
    waits, jcts = f.waits.get(queue, []), f.jcts.get(queue, [])
    hours = float(q.get("gpu_hours") or 0.0)
    return {
        "jobs": int(q.get("submitted") or 0),
        "avg_wait": mean(waits),
        "p99_wait": p99(waits),
        "avg_jct": mean(jcts),
        "p99_jct": p99(jcts),
        "gpu_hours": hours,
        "quota_gpu_hours": float(q.get("quota") or 0) * makespan / 3600.0,
        "fair_share_gpu_hours": float(q.get("weight_share") or 0.0) * total_hours,
        "below_quota_hours": float(q.get("below_quota_seconds") or 0.0) / 3600.0,
        "preemptions": f.preemptions.get(queue, 0),
        "lost_gpu_hours": f.lost.get(queue, 0.0) / 3600.0,
        "utilisation": hours * 3600.0 / (gpus * makespan) if gpus and makespan else 0.0,
    }


def figures(run: Run) -> dict[str, dict[str, Any]]:
    """Per queue with jobs, then `(all)`: the measures of MEASURES."""
    summary = run.summary()
    queues = summary.get("queues", {})
    out = {name: _queue_figures(run, name, summary, q) for name, q in queues.items() if q.get("submitted")}
    f = run.queues
    waits = [w for ws in f.waits.values() for w in ws]
    jcts = [j for js in f.jcts.values() for j in js]
    out[OVERALL] = {
        "jobs": sum(v["jobs"] for v in out.values()),
        "avg_wait": mean(waits),
        "p99_wait": p99(waits),
        "avg_jct": mean(jcts),
        "p99_jct": p99(jcts),
        "gpu_hours": float(summary.get("allocated_gpu_hours") or 0.0),
        "quota_gpu_hours": sum(v["quota_gpu_hours"] for v in out.values()),
        "fair_share_gpu_hours": float(summary.get("allocated_gpu_hours") or 0.0),
        "below_quota_hours": sum(v["below_quota_hours"] for v in out.values()),
        "preemptions": sum(f.preemptions.values()),
        "lost_gpu_hours": sum(f.lost.values()) / 3600.0,
        "utilisation": float(summary.get("gpu_utilisation") or 0.0),
    }
    return out


def difference(
    base: Mapping[str, Mapping[str, Any]], prop: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    out: dict[str, dict[str, Any]] = {}
    for queue in base.keys() | prop.keys():
        b, p = base.get(queue, {}), prop.get(queue, {})
        out[queue] = {
            k: (p[k] - b[k])
            if isinstance(b.get(k), int | float) and isinstance(p.get(k), int | float)
            else None
            for k, *_ in MEASURES
        }
    return out


def live_waits(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Per queue, the waits observed live (jobs that started), from the export's `live_wait`."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if r.get("live_wait") is not None:
            out.setdefault(str(r.get("queue") or ""), []).append(float(r["live_wait"]))
    return out


def fidelity(rows: Sequence[Mapping[str, Any]], baseline: Run, latency: float) -> dict[str, Any]:
    """Per queue and overall: average wait live against the baseline's. Within: 10 % of live, or
    no more than the live system's own latency, which the replay does not have: `latency` (the
    p90 over all jobs the replay starts at once) or that queue's own such jobs' mean live wait."""
    live = live_waits(rows)
    own = _own_latency(rows, baseline)
    out: dict[str, Any] = {"queues": {}, "tolerance": TOLERANCE, "latency_s": latency}
    worst = 0.0
    for queue, waits in [*sorted(live.items()), (OVERALL, [w for ws in live.values() for w in ws])]:
        replayed_all = (
            [w for ws in baseline.queues.waits.values() for w in ws]
            if queue == OVERALL
            else baseline.queues.waits.get(queue, [])
        )
        lv, rv = mean(waits), mean(replayed_all)
        if lv is None or rv is None:
            continue
        diff = rv - lv
        error = abs(diff) / lv if lv > 0 else None  # None: no live wait to be a fraction of
        allowed = max(latency, own.get(queue, 0.0))
        within = (error is not None and error <= TOLERANCE) or abs(diff) <= allowed
        if queue != OVERALL and error is not None:
            worst = max(worst, error)
        out["queues"][queue] = {
            "live_avg_wait": lv,
            "replayed_avg_wait": rv,
            "difference_s": diff,
            "error": error,
            "latency_s": allowed,
            "within": within,
            "jobs": len(waits),
        }
    out["worst_error"] = worst
    out["all_within"] = all(v["within"] for v in out["queues"].values())
    return out


def _at_once(rows: Sequence[Mapping[str, Any]], baseline: Run) -> list[tuple[str, float]]:
    """(queue, live wait) of the jobs the replay starts the moment they arrive."""
    return [
        (str(r.get("queue") or ""), float(r["live_wait"]))
        for r in rows
        if r.get("live_wait") is not None and baseline.queues.wait_of.get(str(r["job_id"]), 1.0) <= 1e-9
    ]


def _own_latency(rows: Sequence[Mapping[str, Any]], baseline: Run) -> dict[str, float]:
    found: dict[str, list[float]] = {}
    for queue, wait in _at_once(rows, baseline):
        found.setdefault(queue, []).append(wait)
        found.setdefault(OVERALL, []).append(wait)
    return {q: sum(w) / len(w) for q, w in found.items()}


def start_latency(rows: Sequence[Mapping[str, Any]], baseline: Run) -> float:
    """What the live system adds to a wait that the replay does not have (cycle spacing, the
    agents' start latency): among the jobs the replay starts the moment they arrive, the p90 of
    their live waits (0 when there is none)."""
    at_once = sorted(wait for _, wait in _at_once(rows, baseline))
    return at_once[int(0.9 * (len(at_once) - 1))] if at_once else 0.0


def headline(fid: Mapping[str, Any]) -> str:
    """One line for the top of the output and the evidence: how far to trust the difference."""
    queues = {k: v for k, v in fid["queues"].items() if k != OVERALL}
    if not queues:
        return "fidelity: no job started live in the window; the baseline cannot be checked"
    name, worst = max(queues.items(), key=lambda kv: abs(kv[1]["difference_s"]))
    overall = fid["queues"].get(OVERALL)
    verdict = "within" if fid["all_within"] else "NOT within"
    text = (
        f"fidelity: baseline average wait per queue {verdict} 10 % of live (or {fid['latency_s']:.3g} s, "
        f"the live system's own latency); worst {name}: live {worst['live_avg_wait']:.3g} s, "
        f"replayed {worst['replayed_avg_wait']:.3g} s"
    )
    if overall is not None:
        text += (
            f"; all queues: live {overall['live_avg_wait']:.3g} s,"
            f" replayed {overall['replayed_avg_wait']:.3g} s"
        )
    return text
