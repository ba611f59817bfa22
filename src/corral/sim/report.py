"""A self-contained HTML report comparing simulated runs: a table of measures and embedded figures."""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.sim.report_plots import (
    Runs,
    plot_jct_cdf,
    plot_queue_shares,
    plot_timelines,
    plot_topology,
    policy_colour,
)
from corral.sim.report_series import Series

__all__ = ["Runs", "write_report"]


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the measures table: how to read it from a summary, show it, and which way is better."""

    label: str
    read: Callable[[dict[str, Any]], Any]
    show: Callable[[Any], str]
    better: str = ""  # "low", "high", or "" when neither


def _duration(seconds: float) -> str:
    for size, unit in ((86400.0, "d"), (3600.0, "h"), (60.0, "min")):
        if abs(seconds) >= 2 * size:
            return f"{seconds / size:.2f} {unit}"
    return f"{seconds:.1f} s"


def _percent(x: float) -> str:
    return f"{x * 100:.1f}%"


def _count(x: float) -> str:
    return f"{x:,.0f}"


def _number(x: float) -> str:
    return f"{x:,.3f}"


def _hours(x: float) -> str:
    return f"{x:,.1f}"


def _at(*keys: str) -> Callable[[dict[str, Any]], Any]:
    def read(summary: dict[str, Any]) -> Any:
        value: Any = summary
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    return read


ROWS: list[tuple[str, list[Row]]] = [
    (
        "Jobs",
        [
            Row("submitted", _at("jobs", "submitted"), _count),
            Row("finished", _at("jobs", "finished"), _count, "high"),
            Row("failed (time limit)", _at("jobs", "failed_time_limit"), _count, "low"),
            Row("failed (all)", _at("jobs", "failed"), _count, "low"),
            Row("cancelled", _at("jobs", "cancelled"), _count),
            Row("rejected", _at("jobs", "rejected"), _count, "low"),
            Row(
                "running / pending at the end", _at("jobs"), lambda j: f"{j['running']:,} / {j['pending']:,}"
            ),
        ],
    ),
    (
        "Completion time (finished jobs)",
        [Row(f"JCT {k}", _at("jct", k), _duration, "low") for k in ("mean", "median", "p95", "p99")],
    ),
    (
        "Queueing delay (first start - submit)",
        [
            Row(f"delay {k}", _at("queueing_delay", k), _duration, "low")
            for k in ("mean", "median", "p95", "p99")
        ],
    ),
    (
        "Cluster",
        [
            Row("makespan", _at("makespan"), _duration, "low"),
            Row("GPU utilisation", _at("gpu_utilisation"), _percent, "high"),
            Row("allocated GPU-hours", _at("allocated_gpu_hours"), _hours),
            Row("fragmentation (time average)", _at("fragmentation"), _percent, "low"),
        ],
    ),
    (
        "Fairness",
        [
            Row("Jain's index over queues", _at("jain_fairness"), _number, "high"),
            Row("finish-time fairness ρ mean", _at("finish_time_fairness", "mean"), _number, "low"),
            Row("finish-time fairness ρ max", _at("finish_time_fairness", "max"), _number, "low"),
        ],
    ),
    (
        "Disruption and placement",
        [
            Row("preemptions", _at("jobs", "preemptions"), _count, "low"),
            Row("GPU-hours lost to preemption", _at("preempted_gpu_hours_lost"), _hours, "low"),
            Row("node failures (jobs lost)", _at("jobs", "node_failures"), _count),
            Row("GPU-hours lost to node failures", _at("node_failure_gpu_hours_lost"), _hours, "low"),
            Row("starts in the tightest span", _at("topology", "tightest_fraction"), _percent, "high"),
            Row("backfilled starts", _at("topology", "backfilled"), _count),
        ],
    ),
]


def _cells(row: Row, summaries: list[dict[str, Any]]) -> list[str]:
    values = [row.read(s) for s in summaries]
    known = [v for v in values if v is not None]
    best = None
    if row.better and len(known) > 1 and min(known) != max(known):
        best = min(known) if row.better == "low" else max(known)
    return ["–" if v is None else f"<b>{row.show(v)}</b>" if v == best else row.show(v) for v in values]


def measures_table(runs: Runs) -> str:
    """The key measures, one column per policy, the best of each comparable row in bold."""
    names = list(runs)
    summaries = [runs[n][0] for n in names]
    head = "".join(
        f'<th><span style="color:{policy_colour(i)}">■</span> {html.escape(n)}</th>'
        for i, n in enumerate(names)
    )
    body = []
    for group, rows in ROWS:
        body.append(f'<tr class="group"><th colspan="{len(names) + 1}">{html.escape(group)}</th></tr>')
        for row in rows:
            hint = {"low": " ↓", "high": " ↑"}.get(row.better, "")
            cells = "".join(f"<td>{c}</td>" for c in _cells(row, summaries))
            body.append(f"<tr><th>{html.escape(row.label)}<span class=hint>{hint}</span></th>{cells}</tr>")
    return f'<table class="measures"><tr><th></th>{head}</tr>{"".join(body)}</table>'


def queue_table(runs: Runs) -> str:
    """Per queue: its weight and quota shares, then per policy its share of GPU-hours and starved time."""
    names = list(runs)
    queues: dict[str, dict[str, Any]] = {}
    for summary, _ in runs.values():
        for q, row in summary.get("queues", {}).items():
            if row["submitted"]:
                queues.setdefault(q, row)
    head = "".join(f'<th colspan="2">{html.escape(n)}</th>' for n in names)
    sub = "<th>share</th><th>below quota</th>" * len(names)
    body = []
    for q, row in sorted(queues.items()):
        cells = []
        for n in names:
            mine = runs[n][0]["queues"].get(q)
            share = _percent(mine["share"]) if mine else "–"
            below = _percent(mine["below_quota_fraction"]) if mine and mine["quota"] else "–"
            cells.append(f"<td>{share}</td><td>{below}</td>")
        body.append(
            f"<tr><th>{html.escape(q)}</th><td>{row['weight']:g}</td><td>{_percent(row['weight_share'])}</td>"
            f"<td>{row['quota']}</td><td>{_percent(row['quota_share'])}</td>{''.join(cells)}</tr>"
        )
    columns = ("queue", "weight", "weight share", "quota", "quota share")
    fixed = "".join(f'<th rowspan="2">{h}</th>' for h in columns)
    return f'<table class="queues"><tr>{fixed}{head}</tr><tr class="sub">{sub}</tr>{"".join(body)}</table>'


def _figure(png: str | None, alt: str) -> str:
    if png is None:
        return "<p class=empty>Nothing to plot.</p>"
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{png}">'


STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#222;
max-width:1060px;margin:2em auto;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
p.lead{color:#555;margin-top:0}table{border-collapse:collapse;margin:.5em 0;font-variant-numeric:tabular-nums}
td,th{padding:.25em .7em;border-bottom:1px solid #eee;text-align:right}th{font-weight:600}
table.measures th:first-child,table.queues th:first-child{text-align:left;font-weight:normal}
tr.group th{text-align:left!important;font-weight:600!important;background:#f5f6f8;padding-top:.5em}
table.queues tr.sub th{text-align:right;font-weight:600}th[colspan]{text-align:center}
.hint{color:#999;font-size:.85em}img{max-width:100%;display:block;margin:.5em 0}
.empty{color:#888;font-style:italic}pre{background:#f7f7f7;padding:1em;overflow:auto;font-size:12px}
"""


def render(runs: Runs, title: str) -> str:
    """The report's HTML: standalone, images inline, no scripts."""
    first = next(iter(runs.values()))[0] if runs else {}
    lead = (
        f"{len(runs)} run(s) on a cluster of {first.get('cluster_gpus', 0):,} GPUs, "
        f"{first.get('jobs', {}).get('submitted', 0):,} jobs submitted. "
        "Every number is computed from the runs' event logs as docs/simulator-metrics.md defines it; "
        "↓ lower is better, ↑ higher is better, the best of each such row in bold."
    )
    raw = json.dumps({n: s for n, (s, _) in runs.items()}, indent=1, sort_keys=True)
    sections = [
        ("Key measures", measures_table(runs)),
        ("Queue length and GPU utilisation", _figure(plot_timelines(runs), "pending jobs and utilisation")),
        ("Job completion time", _figure(plot_jct_cdf(runs), "CDF of job completion time")),
        ("Queues: share of the cluster over time", _figure(plot_queue_shares(runs), "GPUs per queue")),
        ("Queues: share of GPU-hours against weight and quota", queue_table(runs)),
        ("Topology", _figure(plot_topology(runs), "placement spans")),
        ("All measures (JSON)", f"<details><summary>show</summary><pre>{html.escape(raw)}</pre></details>"),
    ]
    body = "".join(
        f'<section id="{_anchor(h)}"><h2>{html.escape(h)}</h2>{content}</section>' for h, content in sections
    )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f'<p class="lead">{html.escape(lead)}</p>{body}</body></html>\n'
    )


def _anchor(heading: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in heading.lower()).split())


def write_report(
    out_dir: str | Path, runs: Mapping[str, tuple[dict[str, Any], Series]], title: str = "Corral simulation"
) -> Path:
    """Write `index.html` (and `summary.json`) into `out_dir`; returns the HTML's path."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    page = folder / "index.html"
    page.write_text(render(runs, title), encoding="utf-8")
    summaries = {name: summary for name, (summary, _) in runs.items()}
    (folder / "summary.json").write_text(
        json.dumps(summaries, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return page
