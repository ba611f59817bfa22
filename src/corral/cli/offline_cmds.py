"""Commands that need no server: the version, cluster files, policies, planning, simulation and
traces. Imports stay inside the commands, so `corral --help` loads nothing heavy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.cli.root import app

cluster_app = typer.Typer(help="Cluster files: check one before you use it.", no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")

EXIT_REJECTED = 1
EXIT_BAD_INPUT = 2


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _load_cluster(path: Path) -> Any:
    from corral.config.cluster_file import load_cluster_file
    from corral.core.errors import ConfigError

    try:
        return load_cluster_file(path)
    except ConfigError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror}")


@app.command()
def version() -> None:
    """Print Corral's version, and whether its scheduling core runs compiled or interpreted."""
    from corral import __version__, native

    core = "compiled" if native.active() else "interpreted; python -m corral.build_native compiles it"
    typer.echo(f"{__version__} (core: {core})")


@cluster_app.command("check")
def cluster_check(
    path: Annotated[Path, typer.Argument(help="cluster file (YAML)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Validate a cluster file and summarise it: nodes, GPUs, levels, queues."""
    cfg = _load_cluster(path)
    summary = {
        "name": cfg.name,
        "topology": list(cfg.topology),
        "nodes": len(cfg.nodes),
        "gpus": sum(n.gpus for n in cfg.nodes),
        "gpu_models": sorted({n.gpu_model for n in cfg.nodes if n.gpu_model}),
        "queues": [
            {"name": q.name, "weight": q.weight, "quota": q.quota, "limit": q.limit, "cohort": q.cohort}
            for q in cfg.queues
        ],
    }
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(
        f"[bold]{cfg.name}[/bold]: {summary['nodes']} nodes, {summary['gpus']} GPUs "
        f"({', '.join(summary['gpu_models']) or 'no model'}), levels: {' > '.join(cfg.topology) or 'none'}"
    )
    table = Table("queue", "weight", "quota", "limit", "cohort")
    for q in cfg.queues:
        table.add_row(
            q.name, f"{q.weight:g}", str(q.quota), "-" if q.limit is None else str(q.limit), q.cohort or "-"
        )
    console.print(table)


@app.command()
def policies() -> None:
    """List the built-in scheduling policies."""
    from corral.policies.registry import POLICIES

    for name, spec in sorted(POLICIES.items()):
        typer.echo(f"{name:8} {spec['description']}")


@app.command()
def plan(
    jobs: Annotated[list[Path], typer.Argument(help="job spec files (YAML), submitted in this order")],
    cluster: Annotated[Path, typer.Option("--cluster", "-c", help="cluster file (YAML)")],
    policy: Annotated[str, typer.Option(help="scheduling policy (see `corral policies`)")] = "default",
    as_json: Annotated[bool, typer.Option("--json", help="print decisions as JSON")] = False,
) -> None:
    """Dry run: what one scheduling cycle would do with these jobs on an empty cluster.

    Like `sbatch --test-only`: each job starts (with its placement), waits (with the reason),
    or is rejected because it can never fit.
    """
    from corral.cli.planning import plan_jobs
    from corral.core.errors import ConfigError

    cfg = _load_cluster(cluster)
    try:
        rows = plan_jobs(cfg, jobs, policy)
    except ConfigError as exc:
        _fail(str(exc))
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table("job", "decision", "placement or reason")
        for row in rows:
            detail = (
                " ".join(f"{p['node']}:{','.join(map(str, p['gpus']))}" for p in row["placement"])
                if row["placement"]
                else row["reason"]
            )
            table.add_row(row["id"], row["state"], detail)
        Console(width=160).print(table)
    if any(r["state"] == "rejected" for r in rows):
        raise typer.Exit(EXIT_REJECTED)


@app.command()
def simulate(
    cluster: Annotated[Path, typer.Option("--cluster", "-c", help="cluster file (YAML)")],
    trace: Annotated[
        Path, typer.Option("--trace", "-t", help="trace in the common CSV form (`corral trace convert`)")
    ],
    policy: Annotated[
        list[str] | None, typer.Option("--policy", "-p", help="policy; repeat to compare")
    ] = None,
    events_out: Annotated[Path | None, typer.Option(help="write the event log (JSON Lines) here")] = None,
    report: Annotated[
        Path | None, typer.Option(help="write an HTML report with plots into this folder")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the measures as JSON")] = False,
    min_interval: Annotated[float, typer.Option(help="seconds between scheduling cycles, at least")] = 0.0,
    node_mtbf: Annotated[float | None, typer.Option(help="mean seconds between failures of a node")] = None,
    node_repair: Annotated[float, typer.Option(help="seconds a failed node stays down")] = 3600.0,
    restart_overhead: Annotated[
        float, typer.Option(help="seconds of extra run time after a preemption")
    ] = 30.0,
    checkpoint_interval: Annotated[
        float | None,
        typer.Option(help="seconds of work between checkpoints for jobs whose trace gives none"),
    ] = None,
    slowdown: Annotated[
        str, typer.Option(help="run-time penalties for spreading: NVLINK,NODES,LEVEL (fractions)")
    ] = "0.05,0.15,0.10",
    seed: Annotated[int, typer.Option(help="seed of the random node failures")] = 0,
    arg: Annotated[
        list[str] | None,
        typer.Option(
            "--arg", help="a plugin argument PLUGIN.KEY=VALUE (repeat), for each policy using the plugin"
        ),
    ] = None,
) -> None:
    """Replay a trace through the scheduling core on a virtual clock; compare policies side by side."""
    from corral.cli.simulate import simulate as run
    from corral.core.errors import ConfigError, TraceError
    from corral.sim.engine import SimOptions
    from corral.sim.jobmodel import PreemptionCost, Slowdown
    from corral.sim.trace import read_trace

    cfg = _load_cluster(cluster)
    try:
        penalties = [float(x) for x in slowdown.split(",")]
        if len(penalties) != 3:
            raise ValueError
        options = SimOptions(
            min_interval=min_interval,
            slowdown=Slowdown(*penalties),
            preemption=PreemptionCost(restart_overhead, checkpoint_interval),
            node_mtbf=node_mtbf,
            node_repair=node_repair,
            seed=seed,
        )
    except ValueError as exc:
        if "checkpoint interval" in str(exc):
            _fail(f"--restart-overhead / --checkpoint-interval: {exc}")
        _fail(f"--slowdown {slowdown!r}: give three fractions, e.g. 0.05,0.15,0.10")
    if min_interval < 0 or (node_mtbf is not None and node_mtbf <= 0):
        _fail("--min-interval must be >= 0 and --node-mtbf > 0")
    try:
        jobs = read_trace(trace, largest_node_gpus=cfg.largest_node_gpus)
        run(cfg, jobs, policy or ["default"], options, events_out, report, as_json, arg or [])
    except (ConfigError, TraceError) as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{exc.filename}: {exc.strerror}")


trace_app = typer.Typer(
    help="Traces: convert public GPU cluster traces to Corral's CSV form.", no_args_is_help=True
)
app.add_typer(trace_app, name="trace")


@trace_app.command("convert")
def trace_convert(
    source: Annotated[str, typer.Argument(help="philly, pollux, sia, gavel, tiresias, shockwave or csv")],
    out: Annotated[Path, typer.Option("--out", "-o", help="where to write the common CSV")],
    path: Annotated[
        str | None, typer.Argument(help="file or name inside ../shared/traces (some need one)")
    ] = None,
    option: Annotated[
        list[str] | None, typer.Option("--option", help="loader option NAME=VALUE, e.g. vcs=6214e9,11cb48")
    ] = None,
) -> None:
    """Convert a public trace to the common trace form (DESIGN.md 4.5)."""
    from corral.core.errors import ConfigError, TraceError
    from corral.sim.loaders import convert

    options: dict[str, Any] = {}
    for item in option or []:
        name, sep, value = item.partition("=")
        if not sep:
            _fail(f"--option {item!r}: write NAME=VALUE")
        options[name] = int(value) if value.isdigit() else value
    if "window" in options:
        start, _, end = str(options["window"]).partition("..")
        options["window"] = (start, end)
    try:
        count = convert(source, path, out, **options)
    except (ConfigError, TraceError) as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{exc.filename}: {exc.strerror}")
    typer.echo(f"wrote {count} jobs to {out}")
