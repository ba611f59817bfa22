"""`corral nodes` (DESIGN.md 4.9): list them with their GPUs, or (admins) cordon, uncordon, drain,
undrain or forget one."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from corral.cli.remote import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    connect,
    fail,
    gpu_ranges,
    print_json,
    print_table,
    when,
)
from corral.cli.root import app

PANEL = "Cluster and admin"

NodeArg = Annotated[str, typer.Argument(metavar="NODE", help="the node's name")]
Reason = Annotated[str, typer.Option(help="why (shown in `corral nodes`)")]

# ---- nodes -------------------------------------------------------------------------------------
nodes_app = typer.Typer(help="Nodes: list them, or (admins) cordon, uncordon, drain, undrain or forget one.")
app.add_typer(nodes_app, name="nodes", rich_help_panel=PANEL, invoke_without_command=True)


@nodes_app.callback(invoke_without_command=True)
def nodes(
    ctx: typer.Context,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
    gpus: Annotated[
        bool, typer.Option("--gpus", help="one row per GPU: its state, the job on it, utilisation, memory")
    ] = False,
) -> None:
    """List nodes: state, GPUs allocated and free, unhealthy GPUs, heartbeat age, reason."""
    if ctx.invoked_subcommand is not None:
        return
    with connect(ctx, server, token) as corral:
        found = corral.nodes(gpus=gpus)
    if as_json:
        print_json({"nodes": found})
        return
    if gpus:
        print_gpus(found)
        return
    rows = [
        (
            n["name"],
            n["state"] + ("*" if not n.get("responding", True) and n["state"] != "lost" else ""),
            f"{n['allocated']}/{n['gpus']}",
            n["free"],
            n["gpu_model"],
            gpu_ranges(sorted(int(g) for g in n["unhealthy"])) if n["unhealthy"] else "",
            f"{n['heartbeat_age_s']:.0f}s ago" if n.get("heartbeat_age_s") is not None else "",
            node_reason(n),
        )
        for n in found
    ]
    print_table(
        ("NODE", "STATE", "GPUS USED", "FREE", "MODEL", "UNHEALTHY", "HEARTBEAT", "REASON"),
        rows,
        empty="no nodes yet: declare them in the cluster file, or start an agent",
    )


def node_reason(n: dict[str, Any]) -> str:
    reason = str(n["reason"])
    if n.get("drain_deadline"):
        reason += f" (deadline {when(n['drain_deadline'])})"
    if n.get("responding", True) or n["state"] == "lost":
        return reason
    return "; ".join(x for x in ("not responding: no new work", reason) if x)


def print_gpus(found: list[dict[str, Any]]) -> None:
    def percent(v: float | None) -> str:
        return f"{v * 100:.0f}%" if v is not None else ""

    def memory(g: dict[str, Any]) -> str:
        used, total = g.get("memory_used_bytes"), g.get("memory_total_bytes")
        return f"{used / 2**30:.1f}/{total / 2**30:.0f} GiB" if used is not None and total else ""

    rows = [
        (
            n["name"],
            g["index"],
            g["state"] + (f" ({g['reason']})" if g.get("reason") else ""),
            g.get("job") or ("(another team)" if g.get("queue") else ""),
            g.get("queue", ""),
            g.get("user", ""),
            percent(g.get("utilization")),
            memory(g),
        )
        for n in found
        for g in n.get("gpu_list", [])
    ]
    print_table(
        ("NODE", "GPU", "STATE", "JOB", "QUEUE", "USER", "UTIL", "MEMORY"),
        rows,
        empty="no GPUs: declare nodes in the cluster file, or start an agent",
    )


def _node_change(
    ctx: typer.Context,
    action: str,
    name: str,
    server: str | None,
    token: str | None,
    as_json: bool,
    **kw: Any,
) -> None:
    with connect(ctx, server, token) as corral:
        out = getattr(corral, action)(name, **kw)
    if as_json:
        print_json(out)
    else:
        typer.echo(f"{out['name']}: {out['state']}" + (f" ({out['reason']})" if out.get("reason") else ""))


@nodes_app.command()
def cordon(
    ctx: typer.Context,
    node: NodeArg,
    reason: Reason = "",
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """No new work on the node; its running jobs go on."""
    _node_change(ctx, "cordon", node, server, token, as_json, reason=reason)


@nodes_app.command()
def drain(
    ctx: typer.Context,
    node: NodeArg,
    deadline: Annotated[
        str | None,
        typer.Option(
            help="when its jobs are stopped and requeued, e.g. 10m (default: now, after each "
            "job's checkpoint grace)",
            show_default=False,
        ),
    ] = None,
    reason: Reason = "",
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """No new work on the node; by the deadline its jobs get their checkpoint signal and are requeued."""
    seconds = None
    if deadline is not None:
        from corral.config.durations import parse_duration

        try:
            seconds = parse_duration(deadline)
        except ValueError as exc:
            fail(f"--deadline {deadline!r}: {exc}")
    _node_change(ctx, "drain", node, server, token, as_json, deadline=seconds, reason=reason)


@nodes_app.command()
def undrain(
    ctx: typer.Context,
    node: NodeArg,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """End a drain (or a cordon): the node takes new work again."""
    _node_change(ctx, "undrain", node, server, token, as_json)


@nodes_app.command()
def forget(
    ctx: typer.Context,
    node: NodeArg,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Revoke the agent tokens bound to the node, so that a new agent may register it (a replaced
    host, a lost token); its running jobs stay until the new agent registers or the node is lost."""
    with connect(ctx, server, token) as corral:
        out = corral.forget(node)
    if as_json:
        print_json(out)
        return
    revoked = ", ".join(out["revoked"]) or "none"
    typer.echo(
        f"{out['name']}: forgotten (agent tokens revoked: {revoked}); "
        "a new agent may register it with a join token"
    )


@nodes_app.command()
def uncordon(
    ctx: typer.Context,
    node: NodeArg,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Lift a cordon: the node takes new work again (a draining node needs `undrain`)."""
    _node_change(ctx, "uncordon", node, server, token, as_json)
