"""`corral server` and `corral scheduler`: the control plane's processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from corral.cli.root import app
from corral.cli.settings import data_dir, default_database_url

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        envvar="CORRAL_DATABASE_URL",
        help="sqlite:///PATH (default: corral.db in the data directory) or postgresql+psycopg://USER@HOST/DB",
    ),
]


@app.command(rich_help_panel="Control plane")
def server(
    database_url: DatabaseUrl = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8400,
    cluster: Annotated[
        Path | None, typer.Option("--cluster", help="cluster file to apply as a new revision")
    ] = None,
    policy: Annotated[str, typer.Option(help="scheduling policy (see `corral policies`)")] = "default",
    allow_dynamic_nodes: Annotated[bool, typer.Option(help="accept agents of undeclared nodes")] = False,
    insecure_http: Annotated[bool, typer.Option(help="allow plain HTTP beyond loopback")] = False,
    tls_cert: Annotated[Path | None, typer.Option(help="TLS certificate (PEM)")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="TLS private key (PEM)")] = None,
    durability: Annotated[
        str, typer.Option(help="SQLite: normal (survives kill -9) or full (survives power loss)")
    ] = "normal",
    no_scheduler: Annotated[
        bool, typer.Option("--no-scheduler", help="serve the API only (run `corral scheduler` elsewhere)")
    ] = False,
    reports_dir: Annotated[
        Path | None,
        typer.Option(help="simulation reports the dashboard lists (default: reports/ in the data directory)"),
    ] = None,
    lost_after: Annotated[
        float,
        typer.Option(
            min=0, help="seconds of agent silence before a node is lost and its jobs requeued (0: never)"
        ),
    ] = 30.0,
    auth_failures: Annotated[
        int,
        typer.Option(
            min=0,
            help="failed authentications one client address may make at once; then one a second, "
            "others answered 429 (valid tokens are never refused; 0: no limit)",
        ),
    ] = 20,
    require_evidence_days: Annotated[
        float,
        typer.Option(
            min=0,
            help="refuse a configuration change without a what-if over at least this many days, "
            "unless --force --reason (0: off; docs/whatif.md)",
        ),
    ] = 0.0,
) -> None:
    """Run the control plane: the HTTP API (FastAPI on uvicorn) and the scheduler process."""
    from corral.server import metrics_dir  # before any module that defines metrics

    os.umask(0o077)  # the data directory and what is in it are the service user's alone
    metrics_dir.prepare(data_dir())
    from corral.core.errors import ConfigError
    from corral.server.config_check import LiveConflict
    from corral.server.main import ServerOptions, serve

    directory = data_dir()
    try:
        serve(
            ServerOptions(
                database_url=database_url or default_database_url(directory),
                host=host,
                port=port,
                data_dir=directory,
                policy=policy,
                cluster_file=cluster,
                allow_dynamic_nodes=allow_dynamic_nodes,
                insecure_http=insecure_http,
                tls_cert=tls_cert,
                tls_key=tls_key,
                scheduler=not no_scheduler,
                durability=durability,
                reports_dir=reports_dir,
                lost_after=lost_after,
                auth_failures=auth_failures,
                require_evidence_days=require_evidence_days,
            )
        )
    except (ConfigError, LiveConflict) as exc:  # the cluster file, or a revision that would strand live jobs
        raise SystemExit(f"corral server: {exc}") from None


@app.command(rich_help_panel="Control plane")
def scheduler(
    database_url: DatabaseUrl = None,
    policy: Annotated[str, typer.Option(help="scheduling policy")] = "default",
) -> None:
    """Run a scheduler process on its own (`corral server` starts one for you)."""
    from corral.server.replica import main
    from corral.store.inuse import hold_database

    url = database_url or default_database_url(data_dir())
    lease = hold_database(url)  # `corral admin restore` refuses while it is held
    try:
        main(url, policy)
    finally:
        lease.close()
