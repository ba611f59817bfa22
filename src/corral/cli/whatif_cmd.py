"""`corral trace export` and `corral whatif`: the cluster's own history as a trace, and that
history replayed under the configuration in force and under a proposed one (docs/whatif.md)."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli.offline_cmds import trace_app
from corral.cli.remote import JsonOpt, ServerOpt, TokenOpt, connect, fail, print_json
from corral.cli.root import app
from corral.cli.whatif_data import counts_text, fetch, report_path, when_text

if TYPE_CHECKING:
    pass

PANEL = "Administration"
EXTRA_COLUMNS = ("observed", "live_wait", "attempts", "preemptions")
SinceOpt = Annotated[
    str,
    typer.Option(
        "--since", help="the window's start: a duration before now (7d, 12h) or a date (2026-12-01)"
    ),
]
UntilOpt = Annotated[
    str | None,
    typer.Option("--until", help="the window's end: a duration before now or a date (default: now)"),
]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".")
    return str(value)


def write_csv(path: Path, rows: list[Mapping[str, Any]]) -> None:
    from corral.sim.trace import COLUMNS

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow((*COLUMNS, *EXTRA_COLUMNS))
        for r in rows:
            writer.writerow([_cell(r.get(c)) for c in (*COLUMNS, *EXTRA_COLUMNS)])


def write_cluster(path: Path, export: Mapping[str, Any]) -> None:
    """The nodes as they were and the configuration in force; what befell nodes as comments."""
    import yaml

    from corral.sim.whatif import cluster_body

    body = cluster_body(export)
    body.pop("policy_args", None)
    body.pop("policy", None)
    lines = [f"# exported from the event log: {when_text(export['since'])} to {when_text(export['until'])}"]
    lines.append(f"# configuration revision {export['revision']} (policy {export['policy']})")
    for n in export["nodes"]:
        if n.get("joined_at"):
            lines.append(f"# node {n['name']} joined at {when_text(n['joined_at'])}")
        if n.get("state_now") not in ("up", None):
            lines.append(f"# node {n['name']} is {n['state_now']} now")
    for c in export["node_changes"]:
        lines.append(f"# node {c['node']}: {c['action']} at {when_text(c['t'])}")
    for lost in export["node_losses"]:
        lines.append(f"# job {lost['job']} lost at {when_text(lost['t'])} on {', '.join(lost['nodes'])}")
    for r in export["revisions_in_window"]:
        lines.append(
            f"# configuration revision {r['revision']} applied at {when_text(r['created_at'])}: "
            f"{r['comment']}"
        )
    path.write_text("\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False), encoding="utf-8")


@trace_app.command("export")
def trace_export(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="the trace (CSV, DESIGN.md 4.5) to write")],
    since: SinceOpt = "7d",
    until: UntilOpt = None,
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help="also write the nodes as they were (a cluster file)")
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Export the cluster's recent history (admins): each job of the window as a trace row."""
    with connect(ctx, server, token) as corral:
        export = fetch(corral, since, until)
    write_csv(out, export["jobs"])
    if cluster is not None:
        write_cluster(cluster, export)
    if as_json:
        print_json({"counts": export["counts"], "left_out": export["left_out"], "trace": str(out)})
        return
    typer.echo(f"{counts_text(export['counts'])}; wrote {out}" + (f" and {cluster}" if cluster else ""))


def _policy_args(arg: list[str] | None) -> dict[str, dict[str, Any]]:
    from corral.core.errors import ConfigError
    from corral.policies.registry import parse_plugin_args

    try:
        return parse_plugin_args(arg or [])
    except ConfigError as exc:
        fail(exc.detail, exc.fix)


@app.command(rich_help_panel=PANEL)
def whatif(
    ctx: typer.Context,
    since: SinceOpt = "7d",
    until: UntilOpt = None,
    policy: Annotated[str | None, typer.Option(help="the proposed policy (see `corral policies`)")] = None,
    arg: Annotated[
        list[str] | None, typer.Option("--arg", help="proposed plugin argument PLUGIN.KEY=VALUE")
    ] = None,
    queues: Annotated[
        Path | None, typer.Option("--queues", help="a YAML file whose `queues:` replace the queues in force")
    ] = None,
    revision: Annotated[
        int | None, typer.Option("--revision", help="propose a stored configuration revision")
    ] = None,
    report: Annotated[
        Path | None, typer.Option(help="write the HTML report of both runs into this folder")
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay the window twice (admins): under the configuration in force and a proposed one."""
    from corral.cli.whatif_show import proposal_of, run_and_show

    with connect(ctx, server, token) as corral:
        export = fetch(corral, since, until)
        proposed, change = proposal_of(corral, export, policy, _policy_args(arg), queues, revision)
        reports = corral.reports() if report is not None else None
    run_and_show(export, proposed, change, report_path(report, reports), as_json)
