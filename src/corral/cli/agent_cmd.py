"""`corral agent`: the node agent of one machine (register, heartbeat, run the workers it is sent)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.cli import settings
from corral.cli.remote import fail
from corral.cli.root import app
from corral.protocol import ProtocolMismatch


@app.command(rich_help_panel="Control plane")
def agent(
    server: Annotated[
        str,
        typer.Option(
            envvar="CORRAL_SERVER",
            help="the server URL, or several replicas' as URL1,URL2 (a failure moves to the next)",
        ),
    ],
    token: Annotated[str, typer.Option(envvar="CORRAL_AGENT_TOKEN", help="this node's agent (join) token")],
    node: Annotated[str | None, typer.Option(help="this node's name (default: the host name)")] = None,
    gpus: Annotated[
        int | None,
        typer.Option(help="declare this many GPUs instead of asking NVML", min=0, show_default=False),
    ] = None,
    gpu_model: Annotated[str | None, typer.Option(help="their model, e.g. H100-80GB")] = None,
    address: Annotated[
        str | None,
        typer.Option(help="address workers reach this node at (default: the one facing the server)"),
    ] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="worker logs and run files (default: the Corral data directory)")
    ] = None,
    checkpoint_root: Annotated[
        Path | None, typer.Option(help="root of CORRAL_CHECKPOINT_DIR (default: DATA_DIR/checkpoints)")
    ] = None,
    default_user: Annotated[
        str | None,
        typer.Option(
            help="Unix user for jobs whose token maps to none "
            "(default: nobody for an agent run as root, else the agent's own user)"
        ),
    ] = None,
    allow_root_jobs: Annotated[
        bool, typer.Option(help="let jobs whose user is root (uid 0) run on this node (default: refused)")
    ] = False,
    pass_env: Annotated[
        list[str] | None,
        typer.Option(
            help="also give workers this variable of the agent's environment (repeat; e.g. LD_LIBRARY_PATH)",
            show_default=False,
        ),
    ] = None,
    logs_port: Annotated[
        int, typer.Option(min=0, max=65535, help="port the agent serves worker logs on (0: any free port)")
    ] = 0,
    fail_gpu: Annotated[
        list[int] | None,
        typer.Option(
            help="declare this GPU index faulty (repeat; or list them in DATA_DIR/gpu-faults)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run this machine's node agent: it launches the workers it is sent (in cgroups where the
    machine allows) and serves their logs; Ctrl-C stops it and them."""
    from corral.agent.inventory import address_towards, declared_or_detected, inventory
    from corral.agent.runner import Agent
    from corral.client import ClientError

    os.umask(0o077)  # its records hold jobs' env: private unless made readable on purpose
    logging.basicConfig(level=logging.INFO, format="%(asctime)s corral agent: %(message)s", stream=sys.stderr)
    for chatty in ("httpx", "httpcore"):  # a line per heartbeat, poll and report says nothing
        logging.getLogger(chatty).setLevel(logging.WARNING)
    directory = data_dir or settings.data_dir()
    found = declared_or_detected(gpus, gpu_model)
    body = inventory(node or socket.gethostname(), found, address or address_towards(server.split(",")[0]))
    sampler = None
    if gpus is None and found.count:  # found through NVML: report utilisation and memory too
        from corral.agent.nvml import open_nvml

        sampler, _ = open_nvml()
    try:
        runner = Agent(
            server,
            token,
            body,
            directory,
            checkpoint_root,
            default_user=default_user,
            allow_root=allow_root_jobs,
            pass_env=tuple(pass_env or ()),
            logs_port=logs_port,
            nvml=sampler,
            fail_gpus={str(g): "declared faulty (--fail-gpu)" for g in fail_gpu or ()},
        )
    except ValueError as exc:
        fail(str(exc), "pass --server http://HOST:PORT")

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    model = f" x {found.model}" if found.model else ""
    try:
        runner.run(
            lambda joined: typer.echo(
                f"Node {body['node']} joined {runner.api.server} with {found.count}{model} GPUs "
                f"(address {body['address']}, incarnation {joined['incarnation']})."
            )
        )
    except KeyboardInterrupt:
        typer.echo("corral agent: stopped")
    except ClientError as err:
        fail(f"corral agent: {err.message}", err.fix)
    except ProtocolMismatch as exc:
        fail(f"corral agent: {exc}")
    finally:
        runner.shutdown()
