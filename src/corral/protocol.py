"""The node protocol: everything the control plane and its node agents say to each other, as
typed models (docs/node-protocol.md). The server validates what agents send with them; the agent
(`corral.agent.runner`) and the load generator (`corral.fleet`) build their requests and read the
answers with them. Nothing here imports the rest of Corral: each side may import it.

Versioned: an agent sends `protocol` when it registers; the server refuses another version with
426 and says both, and answers its own, which the agent checks (`check_version`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PROTOCOL_VERSION = 1
MAX_INT = 2**31 - 1  # the largest id, count or incarnation (a PostgreSQL INTEGER)
MAX_CURSOR = 2**53  # the largest outbox cursor a poll may name
MAX_NODE_GPUS = 1024  # GPUs one node may declare (a bound, so that a huge number is a 422)
HEARTBEAT_INTERVAL = 5.0  # seconds between heartbeats, at most (the registration says)
LEASE = 20.0  # seconds a heartbeat's lease lasts when the answer says nothing

# `unhealthy` maps a GPU index, written as a string (a JSON key), to why it is unhealthy
GpuIndexKey = Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,3})$")]
Why = Annotated[str, Field(max_length=500)]


class ProtocolMismatch(Exception):
    """The other side speaks another version of the node protocol."""


def check_version(theirs: object, side: str = "server") -> None:
    """Raise `ProtocolMismatch` unless `theirs` is this protocol version (absent: version 1)."""
    version = 1 if theirs is None else theirs
    if version != PROTOCOL_VERSION:
        raise ProtocolMismatch(
            f"the {side} speaks node protocol {version}, this agent speaks {PROTOCOL_VERSION}: "
            "run the agent and the server of the same Corral release"
        )


def mismatch_message(theirs: int) -> str:
    return (
        f"this agent speaks node protocol {theirs}, the server speaks {PROTOCOL_VERSION}: "
        "run the agent and the server of the same Corral release"
    )


# ---- registration ------------------------------------------------------------------------------
class LocalAttempt(BaseModel):
    """An attempt whose workers run on the node now."""

    job: str
    attempt: int = Field(ge=1, le=MAX_INT)

    @property
    def key(self) -> str:
        return f"{self.job}/{self.attempt}"


class Registration(BaseModel):
    """`POST /v1/agents/register`: the node's inventory and what runs there."""

    protocol: int = Field(
        default=PROTOCOL_VERSION, ge=0, le=MAX_INT, description="the agent's node protocol version"
    )
    node: str = Field(min_length=1, max_length=200)
    gpus: int = Field(ge=0, le=MAX_NODE_GPUS)
    gpu_model: str = ""
    gpu_memory_gib: float = Field(default=0.0, ge=0, le=1 << 20)
    cpus: int = Field(default=0, ge=0, le=1 << 20)
    memory_gib: float = Field(default=0.0, ge=0, le=1 << 30)
    labels: dict[str, str] = Field(default_factory=dict)
    nvlink: list[list[Annotated[int, Field(ge=0, lt=MAX_NODE_GPUS)]]] = Field(default_factory=list)
    address: str = ""
    network: dict[str, Any] = Field(default_factory=dict)
    logs_url: str = Field(default="", max_length=300, description="where the agent serves worker logs")
    running: list[LocalAttempt] = Field(
        default_factory=list, description="attempts whose workers run on the node now (a restarted agent's)"
    )
    unhealthy: dict[GpuIndexKey, Why] = Field(
        default_factory=dict, description="GPU index -> why it is unhealthy"
    )


class Registered(BaseModel):
    """The answer to a registration."""

    model_config = ConfigDict(extra="allow")

    protocol: int = PROTOCOL_VERSION
    node: str
    incarnation: int
    after: int = Field(
        default=0, description="the outbox cursor to poll from: older orders are not for this agent"
    )
    live: list[LocalAttempt] = Field(default_factory=list, description="running attempts the server knows")
    stale: list[str] = Field(
        default_factory=list, description="`job/attempt` of ended attempts whose workers must be killed"
    )
    state: str
    reason: str = ""
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL
    lease_s: float = LEASE

    def stale_keys(self) -> list[tuple[str, int]]:
        out = []
        for x in self.stale:
            job, _, attempt = x.rpartition("/")
            out.append((job, int(attempt)))
        return out


# ---- heartbeat ---------------------------------------------------------------------------------
class GpuSample(BaseModel):
    index: int = Field(ge=0, lt=MAX_NODE_GPUS)
    uuid: str = Field(default="", max_length=100)
    utilization: float | None = Field(default=None, ge=0, le=1)
    memory_used_bytes: int | None = Field(default=None, ge=0, le=1 << 60)
    memory_total_bytes: int | None = Field(default=None, ge=0, le=1 << 60)


class Heartbeat(BaseModel):
    """`POST /v1/agents/{node}/heartbeat`: kept in the API's memory only."""

    incarnation: int = Field(ge=-MAX_INT, le=MAX_INT)
    gpus: list[GpuSample] | None = Field(
        default=None, max_length=64, description="NVML samples, where present"
    )
    unhealthy: dict[GpuIndexKey, Why] | None = Field(
        default=None, description="GPU index -> why it is unhealthy"
    )
    unclean: list[str] | None = Field(default=None, description="attempts whose processes survived a kill")


class HeartbeatAnswer(BaseModel):
    model_config = ConfigDict(extra="allow")

    ok: bool = True
    lease_s: float = LEASE


# ---- orders (the long poll) --------------------------------------------------------------------
class Poll(BaseModel):
    """`GET /v1/agents/{node}/assignments?after=&wait=`: orders after the cursor, waiting up to
    `wait` s for one."""

    after: int = Field(default=0, ge=0, le=MAX_CURSOR)
    wait: float = Field(default=0.0, ge=0, le=60)


class StopWhy(StrEnum):
    """Why a stop order was sent (the workers see it through `corral.job.stop_reason()`)."""

    PREEMPT = "preempt"  # a higher-priority job needs the GPUs
    CANCEL = "cancel"  # a user cancelled the job
    REQUEUE = "requeue"  # a user or an admin requeued it
    DRAIN = "drain"  # the node is drained
    GPU = "gpu"  # one of its GPUs turned unhealthy
    PEER_FAILED = "peer_failed"  # another node's workers of the gang exited
    ENDED = "ended"  # the attempt has ended on the server: kill what is left, now


class StartOrder(BaseModel):
    """Run the node's replicas of an attempt."""

    model_config = ConfigDict(extra="allow")

    kind: Literal["start"] = "start"
    job: str
    attempt: int
    placement: list[dict[str, Any]]  # [{"node", "gpus", "replica"?}], replica 0 first
    run_as: str = ""  # the user the workers run as ("": the job's own)
    spec: dict[str, Any]  # the job's request (DESIGN.md 4.2)
    addresses: dict[str, str] = Field(default_factory=dict)
    networks: dict[str, Any] = Field(default_factory=dict)
    master_port: int | None = None
    time_limit_s: float | None = None  # seconds on the agent's monotonic clock (DESIGN.md 6.5)
    seq: int = 0  # the outbox cursor of this order (set when polled)


class StopOrder(BaseModel):
    """Stop an attempt by the checkpoint contract: the signal in `signal_in` s, then `grace` s,
    then a kill."""

    model_config = ConfigDict(extra="allow")

    kind: Literal["stop"] = "stop"
    job: str
    attempt: int
    grace: float = 0.0
    signal_in: float | None = None
    why: StopWhy
    seq: int = 0


class TerminalOrder(BaseModel):
    """Open a shell inside a running attempt (`corral alloc`, `corral attach`): the agent connects
    its own authenticated WebSocket to `/v1/agents/{node}/terminals/{session}` and relays a pty.
    Fleet agents run no processes and ignore it."""

    model_config = ConfigDict(extra="allow")

    kind: Literal["terminal"] = "terminal"
    job: str
    attempt: int
    # checked by the server when it orders the session and again by the agent (a malformed one is
    # ignored there, not refused here: one bad order must not refuse the node's whole batch)
    rank: int = 0
    session: str
    rows: int = 24
    cols: int = 80
    term: str = "xterm"
    end: bool = False  # an allocation: the attempt ends when the shell does
    seq: int = 0


Order = Annotated[StartOrder | StopOrder | TerminalOrder, Field(discriminator="kind")]


class Orders(BaseModel):
    orders: list[Order]


def stop_order(
    job: str, attempt: int, grace: float, why: StopWhy | str, signal_in: float | None = None
) -> dict[str, Any]:
    """A stop order's outbox body (a `StopOrder` without its cursor). Built as a plain dict, not
    through the model: the scheduler writes thousands of orders per commit."""
    order: dict[str, Any] = {"kind": "stop", "job": job, "attempt": attempt, "grace": grace}
    if signal_in is not None:
        order["signal_in"] = signal_in
    order["why"] = StopWhy(why).value
    return order


def start_order(
    job: str,
    attempt: int,
    placement: list[dict[str, Any]],
    run_as: str,
    spec: dict[str, Any],
    addresses: dict[str, str],
    networks: dict[str, Any],
    master_port: int | None,
    time_limit_s: float | None,
) -> dict[str, Any]:
    """A start order's outbox body (a `StartOrder` without its cursor), as a plain dict."""
    return {
        "kind": "start",
        "job": job,
        "attempt": attempt,
        "placement": placement,
        "run_as": run_as,
        "spec": spec,
        "addresses": addresses,
        "networks": networks,
        "master_port": master_port,
        "time_limit_s": time_limit_s,
    }


# ---- reports -----------------------------------------------------------------------------------
class ReportStatus(StrEnum):
    RUNNING = "running"  # the workers have launched
    EXITED = "exited"  # the node's workers have exited (the scheduler then ends the attempt)
    CHECKPOINT = "checkpoint"  # the job recorded a checkpoint


class ExitWhy(StrEnum):
    """Why the workers exited, when the agent knows (an `exited` report)."""

    NONE = ""  # they exited by themselves (the exit code says how)
    TIME_LIMIT = "time_limit"  # the attempt reached its time limit
    SETUP = "setup"  # the sandbox, the user or the files could not be set up
    LAUNCH = "launch"  # the workers could not be launched
    LOST = "lost"  # killed on the node by its fence (its lease expired) or the node came back without them


class Report(BaseModel):
    """`POST /v1/agents/{node}/reports`."""

    incarnation: int = Field(ge=-MAX_INT, le=MAX_INT)
    job: str
    attempt: int = Field(ge=1, le=MAX_INT)
    status: ReportStatus
    exit_code: int | None = Field(default=None, ge=-MAX_INT, le=MAX_INT)
    rank: int | None = Field(default=None, ge=0, le=MAX_INT)
    why: ExitWhy = Field(default=ExitWhy.NONE, description="exited: why, when the agent knows")
    message: str = Field(default="", max_length=2000, description="exited: what went wrong, for people")
    log_tail: str = Field(
        default="", max_length=8000, description="exited: last lines of the failing rank's log"
    )
    step: int | None = Field(
        default=None, ge=-(2**63), lt=2**63, description="checkpoint: the step the job recorded"
    )
    age_s: float | None = Field(
        default=None, ge=0, le=1e9, description="checkpoint: seconds since it was recorded"
    )

    def body(self) -> dict[str, Any]:
        """The report as sent: fields without a value left out."""
        return {k: v for k, v in self.model_dump(mode="json").items() if v not in (None, "")}
