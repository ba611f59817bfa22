"""The report's figures, drawn with matplotlib's Agg canvas and returned as base64 PNG."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from corral.sim.report_series import Series

Runs = Mapping[str, tuple[dict[str, Any], Series]]

POLICY_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
QUEUE_COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7"]
OTHER_COLOUR = "#bab0ac"
_UNITS = [(2 * 86400.0, 86400.0, "days"), (2 * 3600.0, 3600.0, "hours"), (120.0, 60.0, "minutes")]


def time_unit(seconds: float) -> tuple[float, str]:
    """The unit to show a span of `seconds` in: (seconds per unit, name)."""
    return next(((size, name) for above, size, name in _UNITS if seconds >= above), (1.0, "seconds"))


def policy_colour(i: int) -> str:
    return POLICY_COLOURS[i % len(POLICY_COLOURS)]


def _png(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _style(ax: Axes) -> None:
    ax.grid(True, color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def coarsen(t: list[float], values: list[float], points: int = 400) -> tuple[list[float], list[float]]:
    """Merge the intervals of a series into about `points` of equal width (time-weighted averages).

    Entry i of `values` is the average over [t[i], t[i+1]) and the last one the state at t[-1], as in
    `Series`; the result keeps that shape, so areas under the curve do not change.
    """
    if len(t) <= points + 1:
        return t, values
    width = (t[-1] - t[0]) / points
    out_t: list[float] = []
    out_v: list[float] = []
    area = length = 0.0
    for i in range(len(t) - 1):
        if length and math.floor((t[i] - t[0]) / width) > math.floor((out_t[-1] - t[0]) / width):
            out_v.append(area / length)
            area = length = 0.0
        if not length:
            out_t.append(t[i])
        span = t[i + 1] - t[i]
        area += values[i] * span
        length += span
    out_v.append(area / length)
    return [*out_t, t[-1]], [*out_v, values[-1]]


def plot_timelines(runs: Runs) -> str:
    """Pending jobs (top) and GPU utilisation (bottom) over time, one line per policy."""
    longest = max((s.t[-1] for _, s in runs.values() if s.t), default=0.0)
    size, unit = time_unit(longest)
    fig = Figure(figsize=(10, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    for i, (name, (_, series)) in enumerate(runs.items()):
        t, pending = coarsen(series.t, series.pending)
        top.step([x / size for x in t], pending, where="post", color=policy_colour(i), lw=1.2, label=name)
        t, util = coarsen(series.t, [u * 100 for u in series.utilisation])
        bottom.step([x / size for x in t], util, where="post", color=policy_colour(i), lw=1.2, label=name)
    top.set_ylabel("pending jobs")
    bottom.set_ylabel("GPUs allocated (%)")
    bottom.set_ylim(0, 105)
    bottom.set_xlabel(f"time since the first event ({unit})")
    for ax in (top, bottom):
        _style(ax)
    if runs:
        top.legend(loc="upper right", frameon=False)
    return _png(fig)


def plot_jct_cdf(runs: Runs) -> str | None:
    """The CDF of finished jobs' JCT per policy, on a log axis when JCTs span two decades."""
    curves = {name: s.jct_quantiles for name, (_, s) in runs.items() if s.jct_quantiles}
    if not curves:
        return None
    positive = [q for qs in curves.values() for q in qs if q > 0]
    size, unit = time_unit(max(positive, default=1.0))
    log = bool(positive) and max(positive) / min(positive) > 100
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    ax = fig.subplots()
    names = list(runs)
    for name, quantiles in curves.items():
        points = [(q / size, k / (len(quantiles) - 1)) for k, q in enumerate(quantiles) if q > 0 or not log]
        xs, ys = [p[0] for p in points], [p[1] * 100 for p in points]
        ax.plot(xs, ys, color=policy_colour(names.index(name)), linewidth=1.5, label=name)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(f"job completion time ({unit})")
    ax.set_ylabel("finished jobs (%)")
    ax.set_ylim(0, 100)
    _style(ax)
    ax.legend(loc="lower right", frameon=False)
    return _png(fig)


def _top_queues(runs: Runs, keep: int) -> list[str]:
    """The queues with the most GPU-hours over all runs; the rest are drawn as "other"."""
    hours: dict[str, float] = {}
    for summary, _ in runs.values():
        for name, q in summary.get("queues", {}).items():
            hours[name] = hours.get(name, 0.0) + q["gpu_hours"]
    ranked = sorted(hours, key=lambda n: (-hours[n], n))
    return ranked if len(ranked) <= keep + 1 else ranked[:keep]


def plot_queue_shares(runs: Runs, keep: int = len(QUEUE_COLOURS)) -> str | None:
    """Per policy, the cluster's GPUs held by each queue over time (stacked, % of the cluster)."""
    if not runs or not any(s.queue_gpus and s.t for _, s in runs.values()):
        return None
    top = _top_queues(runs, keep)
    colours = {name: QUEUE_COLOURS[i % len(QUEUE_COLOURS)] for i, name in enumerate(top)}
    longest = max((s.t[-1] for _, s in runs.values() if s.t), default=0.0)
    size, unit = time_unit(longest)
    fig = Figure(figsize=(10, 2.3 * len(runs) + 0.8), layout="constrained")
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, (summary, series)) in zip(axes, runs.items(), strict=True):
        gpus = summary.get("cluster_gpus") or 1
        rows, labels, fill = _stack(series, top, colours, gpus)
        if rows:
            t = coarsen(series.t, rows[0])[0]
            rows = [coarsen(series.t, row)[1] for row in rows]
            ax.stackplot([x / size for x in t], rows, labels=labels, colors=fill, step="post")
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of GPUs")
        ax.set_title(name, loc="left", fontsize=10)
        _style(ax)
    axes[-1].set_xlabel(f"time since the first event ({unit})")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right upper", frameon=False)
    return _png(fig)


def _stack(
    series: Series, top: list[str], colours: dict[str, str], gpus: int
) -> tuple[list[list[float]], list[str], list[str]]:
    rows, labels, fill = [], [], []
    for name in top:
        if name in series.queue_gpus:
            rows.append([g * 100 / gpus for g in series.queue_gpus[name]])
            labels.append(name)
            fill.append(colours[name])
    rest = [q for q in series.queue_gpus if q not in colours]
    if rest:
        rows.append([sum(series.queue_gpus[q][k] for q in rest) * 100 / gpus for k in range(len(series.t))])
        labels.append(f"other ({len(rest)})")
        fill.append(OTHER_COLOUR)
    return rows, labels, fill


def plot_topology(runs: Runs) -> str | None:
    """Left: the fraction of starts in the tightest possible span; right: where starts landed."""
    shown = {n: s["topology"] for n, (s, _) in runs.items() if s.get("topology", {}).get("starts_with_span")}
    if not shown:
        return None
    names = list(shown)
    fig = Figure(figsize=(10, 0.5 * len(names) + 1.8), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    fractions = [shown[n]["tightest_fraction"] * 100 for n in names]
    ys = list(range(len(names)))
    left.barh(ys, fractions, color=[policy_colour(list(runs).index(n)) for n in names], height=0.6)
    for y, f in zip(ys, fractions, strict=True):
        inside = f >= 20  # the label in white at the bar's end, else just after it
        x, align, colour = (f - 1.5, "right", "white") if inside else (f + 1.5, "left", "#222")
        left.text(x, y, f"{f:.1f}%", va="center", ha=align, color=colour, fontsize=9)
    left.set_yticks(ys, names)
    left.invert_yaxis()
    left.set_xlim(0, 100)
    left.set_xlabel("starts in the tightest possible span (%)")
    spans = _span_order([span for t in shown.values() for span in t["spans"]], shown)
    starts = [shown[n]["starts_with_span"] for n in names]
    offset = [0.0] * len(names)
    for i, span in enumerate(spans):
        widths = [shown[n]["spans"].get(span, 0) * 100 / k for n, k in zip(names, starts, strict=True)]
        colour = QUEUE_COLOURS[i % len(QUEUE_COLOURS)]
        right.barh(ys, widths, left=offset, height=0.6, color=colour, label=span)
        offset = [o + w for o, w in zip(offset, widths, strict=True)]
    right.set_xlim(0, 100)
    right.set_xlabel("starts by span (%)")
    right.tick_params(labelleft=False)
    fig.legend(loc="outside lower center", ncols=max(1, len(spans)), frameon=False, fontsize=9)
    for ax in (left, right):
        _style(ax)
    return _png(fig)


def _span_order(spans: list[str], shown: Mapping[str, dict[str, Any]]) -> list[str]:
    """Tightest first: nvlink, node, the topology levels from the bottom up, cluster."""
    order = ["nvlink", "node"]
    for topology in shown.values():
        order += [level for level in reversed(topology.get("levels", [])) if level not in order]
    rank = {span: i for i, span in enumerate([*order, "cluster"])}
    return sorted(set(spans), key=lambda s: (rank.get(s, len(order)), s))
