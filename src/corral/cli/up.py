"""`corral up`: a one-machine Corral in one command.

It runs the control plane in the foreground (API and scheduler, SQLite in the data directory,
dynamic nodes allowed, no cluster file: one `default` queue), and, once the API answers,
registers this machine as a node with the GPUs NVML finds (or `--gpus N --gpu-model M`)
through the agents' API with an agent token of its own, and writes the server URL and an
admin token to your config (mode 0600) so `corral submit` works from any terminal.

Jobs run as the user who ran `corral up`; run as root, as `$SUDO_USER` (under sudo) or else
`nobody`, never as root unless `--run-as root` says so. SIGTERM or Ctrl-C stops the server and
kills the workers of this machine's jobs before `corral up` exits.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.agent.inventory import Gpus, declared_or_detected, inventory
from corral.cli.dashboard_cmd import login_link
from corral.cli.remote import fail, say_error
from corral.cli.root import app
from corral.cli.settings import data_dir, default_database_url, read_config, write_config

PANEL = "Control plane"

if TYPE_CHECKING:
    from corral.agent.runner import Agent
    from corral.client import Client, JsonObject

DECLARE_HINT = "corral up --gpus 8 --gpu-model H100-80GB"


def local_inventory(node: str, gpus: Gpus) -> dict[str, Any]:
    """The registration body for this machine: the agent's own (`corral.agent.inventory`), NVLink
    domains included, at the loopback address."""
    return inventory(node, gpus, "127.0.0.1")


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@app.command(rich_help_panel=PANEL)
def up(
    port: Annotated[int, typer.Option(help="TCP port of the API")] = 8400,
    host: Annotated[str, typer.Option(help="address to listen on (beyond loopback: use `corral server`)")] = (
        "127.0.0.1"
    ),
    gpus: Annotated[
        int | None,
        typer.Option(help="declare this many GPUs instead of asking NVML", min=0, show_default=False),
    ] = None,
    gpu_model: Annotated[str | None, typer.Option(help="their model, e.g. H100-80GB")] = None,
    node: Annotated[str | None, typer.Option(help="this node's name (default: the host name)")] = None,
    policy: Annotated[str, typer.Option(help="scheduling policy (see `corral policies`)")] = "default",
    run_as: Annotated[
        str | None,
        typer.Option(
            help="Unix user the jobs run as (default: yours; as root: $SUDO_USER, else nobody)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run Corral on this machine: API, scheduler and this machine as its node; Ctrl-C stops it."""
    from corral.server import metrics_dir  # before any module that defines metrics

    os.umask(0o077)  # the data directory and what is in it are the service user's alone
    metrics_dir.prepare(data_dir())
    from corral.server.main import ServerOptions, check_listen, serve

    os.umask(0o077)  # the database, job records and logs are private (DESIGN.md 6.6)
    user = jobs_user(run_as)
    directory = data_dir()
    opts = ServerOptions(
        database_url=default_database_url(directory),
        host=host,
        port=port,
        data_dir=directory,
        policy=policy,
        allow_dynamic_nodes=True,
        banner=False,  # `_announce` says where things are, with the node and the login link
    )
    check_listen(opts)
    if not _port_is_free(host, port):
        fail(
            f"port {port} on {host} is in use (is `corral up` running already?)", "choose another with --port"
        )
    found = declared_or_detected(gpus, gpu_model)
    name = node or socket.gethostname()
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    agents: list[Agent] = []
    joiner = threading.Thread(
        target=_join,
        args=(url, directory, local_inventory(name, found), found, agents, user),
        name="corral-up-node",
        daemon=True,
    )
    joiner.start()
    # uvicorn re-raises the signal it stopped on once it has restored this handler: without it, a
    # SIGTERM would end the process before the `finally` below and leave the workers to the fence
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        serve(opts)
    except KeyboardInterrupt:  # the normal way out: Ctrl-C or SIGTERM
        pass
    finally:
        stopped = sum(running.shutdown() for running in agents)  # workers are process groups of their own
        typer.echo(f"corral up: stopped (and the workers of {stopped} running job attempts)")


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def jobs_user(run_as: str | None) -> str | None:
    """The user jobs run as: `--run-as`, else the invoking user (None: the agent's own); as root,
    `$SUDO_USER` (a human who ran `sudo corral up`) or else `nobody`."""
    if run_as:
        return run_as
    if os.geteuid() != 0:
        return None
    sudo_user = os.environ.get("SUDO_USER", "")
    return sudo_user if sudo_user and sudo_user != "root" else "nobody"


def _join(
    url: str, directory: Path, inventory: dict[str, Any], gpus: Gpus, agents: list[Agent], user: str | None
) -> None:
    """After the API answers: register the node, write the config, say what is where; then run
    this machine's node agent (heartbeats, and the workers of the jobs placed here)."""
    from corral.agent.runner import Agent
    from corral.client import ClientError

    try:
        _wait_healthy(url)
        admin = _admin_token(url, directory)
        node, _ = _register(url, directory, admin, inventory)
        node.close()
        _announce(url, directory, admin, inventory, gpus, user)
        token = (directory / "agent-token").read_text().strip()  # `_register` keeps it there
        # long polls of 2 s end within the server's 3 s graceful stop: Ctrl-C cancels none of them
        running = Agent(
            url, token, inventory, directory, poll_wait=2.0, default_user=user, allow_root=user == "root"
        )
        agents.append(running)
        running.run()
    except ClientError as err:
        if not err.is_unreachable:  # unreachable: the server is stopping
            say_error(f"corral up could not register this node: {err.message}", err.fix)
    except TimeoutError as exc:
        say_error(str(exc), "see the server's messages above")


def _wait_healthy(url: str, timeout: float = 120.0) -> None:
    from corral.client import Client, ClientError

    deadline = time.monotonic() + timeout
    with Client(url, timeout=2.0) as probe:
        while True:
            try:
                probe.healthz()
                return
            except ClientError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the API at {url} did not answer within {timeout:g}s") from None
                time.sleep(0.1)


def _admin_token(url: str, directory: Path) -> str:
    """The admin token `corral server` wrote on a fresh database, else the one in your config."""
    from corral.client import Client, ClientError

    candidates = []
    path = directory / "admin-token"
    if path.is_file():
        candidates.append(path.read_text().strip())
    if isinstance(token := read_config().get("token"), str) and token:
        candidates.append(token)
    for token in candidates:
        try:
            with Client(url, token) as corral:
                corral.tokens()  # admins only
            return token
        except ClientError as err:
            if err.is_unreachable:
                raise
    raise ClientError(
        401,
        f"no admin token for this database in {path} or in your config",
        f"delete {directory / 'corral.db'} to start afresh, or put an admin token in {path}",
    )


def _register(url: str, directory: Path, admin: str, inventory: dict[str, Any]) -> tuple[Client, JsonObject]:
    """Register with the agent token kept in the data directory, or with a new one made for this node."""
    from corral.client import Client, ClientError

    path = directory / "agent-token"
    if path.is_file():
        node = Client(url, path.read_text().strip())
        try:
            return node, node.register_agent(inventory)
        except ClientError as err:
            node.close()
            if err.status not in (401, 403):  # 401: revoked, 403: bound to another node
                raise
    with Client(url, admin) as corral:
        made = corral.create_token(f"agent-{inventory['node']}", "agent", node=inventory["node"])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(made["token"] + "\n")
    node = Client(url, made["token"])
    try:
        return node, node.register_agent(inventory)
    except ClientError:
        node.close()
        raise


def _announce(
    url: str, directory: Path, admin: str, inventory: dict[str, Any], gpus: Gpus, user: str | None
) -> None:
    from corral.client import Client, ClientError

    config = write_config({"server": url, "token": admin})
    try:
        with Client(url, admin) as corral:
            link = login_link(corral)
    except ClientError as err:  # the dashboard is a convenience: the node still joins
        link = f"(none: {err.message}; try `corral dashboard`)"
    model = f" x {gpus.model}" if gpus.model else ""
    lines = [
        f"Corral is up: API {url}/v1, its OpenAPI schema at {url}/openapi.json (data in {directory}).",
        f"Dashboard: {url}/ ; one-time login link (works once, for an hour; `corral dashboard` "
        f"prints a fresh one):\n  {link}",
        f"Node {inventory['node']} joined with {gpus.count}{model} GPUs.",
    ]
    blocked = _closed_to(user, directory)
    if blocked is not None:
        lines.append(
            f"Warning: {blocked} is closed to {user}, so its jobs cannot enter their folders under "
            f"{directory}: set CORRAL_DATA_DIR to a folder it can pass through (e.g. /var/lib/corral), "
            "or choose another user with --run-as."
        )
    if gpus.count == 0:
        lines.append(
            f"No GPU declared or found ({gpus.why_none}), so this node has 0 GPUs. "
            f"To declare some: {DECLARE_HINT}"
        )
    lines += [
        f"Wrote the server URL and an admin token to {config} (mode 0600): "
        "`corral submit` and `corral jobs` work from any terminal.",
        f"This node's agent runs the jobs placed on it as {user or _me()}"
        + (" (root: --run-as root)" if user == "root" else "")
        + f"; their output is in {directory / 'logs'}.",
        "Stop with Ctrl-C.",
    ]
    typer.echo("\n".join(lines))


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _closed_to(user: str | None, directory: Path) -> Path | None:
    """The folder on the way to the data directory that the jobs' user cannot pass, if any."""
    import pwd

    from corral.agent.sandbox import blocked_on_the_way

    if user is None or os.geteuid() != 0:
        return None
    try:
        return blocked_on_the_way(directory, pwd.getpwnam(user))
    except KeyError:
        return None  # the node says so at the first job
