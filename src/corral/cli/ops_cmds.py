"""The operators' commands: `nodes` (cordon, drain, undrain, forget), `queues` (set, history, rollback),
`audit` and `token create|list|revoke` (DESIGN.md 4.9); `admin` is in `admin_cmds`."""

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
from corral.cli.whatif_show import (
    ForceOpt,
    ReasonOpt,
    ReportOpt,
    SinceOpt,
    WhatIfOpt,
    YesOpt,
    decide,
    evidence_text,
    print_decided,
    proposal_of,
)

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


# ---- queues ------------------------------------------------------------------------------------
queues_app = typer.Typer(help="Queues: list them, or (admins) change one, see the history, roll back.")
app.add_typer(queues_app, name="queues", rich_help_panel=PANEL, invoke_without_command=True)


@queues_app.callback(invoke_without_command=True)
def queues(
    ctx: typer.Context, server: ServerOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """List the queues you may use: weight, quota, limit, GPUs allocated, pending jobs, share."""
    if ctx.invoked_subcommand is not None:
        return
    with connect(ctx, server, token) as corral:
        found = corral.queues()
    if as_json:
        print_json({"queues": found})
        return
    rows = [
        (
            q["name"],
            f"{q['weight']:g}",
            q["quota"],
            "-" if q["limit"] is None else q["limit"],
            q["cohort"],
            q["allocated_gpus"],
            q["pending_jobs"],
            f"{q['share']:.0%}",
            f"{q['fair_share']:.0%}",
        )
        for q in found
    ]
    print_table(
        ("QUEUE", "WEIGHT", "QUOTA", "LIMIT", "COHORT", "GPUS USED", "PENDING", "SHARE", "FAIR SHARE"),
        rows,
        empty="no queue you may use: ask an admin to add your team to one",
    )


@queues_app.command("set")
def set_queue(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="the queue (a new name adds one)")],
    weight: Annotated[float | None, typer.Option(help="share of what lies above the quotas")] = None,
    quota: Annotated[int | None, typer.Option(help="guaranteed GPUs")] = None,
    limit: Annotated[int | None, typer.Option(help="at most this many GPUs in use")] = None,
    cohort: Annotated[str | None, typer.Option(help="queues that lend idle GPUs to each other")] = None,
    lending_limit: Annotated[int | None, typer.Option(help="idle guaranteed GPUs lent at most")] = None,
    team: Annotated[
        list[str] | None, typer.Option(help="team that may submit; repeat", show_default=False)
    ] = None,
    priority: Annotated[
        list[str] | None, typer.Option(help="allowed priority class; repeat", show_default=False)
    ] = None,
    default_time_limit: Annotated[str | None, typer.Option(help="e.g. 4h")] = None,
    max_time_limit: Annotated[str | None, typer.Option(help="e.g. 7d")] = None,
    mount_allow: Annotated[
        list[str] | None, typer.Option(help="a path jobs may mount from; repeat", show_default=False)
    ] = None,
    comment: Annotated[str, typer.Option(help="why (kept in the history)")] = "",
    what_if: WhatIfOpt = False,
    since: SinceOpt = "7d",
    report: ReportOpt = None,
    yes: YesOpt = False,
    force: ForceOpt = False,
    reason: ReasonOpt = "",
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change (or add) a queue: a new configuration revision, audited, that `rollback` can undo.
    `--what-if` first replays the last `--since` of this cluster's work under the change and
    keeps the result with the revision (docs/whatif.md)."""
    change = {
        "weight": weight,
        "quota": quota,
        "limit": limit,
        "cohort": cohort,
        "lending_limit": lending_limit,
        "teams": team,
        "priorities": priority,
        "default_time_limit": default_time_limit,
        "max_time_limit": max_time_limit,
        "mount_allowlist": mount_allow,
    }
    if all(v is None for v in change.values()):
        fail("nothing to change", "give at least one of --weight, --quota, --limit, --cohort, ...")
    with connect(ctx, server, token) as corral:
        decision = decide(
            corral, what_if, since, report, yes, force, reason, as_json,
            lambda export: proposal_of(corral, export, None, {}, None, None, (name, change)),
        )  # fmt: skip
        result = decision.pop("_result", None)
        out = corral.set_queue(name, change, comment, decision)
    print_decided(out, result, as_json, f"queue {name} changed: configuration revision {out['revision']}")


@queues_app.command()
def history(
    ctx: typer.Context, server: ServerOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Every configuration revision, oldest first; `*` marks the active one."""
    with connect(ctx, server, token) as corral:
        out = corral.revisions()
    if as_json:
        print_json(out)
        return
    rows = [
        (
            ("* " if r["revision"] == out["active"] else "  ") + str(r["revision"]),
            when(r["created_at"]),
            r["author"],
            _policy_text(r),
            r["comment"],
        )
        for r in out["revisions"]
    ]
    print_table(
        ("REVISION", "CREATED", "AUTHOR", "POLICY", "COMMENT", "EVIDENCE"),
        [(*row, evidence_text(r.get("evidence"))) for row, r in zip(rows, out["revisions"], strict=True)],
        empty="no revisions: the built-in default",
    )


def _policy_text(revision: dict[str, Any]) -> str:
    """`default` or `default (fair_share.half_life=604800)`."""
    args = revision.get("policy_args") or {}
    given = ", ".join(f"{p}.{k}={v}" for p, values in args.items() for k, v in values.items())
    return str(revision.get("policy", "")) + (f" ({given})" if given else "")


@queues_app.command()
def rollback(
    ctx: typer.Context,
    revision: Annotated[int, typer.Argument(metavar="REVISION", help="from `corral queues history`")],
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Make an earlier configuration revision active again (as a new revision)."""
    with connect(ctx, server, token) as corral:
        out = corral.rollback(revision)
    if as_json:
        print_json(out)
    else:
        typer.echo(f"rolled back to revision {revision}: now revision {out['revision']}")


# ---- audit -------------------------------------------------------------------------------------
@app.command(rich_help_panel=PANEL)
def audit(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(help="the newest this many records", min=1, max=10_000)] = 200,
    after: Annotated[int, typer.Option(help="only records with a larger id", min=0)] = 0,
    who: Annotated[str, typer.Option(help="only this token name's records, e.g. admin")] = "",
    action: Annotated[str, typer.Option(help="only actions containing this, e.g. /v1/nodes or DELETE")] = "",
    since: Annotated[str | None, typer.Option(help="only the last DURATION, e.g. 1h or 2d")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Who changed what, and the result (admins): every mutating call leaves a record (agents'
    heartbeats and accepted reports excepted)."""
    import time

    start = 0.0
    if since is not None:
        from corral.config.durations import parse_duration

        try:
            start = time.time() - parse_duration(since)
        except ValueError as exc:
            fail(f"--since {since!r}: {exc}")
    with connect(ctx, server, token) as corral:
        found = corral.audit(limit=limit, after=after, who=who, action=action, since=start)
    if as_json:
        print_json({"audit": found})
        return
    rows = [(a["id"], when(a["t"]), a["principal"], a["action"], a["result"], a["detail"]) for a in found]
    print_table(("ID", "TIME", "WHO", "ACTION", "RESULT", "DETAIL"), rows, empty="no audit records")


# ---- tokens ------------------------------------------------------------------------------------
token_app = typer.Typer(help="API tokens (admins): create, list, revoke.", no_args_is_help=True)
app.add_typer(token_app, name="token", rich_help_panel=PANEL)


@token_app.command("create")
def token_create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="who or what holds it, e.g. alice")],
    role: Annotated[str, typer.Option(help="admin, member or agent")],
    team: Annotated[str, typer.Option(help="member: the team whose queues and jobs it may use")] = "",
    node: Annotated[str, typer.Option(help="agent: bind it to this node now")] = "",
    run_as: Annotated[str, typer.Option(help="member: the Unix user its jobs run as (never root)")] = "",
    allow_root: Annotated[
        bool,
        typer.Option(help="accept --run-as root (its jobs run only on nodes with --allow-root-jobs)"),
    ] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a token; its secret is printed this once."""
    with connect(ctx, server, token) as corral:
        out = corral.create_token(name, role, team=team, node=node, run_as=run_as, allow_root=allow_root)
    if as_json:
        print_json(out)
        return
    who = f"{out['role']} {out['name']}" + (f", team {out['team']}" if out.get("team") else "")
    typer.echo(f"token {out['id']} ({who}); the secret, shown only now:")
    typer.echo(out["token"])


@token_app.command("list")
def token_list(
    ctx: typer.Context, server: ServerOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Every token (never a secret), revoked ones too."""
    with connect(ctx, server, token) as corral:
        found = corral.tokens()
    if as_json:
        print_json({"tokens": found})
        return
    rows = [
        (
            t["id"],
            t["name"],
            t["role"],
            t.get("team"),
            t.get("node"),
            t.get("run_as"),
            when(t.get("created_at")),
            t.get("created_by"),
            when(t["revoked_at"]) if t.get("revoked_at") else "",
        )
        for t in found
    ]
    print_table(("ID", "NAME", "ROLE", "TEAM", "NODE", "RUN AS", "CREATED", "BY", "REVOKED"), rows)


@token_app.command("revoke")
def token_revoke(
    ctx: typer.Context,
    token_id: Annotated[str, typer.Argument(metavar="ID", help="from `corral token list`")],
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Revoke a token at once."""
    with connect(ctx, server, token) as corral:
        out = corral.revoke_token(token_id)
    if as_json:
        print_json(out)
    else:
        typer.echo(f"token {out['revoked']} revoked")
