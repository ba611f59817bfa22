"""The shadow replay's comparison: two event logs (DESIGN.md 4.6) of the same trace, one from
`corral simulate` and one from a live control plane, compared decision by decision.

For every job that started in both logs: its first placement (exact GPUs, and the set of
nodes), its rank in the order of first starts, and its wait (first start - submit). Times are
seconds; the live log's are taken from `origin` (the wall time the trace's t = 0 was submitted
at), and its job ids are mapped to the trace's by `names` (server id -> trace id).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from corral.fleet.stats import percentile

Placement = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class FirstStart:
    submit: float
    start: float
    rank: int  # in the order of first starts (by seq)
    placement: Placement
    # per node of the placement, (its free GPUs just before, GPUs taken), sorted: two placements
    # with the same shape are equally good to the core (ties between such nodes are broken by
    # the order they entered their free-count bucket, i.e. by history, not by state)
    shape: tuple[tuple[int, int], ...]

    @property
    def wait(self) -> float:
        return self.start - self.submit

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(node for node, _ in self.placement)


ENDINGS = ("finish", "fail", "preempt", "lost", "restart", "cancel")


def first_starts(
    events: Iterable[Mapping[str, Any]], names: Mapping[str, str] | None = None, origin: float = 0.0
) -> dict[str, FirstStart]:
    """Each job's first start: job id (renamed by `names` when given; others dropped) -> FirstStart."""
    submits: dict[str, float] = {}
    out: dict[str, FirstStart] = {}
    free: dict[str, int] = {}
    held: dict[tuple[str, int], list[tuple[str, int]]] = {}  # live attempt -> (node, GPUs) per entry
    for e in sorted(events, key=lambda e: e["seq"]):
        kind, job = e["event"], e.get("job")
        if kind == "cluster":
            free.update({n["name"]: n["gpus"] for n in e["nodes"] if n["name"] not in free})
        elif kind in ENDINGS:
            for node, gpus in held.pop((str(job), int(e.get("attempt") or 0)), []):
                free[node] += gpus
        if job is None or kind not in ("submit", "start"):
            continue
        key = names.get(job) if names is not None else job
        if kind == "start":
            taken = [(p["node"], len(p["gpus"])) for p in e["placement"]]
            per_node: dict[str, int] = {}
            for node, gpus in taken:
                per_node[node] = per_node.get(node, 0) + gpus
            shape = tuple(sorted((free.get(node, 0), gpus) for node, gpus in per_node.items()))
            for node, gpus in taken:
                free[node] = free.get(node, 0) - gpus
            held[(job, e["attempt"])] = taken
            if key is not None and key not in out and key in submits:
                placement = tuple((p["node"], tuple(p["gpus"])) for p in e["placement"])
                out[key] = FirstStart(submits[key], e["t"] - origin, len(out), placement, shape)
        elif key is not None:
            submits[key] = e["t"] - origin
    return out


def live_timing(
    events: Iterable[Mapping[str, Any]], names: Mapping[str, str], origin: float
) -> dict[str, tuple[float, float]]:
    """Job -> (submit, run time of its first attempt) as a live log shows them: what the simulator
    needs to replay the live run's timing (the timed replay). The run time is from the attempt's
    start to its ending as the scheduler recorded both, so it includes the latencies of the start
    order, of the agent's exit report and of the cycle that took the report in."""
    submit: dict[str, float] = {}
    started: dict[str, float] = {}
    out: dict[str, tuple[float, float]] = {}
    for e in sorted(events, key=lambda e: e["seq"]):
        key = names.get(e.get("job") or "")
        if key is None:
            continue
        if e["event"] == "submit":
            submit[key] = e["t"] - origin
        elif e["event"] == "start" and e.get("attempt") == 1:
            started[key] = e["t"]
        elif e.get("attempt") == 1 and key in started and key not in out and key in submit:
            out[key] = (submit[key], e["t"] - started[key])
    return out


@dataclass(frozen=True, slots=True)
class Comparison:
    jobs: int  # started in both logs
    only_sim: int  # started in the simulator's log only
    only_live: int
    same_placement: float  # fraction with the same first placement (node and GPU indices)
    same_nodes: float  # fraction with the same set of nodes
    same_shape: float  # fraction with placements equally good to the core (same `FirstStart.shape`)
    identical_prefix: int  # first starts identical (job, order and placement) before the first difference
    rank_correlation: float  # Spearman's rho of the order of first starts
    displacement_p90: float  # |rank in one log - rank in the other|, 90th percentile
    waited_sim: int  # jobs that waited more than the tolerance
    waited_live: int
    wait_mean_sim: float
    wait_mean_live: float
    wait_diff_mean: float  # live - simulator, seconds
    wait_diff_p50: float  # |live - simulator|, seconds
    wait_diff_p90: float
    wait_diff_p99: float
    wait_diff_max: float
    same_placement_unwaited: float  # among jobs that waited in neither log
    same_placement_waited: float  # among jobs that waited in either
    on_arrival_latency_p50: float  # live wait of the jobs that did not wait in the simulator
    on_arrival_latency_p99: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(sim: Mapping[str, FirstStart], live: Mapping[str, FirstStart], tolerance: float) -> Comparison:
    """Compare the first starts of the same jobs in two logs; a wait up to `tolerance` s is none."""
    common = sorted(set(sim) & set(live), key=lambda k: sim[k].rank)
    n = len(common)
    live_order = sorted(common, key=lambda k: live[k].rank)
    live_rank = {k: i for i, k in enumerate(live_order)}
    prefix = 0
    for i, k in enumerate(common):
        if live_order[i] != k or live[k].placement != sim[k].placement:
            break
        prefix = i + 1
    moved = [abs(i - live_rank[k]) for i, k in enumerate(common)]
    rho = 1 - 6 * sum(d * d for d in moved) / (n * (n * n - 1)) if n > 1 else math.nan
    diffs = [live[k].wait - sim[k].wait for k in common]
    waited = {k for k in common if sim[k].wait > tolerance or live[k].wait > tolerance}
    calm = [k for k in common if k not in waited]
    on_arrival = [live[k].wait for k in common if sim[k].wait <= tolerance]

    def same(keys: list[str] | set[str]) -> float:
        return sum(live[k].placement == sim[k].placement for k in keys) / len(keys) if keys else math.nan

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else math.nan

    absolute = [abs(d) for d in diffs]
    return Comparison(
        jobs=n, only_sim=len(set(sim) - set(live)), only_live=len(set(live) - set(sim)),
        same_placement=same(common), same_nodes=mean([float(live[k].nodes == sim[k].nodes) for k in common]),
        same_shape=mean([float(live[k].shape == sim[k].shape) for k in common]),
        identical_prefix=prefix, rank_correlation=rho,
        displacement_p90=percentile([float(m) for m in moved], 90),
        waited_sim=sum(sim[k].wait > tolerance for k in common),
        waited_live=sum(live[k].wait > tolerance for k in common),
        wait_mean_sim=mean([sim[k].wait for k in common]),
        wait_mean_live=mean([live[k].wait for k in common]),
        wait_diff_mean=mean(diffs), wait_diff_p50=percentile(absolute, 50),
        wait_diff_p90=percentile(absolute, 90),
        wait_diff_p99=percentile(absolute, 99), wait_diff_max=max(absolute, default=math.nan),
        same_placement_unwaited=same(calm), same_placement_waited=same(waited),
        on_arrival_latency_p50=percentile(on_arrival, 50), on_arrival_latency_p99=percentile(on_arrival, 99),
    )  # fmt: skip


LABELS = {
    "jobs": "jobs started in both logs",
    "only_sim": "started only in the simulator",
    "only_live": "started only live",
    "same_placement": "same first placement (nodes and GPUs)",
    "same_nodes": "same set of nodes",
    "same_shape": "equally good placement (same free GPUs on the nodes taken)",
    "identical_prefix": "first starts identical before the first difference",
    "rank_correlation": "rank correlation of the start order (Spearman)",
    "displacement_p90": "start-order displacement p90 (ranks)",
    "waited_sim": "jobs that waited (simulator)",
    "waited_live": "jobs that waited (live)",
    "wait_mean_sim": "mean wait, simulator",
    "wait_mean_live": "mean wait, live",
    "wait_diff_mean": "wait difference live - simulator, mean",
    "wait_diff_p50": "|wait difference| p50",
    "wait_diff_p90": "|wait difference| p90",
    "wait_diff_p99": "|wait difference| p99",
    "wait_diff_max": "|wait difference| max",
    "same_placement_unwaited": "same placement, jobs that waited in neither",
    "same_placement_waited": "same placement, jobs that waited in either",
    "on_arrival_latency_p50": "live wait of jobs the simulator started at once, p50",
    "on_arrival_latency_p99": "live wait of jobs the simulator started at once, p99",
}
SECONDS = {k for k in LABELS if k.startswith(("wait_", "on_arrival"))}


def table(columns: Mapping[str, Comparison], scale: float = 1.0) -> str:
    """Figures side by side, one column per comparison; seconds also as trace seconds (x scale)."""
    names = list(columns)
    rows = [["figure", *names]]
    for key, label in LABELS.items():
        cells = [
            label + (" (s; trace s)" if key in SECONDS and scale != 1 else " (s)" if key in SECONDS else "")
        ]
        for name in names:
            value = getattr(columns[name], key)
            cells.append(_fmt(value, key, scale))
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: float, key: str, scale: float) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value):
        return "-"
    if key in SECONDS:
        return f"{value:.3f}" + (f" ({value * scale:,.0f})" if scale != 1 else "")
    if key.startswith("same_"):
        return f"{100 * value:.1f} %"
    return f"{value:.3f}"
