"""`corral admin pause|resume|maintenance|policy|backup|restore`: the control plane's operations (admins)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from corral.cli.ops_cmds import PANEL
from corral.cli.remote import JsonOpt, ServerOpt, TokenOpt, connect, fail, print_json, seconds_text, when
from corral.cli.root import app
from corral.cli.settings import data_dir, default_database_url
from corral.cli.whatif_show import (
    ForceOpt,
    ReasonOpt,
    ReportOpt,
    SinceOpt,
    WhatIfOpt,
    YesOpt,
    decide,
    print_decided,
    proposal_of,
)

# ---- admin verbs -------------------------------------------------------------------------------
admin_app = typer.Typer(help="Control-plane operations (admins).", no_args_is_help=True)
app.add_typer(admin_app, name="admin", rich_help_panel=PANEL)


@admin_app.command()
def pause(
    ctx: typer.Context, server: ServerOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Freeze scheduling decisions; running jobs go on, submissions are still taken."""
    with connect(ctx, server, token) as corral:
        out = corral.pause()
    if as_json:
        print_json(out)
    else:
        typer.echo("scheduling paused (`corral admin resume` to go on)")


@admin_app.command()
def maintenance(
    ctx: typer.Context,
    for_: Annotated[
        str, typer.Option("--for", help="how long the control plane may be away: 10m, 1h (0 ends it)")
    ],
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Before a planned control-plane outage: agents' leases last through it (their fences keep the
    workers alive) and no node is declared lost until it is over."""
    from corral.config.durations import parse_duration

    try:
        seconds = 0.0 if for_.strip() == "0" else parse_duration(for_)
    except ValueError as exc:
        fail(f"--for {for_!r}: {exc}", "write a duration with units, such as 10m or 1h")
    with connect(ctx, server, token) as corral:
        out = corral.maintenance(seconds)
    if as_json:
        print_json(out)
    elif out.get("maintenance_until"):
        typer.echo(
            f"maintenance until {when(out['maintenance_until'])}: restart the control plane within it; "
            "agents renew their leases at their next heartbeat"
        )
    else:
        typer.echo("maintenance over: nodes silent for 30 s are lost again")


@admin_app.command()
def resume(
    ctx: typer.Context, server: ServerOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Resume scheduling after `pause`."""
    with connect(ctx, server, token) as corral:
        out = corral.resume()
    if as_json:
        print_json(out)
    else:
        typer.echo("scheduling resumed")


@admin_app.command()
def policy(
    ctx: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(
            metavar="[POLICY]", help="a policy of `corral policies`; none: show the one in effect"
        ),
    ] = None,
    arg: Annotated[
        list[str] | None,
        typer.Option("--arg", help="a plugin argument PLUGIN.KEY=VALUE (repeat)"),
    ] = None,
    comment: Annotated[str, typer.Option(help="why (kept with the revision)")] = "",
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
    """Show the scheduling policy in effect, or change it: a new configuration revision
    (`corral queues rollback` undoes it). `--what-if` first replays the last `--since` of this
    cluster's work under the new policy and keeps the result with the revision (docs/whatif.md)."""
    from corral.core.errors import ConfigError
    from corral.policies.registry import parse_plugin_args

    try:
        args = parse_plugin_args(arg or [])
    except ConfigError as exc:
        fail(exc.detail, exc.fix)
    if name is None:
        if args or comment:
            fail(
                "--arg and --comment change a policy",
                "name the policy: corral admin policy default --arg ...",
            )
        with connect(ctx, server, token) as corral:
            shown = corral.policy()
        if as_json:
            print_json(shown)
            return
        typer.echo(f"policy {shown['name']} (from {shown['source']})")
        for plugin, values in shown["plugins"].items():
            given = shown["args"].get(plugin, {})
            text = ", ".join(f"{k}={v}" + (" (set)" if k in given else "") for k, v in values.items())
            typer.echo(f"  {plugin}: {text or '(no arguments)'}")
        return
    with connect(ctx, server, token) as corral:
        decision = decide(
            corral, what_if, since, report, yes, force, reason, as_json,
            lambda export: proposal_of(corral, export, name, args, None, None),
        )  # fmt: skip
        result = decision.pop("_result", None)
        out = corral.set_policy(name, args or None, comment, decision)
    print_decided(out, result, as_json, f"policy {name} is active (configuration revision {out['revision']})")


@admin_app.command()
def backup(
    ctx: typer.Context,
    path: Annotated[str, typer.Argument(metavar="PATH", help="file on the server's machine")],
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """An online, consistent copy of the database (SQLite backup API, or pg_dump), while it runs."""
    target = str(Path(path).absolute())  # the server resolves paths from its own directory
    with connect(ctx, server, token) as corral:
        out = corral.backup(target)
    if as_json:
        print_json(out)
    else:
        typer.echo(f"backup written to {out['path']} ({out['bytes']} bytes, {seconds_text(out['seconds'])})")


@admin_app.command()
def restore(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="a file `corral admin backup` wrote")],
    database_url: Annotated[
        str | None,
        typer.Option(
            "--database-url",
            envvar="CORRAL_DATABASE_URL",
            help="the database to replace (default: corral.db in the data directory)",
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
) -> None:
    """Replace a database with a backup. Offline: stop the server (and scheduler) first."""

    url = database_url or default_database_url(data_dir())
    if not path.is_file():
        fail(f"no backup file {path}", "give the path `corral admin backup` wrote")
    if not yes:
        typer.confirm(f"Replace the database {url} with {path}? The server must be stopped", abort=True)
    from corral.server.backup import restore as restore_database
    from corral.store.inuse import DatabaseInUse, exclusive

    try:
        with exclusive(url):  # refused while a server or scheduler holds its lease on the database
            restore_database(url, str(path))
    except DatabaseInUse as exc:
        fail(f"restore refused: {exc}", "stop the server (and any `corral scheduler`) first", code=1)
    except Exception as exc:  # sqlite3, pg_restore: what failed is in the message
        fail(f"restore failed: {exc}", "check that the server is stopped and the URL is right", code=1)
    typer.echo(f"restored {url} from {path}; start the server again")
