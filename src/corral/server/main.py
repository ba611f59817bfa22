"""`corral server`: migrate the store, make the first admin token, start the scheduler process
and serve the API with uvicorn."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from sqlalchemy import Connection, func, select
from sqlalchemy.engine import make_url

from corral.config.yaml_source import load_yaml
from corral.server import metrics_dir
from corral.server.app import create_app
from corral.server.auth import create_token
from corral.server.cluster import apply_revision, get_setting, put_setting
from corral.server.context import Context
from corral.server.leader import replica_id
from corral.server.liveness import mark_unheard
from corral.server.throttle import FailedAuthThrottle
from corral.store import schema
from corral.store.engine import Engines, make_engines, upgrade
from corral.store.inuse import hold_database

log = logging.getLogger("corral.server")


@dataclass
class ServerOptions:
    database_url: str
    host: str = "127.0.0.1"
    port: int = 8400
    data_dir: Path = Path(".")
    policy: str = "default"
    cluster_file: Path | None = None
    allow_dynamic_nodes: bool = False
    insecure_http: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    scheduler: bool = True  # start the scheduler process
    durability: str = "normal"
    log_level: str = "warning"
    reports_dir: Path | None = None  # simulation reports the dashboard lists (default: data_dir/reports)
    require_evidence_days: float = 0.0  # refuse configuration changes without a what-if this long (0: off)
    lost_after: float = 30.0  # seconds of silence before a node is lost (0: never)
    auth_failures: int = 20  # failed authentications an address may make at once (0: no limit)
    banner: bool = True  # say where things are once listening (`corral up` says it its own way)
    replica: str = ""  # this replica's name in the leader lease (default: host and data directory)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(opts: ServerOptions) -> None:
    """DESIGN.md 6.6: no plain HTTP beyond loopback unless asked for by name."""
    if is_loopback(opts.host) or opts.insecure_http or (opts.tls_cert and opts.tls_key):
        return
    raise SystemExit(
        f"refusing to listen on {opts.host} without TLS: tokens would cross the network in clear.\n"
        "Give --tls-cert and --tls-key, listen on 127.0.0.1, or accept the risk with --insecure-http."
    )


def prepare_store(opts: ServerOptions) -> tuple[Engines, str | None]:
    """Migrate; apply the cluster file as a new revision when given; make the first admin token."""
    engines = make_engines(opts.database_url, opts.durability)
    upgrade(engines)
    token = None
    with engines.writer.begin() as conn:
        # the file that made the active revision is not parsed again (YAML and checks of 10,000 nodes: ~1 s)
        digest = _file_digest(opts.cluster_file) if opts.cluster_file is not None else ""
        if opts.cluster_file is not None and not _is_active_file(conn, digest):
            body, _ = load_yaml(opts.cluster_file)
            from corral.config.cluster_file import parse_cluster_config

            parse_cluster_config(body, str(opts.cluster_file))  # errors with line numbers, before storing
            active = get_setting(conn, "config.active")
            current = None
            if active is not None:
                current = conn.execute(
                    select(schema.config_revisions.c.body).where(schema.config_revisions.c.id == int(active))
                ).scalar()
            import json

            if current is None or json.loads(current) != body:
                apply_revision(conn, body, "corral server", f"loaded from {opts.cluster_file}")  # type: ignore[arg-type]
            put_setting(conn, "config.file", f"{digest} {get_setting(conn, 'config.active')}")
        admins = conn.execute(
            select(func.count()).select_from(schema.tokens).where(schema.tokens.c.role == "admin")
        ).scalar()
        if not admins:
            _, token = create_token(conn, "admin", "admin", by="corral server")
            # written before the commit: a crash in between leaves a file whose token the database
            # never had, and the next start (still no admin) makes a new one; never the other way
            _write_secret(opts.data_dir / "admin-token", token)
        # before the scheduler starts: no node takes new work until it heartbeats to this process
        mark_unheard(conn, time.time())
    return engines, token


def private_dir(path: Path) -> None:
    """The data directory: made 0700; one of ours that others may read or write narrowed to 0711
    (a node agent sharing it lets jobs pass through to their own logs and checkpoints)."""
    if not path.exists():
        path.mkdir(parents=True, mode=0o700)
        os.chmod(path, 0o700)
        return
    info = path.lstat()
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o066:
        os.chmod(path, stat.S_IMODE(info.st_mode) & 0o711)


def _write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""  # load_yaml says what is wrong with the path


def _is_active_file(conn: Connection, digest: str) -> bool:
    """True when the active revision was made from a file of this digest (setting `config.file`)."""
    active = get_setting(conn, "config.active")
    return bool(digest) and active is not None and get_setting(conn, "config.file") == f"{digest} {active}"


def start_scheduler(opts: ServerOptions, env: dict[str, str]) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "corral.server.scheduler_main",
        "--database-url",
        opts.database_url,
        "--policy",
        opts.policy,
        "--holder",
        opts.replica,
    ]
    # the scheduler exits once this process is gone, even if it was gone before the scheduler looked
    return subprocess.Popen(cmd, env={**env, "CORRAL_SERVER_PID": str(os.getpid())})


class Supervisor:
    """Keeps the scheduler process running: restarted (after a second) if it exits on its own."""

    def __init__(self, opts: ServerOptions, env: dict[str, str]) -> None:
        self.opts, self.env = opts, env
        self.proc = start_scheduler(opts, env)
        self.stopping = threading.Event()
        self.restarts = 0
        self.thread = threading.Thread(target=self._watch, name="corral-scheduler-watch", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stopping.wait(0.5):
            code = self.proc.poll()
            if code is None:
                continue
            self.restarts += 1
            log.error("the scheduler process exited with %s; restarting it", code)
            print(f"corral: the scheduler process exited with {code}; restarting it", file=sys.stderr)
            if self.stopping.wait(1.0):
                return
            self.proc = start_scheduler(self.opts, self.env)

    def stop(self) -> None:
        self.stopping.set()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def serve(opts: ServerOptions) -> None:
    check_listen(opts)
    os.umask(0o077)  # the database, tokens and metrics are the service user's alone (DESIGN.md 6.6)
    private_dir(opts.data_dir)
    metrics_dir.prepare(opts.data_dir)  # done first by the commands, before metrics are imported
    lease = hold_database(opts.database_url)  # `corral admin restore` refuses while it is held
    opts.replica = opts.replica or replica_id(str(opts.data_dir.resolve()))
    engines, token = prepare_store(opts)
    if token is not None:
        path = opts.data_dir / "admin-token"
        print(f"corral: first admin token written to {path}", file=sys.stderr)

    scheduler = Supervisor(opts, dict(os.environ)) if opts.scheduler else None
    ctx = Context(
        engines, allow_dynamic_nodes=opts.allow_dynamic_nodes, lost_after=opts.lost_after, policy=opts.policy
    )
    ctx.replica = opts.replica if opts.scheduler else ""
    ctx.auth_failures = FailedAuthThrottle(opts.auth_failures)
    app = create_app(ctx)
    app.state.reports_dir = opts.reports_dir or opts.data_dir / "reports"
    app.state.require_evidence_days = opts.require_evidence_days
    config = uvicorn.Config(
        app,
        host=opts.host,
        port=opts.port,
        log_level=opts.log_level,
        access_log=False,
        ssl_certfile=str(opts.tls_cert) if opts.tls_cert else None,
        ssl_keyfile=str(opts.tls_key) if opts.tls_key else None,
        timeout_graceful_shutdown=3,  # long polls (agents, `events --follow`) would hold a stop for a minute
    )

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started and opts.banner:
                print(banner(opts), file=sys.stderr, flush=True)

        def handle_exit(self, sig: int, frame: Any) -> None:
            # a shutdown is under way: the scheduler (which got the same signal from the process
            # group) must not be restarted; uvicorn re-raises the signal after it, so `finally`
            # below may never run
            if scheduler is not None:
                scheduler.stopping.set()
            super().handle_exit(sig, frame)

    server = Server(config)
    try:
        server.run()
    finally:
        if scheduler is not None:
            scheduler.stop()
        lease.close()


def banner(opts: ServerOptions) -> str:
    """What `corral server` prints once it listens: where the API, the dashboard and the data are."""
    scheme = "https" if opts.tls_cert and opts.tls_key else "http"
    host = f"[{opts.host}]" if ":" in opts.host else opts.host
    url = f"{scheme}://{host}:{opts.port}"
    database = make_url(opts.database_url).render_as_string(hide_password=True)
    scheduler = "its own process" if opts.scheduler else "not started here (--no-scheduler)"
    data = opts.data_dir.resolve()
    return "\n".join(
        [
            f"corral server: API {url}/v1 (OpenAPI schema {url}/openapi.json)",
            f"  dashboard  {url}/  (`corral dashboard` prints a login link)",
            f"  data       {data}  (admin token: {data / 'admin-token'})",
            f"  database   {database}",
            f"  scheduler  {scheduler}, policy {opts.policy} unless a configuration revision names one",
            "  stop with Ctrl-C",
        ]
    )
