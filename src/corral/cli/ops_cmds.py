"""The operators' commands: `nodes` (`nodes_cmds.py`), `queues` (`queues_cmds.py`), then, here,
`audit` and `token create|list|revoke` (DESIGN.md 4.9); `admin` is in `admin_cmds`. The two
modules above are imported first: their groups come first in `corral --help`."""

from __future__ import annotations

from typing import Annotated

import typer

from corral.cli import nodes_cmds, queues_cmds  # noqa: F401  (registered before the commands below)
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

PANEL = "Cluster and admin"


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
