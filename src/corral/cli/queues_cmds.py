"""`corral queues` (DESIGN.md 4.9): list them, or (admins) change one (with a what-if first), see
the history of configuration revisions, roll back."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from corral.cli.remote import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    connect,
    fail,
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
