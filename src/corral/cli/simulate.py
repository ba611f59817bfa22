"""`corral simulate` and `corral trace convert`: replay traces through the core, compare policies."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corral.config.cluster_file import ClusterConfig
from corral.core.errors import ConfigError
from corral.core.plugins import Profile
from corral.policies.registry import POLICIES, load_policy, parse_plugin_args, plugins_of
from corral.sim.engine import SimOptions, SimStats, Simulation
from corral.sim.eventlog import EventLog, JsonLinesSink, Sink
from corral.sim.metrics import Measures
from corral.sim.trace import TraceJob


def run_policy(
    cfg: ClusterConfig,
    jobs: Sequence[TraceJob],
    profile: Profile,
    options: SimOptions,
    events_out: Path | None = None,
    progress: bool = False,
) -> tuple[Measures, SimStats]:
    """One simulation: its measures (fed from the event log as it is written) and its statistics."""
    measures = Measures()
    sinks: list[Sink] = [measures.feed]
    writer = JsonLinesSink(events_out) if events_out is not None else None
    if writer is not None:
        sinks.append(writer)
    sim = Simulation(cfg, jobs, profile, EventLog(sinks), options)
    try:
        stats = _with_progress(sim, profile.name) if progress else sim.run()
    finally:
        if writer is not None:
            writer.close()
    return measures, stats


def _with_progress(sim: Simulation, name: str) -> SimStats:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(f"{name}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} jobs"),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task(name, total=len(sim.arrivals))
        sim.on_progress = lambda done: bar.update(task, completed=done)
        return sim.run()


def events_path(base: Path | None, policy: str, several: bool) -> Path | None:
    """`--events-out E.jsonl` for one policy; `E.<policy>.jsonl` for each of several."""
    if base is None or not several:
        return base
    return base.with_name(f"{base.stem}.{policy}{base.suffix or '.jsonl'}")


ROWS: list[tuple[str, tuple[str, ...], str]] = [
    ("jobs finished", ("jobs", "finished"), "{:.0f}"),
    ("jobs rejected", ("jobs", "rejected"), "{:.0f}"),
    ("avg JCT (s)", ("jct", "mean"), "{:,.0f}"),
    ("median JCT (s)", ("jct", "median"), "{:,.0f}"),
    ("p95 JCT (s)", ("jct", "p95"), "{:,.0f}"),
    ("p99 JCT (s)", ("jct", "p99"), "{:,.0f}"),
    ("avg queueing (s)", ("queueing_delay", "mean"), "{:,.0f}"),
    ("p99 queueing (s)", ("queueing_delay", "p99"), "{:,.0f}"),
    ("makespan (s)", ("makespan",), "{:,.0f}"),
    ("GPU utilisation", ("gpu_utilisation",), "{:.1%}"),
    ("Jain fairness", ("jain_fairness",), "{:.3f}"),
    ("finish-time fairness mean", ("finish_time_fairness", "mean"), "{:.2f}"),
    ("finish-time fairness max", ("finish_time_fairness", "max"), "{:.1f}"),
    ("preemptions", ("jobs", "preemptions"), "{:.0f}"),
    ("jobs failed at their time limit", ("jobs", "failed_time_limit"), "{:.0f}"),
    ("GPU-hours lost to preemption", ("preempted_gpu_hours_lost",), "{:,.1f}"),
    ("attempts lost to node failures", ("jobs", "node_failures"), "{:.0f}"),
    ("placed in tightest topology", ("topology", "tightest_fraction"), "{:.1%}"),
    ("fragmentation", ("fragmentation",), "{:.3f}"),
]


def cell(summary: dict[str, Any], path: tuple[str, ...], fmt: str) -> str:
    value: Any = summary
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return "-" if value is None else fmt.format(value)


def print_table(summaries: dict[str, dict[str, Any]], stats: dict[str, SimStats]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("measure", *summaries)
    for label, path, fmt in ROWS:
        table.add_row(label, *(cell(s, path, fmt) for s in summaries.values()))
    table.add_row("cycles", *(f"{stats[p].cycles:,}" for p in summaries))
    console = Console()
    console.print(table)
    rules = next(iter(stats.values())).time_limit_rules
    note = "; sjf orders by TRUE durations: an oracle bound, not a real policy" if "sjf" in summaries else ""
    console.print("time limits: " + ", ".join(f"{n} from {rule}" for rule, n in rules.items() if n) + note)


def simulate(
    cfg: ClusterConfig,
    jobs: Sequence[TraceJob],
    policies: Sequence[str],
    options: SimOptions,
    events_out: Path | None,
    report: Path | None,
    as_json: bool,
    plugin_args: Sequence[str] = (),
) -> dict[str, dict[str, Any]]:
    """Run each policy, print the comparison (table or JSON), write the report; return the summaries.

    `plugin_args` (`PLUGIN.KEY=VALUE`) go to every policy that uses the plugin."""
    args = parse_plugin_args(list(plugin_args))
    known = {name: plugins_of(name) for name in policies if name in POLICIES}
    unused = sorted(set(args) - set().union(*known.values())) if known else []
    if unused and len(known) == len(policies):
        raise ConfigError(
            f"no policy given uses plugin {', '.join(unused)}",
            where="--arg",
            fix="its plugins are: " + ", ".join(sorted(set().union(*known.values()))),
        )
    profiles = [  # fail on a bad name or argument before any run
        load_policy(name, {k: v for k, v in args.items() if k in known.get(name, set())}) for name in policies
    ]
    several = len(profiles) > 1
    summaries: dict[str, dict[str, Any]] = {}
    stats: dict[str, SimStats] = {}
    runs: dict[str, Measures] = {}
    progress = sys.stderr.isatty() and not as_json
    for profile in profiles:
        out = events_path(events_out, profile.name, several)
        measures, stat = run_policy(cfg, jobs, profile, options, out, progress)
        summaries[profile.name] = measures.summary()
        stats[profile.name] = stat
        runs[profile.name] = measures
    if report is not None:
        from corral.sim.report import write_report

        write_report(
            report, {name: (summaries[name], m.series()) for name, m in runs.items()}, title=cfg.name
        )
    if as_json:
        shown = summaries[policies[0]] if not several else summaries
        print(json.dumps(shown, indent=2, default=float))
    else:
        print_table(summaries, stats)
    return summaries
