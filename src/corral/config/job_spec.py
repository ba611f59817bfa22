"""Parses the job spec (DESIGN.md 4.2) into a JobRequest, and resolves it against a cluster to a JobSpec."""

from __future__ import annotations

import json
import re
import shlex
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationError,
)

from corral.config.cluster_file import ClusterConfig
from corral.config.durations import format_duration, parse_duration
from corral.config.gpu_models import normalise_gpu_model
from corral.config.invalid import InvalidValue
from corral.config.notify_config import notify_events
from corral.config.spec_bounds import (
    MAX_CPUS,
    MAX_MEMORY_GIB,
    MAX_NAME,
    MAX_RESTARTS,
    bounded_time_limit,
    launchable_argv,
    launchable_env,
    mount_target,
    no_nul_path,
)
from corral.config.unknown_fields import check_known_fields
from corral.config.yaml_source import FieldPath, Locator, load_yaml
from corral.core.errors import ConfigError
from corral.core.model import (
    PACK_NODE,
    PACK_NVLINK,
    JobId,
    JobSpec,
    Launch,
    PriorityClass,
    QueueName,
    Topology,
)

__all__ = [
    "CheckpointRequest",
    "JobRequest",
    "MountRequest",
    "TopologyRequest",
    "gpus_shorthand",
    "load_job_spec",
    "parse_job_spec",
    "to_job_spec",
]

MAX_GRACE = 3600.0
_COMMAND_FIX = 'write the argv as a list, e.g. ["python", "train.py"]'
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _time_limit(value: object) -> float | None:
    if value is None:
        return None
    seconds = parse_duration(value)
    if seconds <= 0:
        raise InvalidValue("a time limit must be positive", "write e.g. 90m or 4h")
    return seconds


def _grace(value: object) -> float:
    seconds = parse_duration(value)
    if seconds > MAX_GRACE:
        raise InvalidValue(f"a grace of {format_duration(seconds)} is above the 1h maximum", "use at most 1h")
    return seconds


def _signal(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidValue(f"{value!r} is not a signal name", "write a name such as SIGTERM or SIGUSR1")
    name = value.strip().upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    if name not in signal.Signals.__members__ or name in ("SIGKILL", "SIGSTOP"):
        raise InvalidValue(f"{value!r} is not a signal a job can catch", "use SIGTERM, SIGINT or SIGUSR1")
    return name


def _priority(value: object) -> str | int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise InvalidValue(f"{value!r} is not a priority", "write a class name such as normal or high")


def _gpu_models(value: object) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if value is None or not isinstance(items, list) or not all(isinstance(m, str) and m for m in items):
        raise InvalidValue(
            f"{value!r} is not a GPU model", "write a model (H100-80GB), a glob (H100*) or a list"
        )
    return tuple(normalise_gpu_model(m) for m in items)


def _command(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        raise InvalidValue("the command is a string, never run by a shell", _split_hint(value))
    if not isinstance(value, list) or any(
        isinstance(a, bool) or not isinstance(a, str | int | float) for a in value
    ):
        raise InvalidValue(f"{value!r} is not a list of arguments", _COMMAND_FIX)
    argv = tuple(str(a) for a in value)
    if len(argv) == 1 and len(argv[0].split()) > 1:
        raise InvalidValue(f"the one-element command {argv[0]!r} contains spaces", _split_hint(argv[0]))
    return argv


def _split_hint(text: str) -> str:
    try:
        parts = shlex.split(text)
    except ValueError:
        return _COMMAND_FIX
    return f"write the argv as a list: {json.dumps(parts)}" if parts else _COMMAND_FIX


def _env(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise InvalidValue(f"{value!r} is not a mapping", "write env as {NAME: value}")
    env: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise InvalidValue(
                f"{key!r} is not a variable name", "use letters, digits and _, e.g. WANDB_MODE"
            )
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            shown = str(item).lower() if isinstance(item, bool) else item
            raise InvalidValue(f"{key}={shown} is not a string", f'quote the value, e.g. {key}: "{shown}"')
        env[key] = str(item)
    return env


def _absolute_path(value: object) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise InvalidValue(
            f"{value!r} is not an absolute path", "write a path that starts with /, e.g. /data"
        )
    return value


TimeLimit = Annotated[float | None, PlainValidator(_time_limit), AfterValidator(bounded_time_limit)]
Grace = Annotated[float, PlainValidator(_grace)]
SignalName = Annotated[str, PlainValidator(_signal)]
PriorityRef = Annotated[str | int | None, PlainValidator(_priority)]
GpuModels = Annotated[tuple[str, ...], PlainValidator(_gpu_models)]
Command = Annotated[tuple[str, ...], PlainValidator(_command), AfterValidator(launchable_argv)]
Env = Annotated[dict[str, str], PlainValidator(_env), AfterValidator(launchable_env)]
AbsolutePath = Annotated[str, PlainValidator(_absolute_path), AfterValidator(no_nul_path)]
MountTarget = Annotated[str, PlainValidator(_absolute_path), AfterValidator(mount_target)]
NotifyEvents = Annotated[tuple[str, ...], PlainValidator(notify_events)]


class _Entry(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class TopologyRequest(_Entry):
    """`topology: {pack: leaf, required: false}`; no pack means prefer the tightest."""

    pack: str | None = None
    required: bool = False


class CheckpointRequest(_Entry):
    """`checkpoint: {signal: SIGTERM, grace: 60s}`: the signal sent before a kill, and the wait."""

    signal: SignalName = "SIGTERM"
    grace: Grace = 30.0


class MountRequest(_Entry):
    """One `mounts:` entry."""

    source: AbsolutePath
    target: MountTarget
    read_only: bool = False


class JobRequest(_Entry):
    """A job spec as the user wrote it; `to_job_spec` resolves it against a cluster."""

    name: str = Field("", max_length=MAX_NAME)
    queue: str | None = None
    priority: PriorityRef = None
    replicas: int = Field(1, ge=1)
    gpus_per_replica: int = Field(1, ge=0)
    launch: Annotated[Launch, Field(strict=False)] = Launch.PER_GPU
    gpu_model: GpuModels = ()
    topology: TopologyRequest = TopologyRequest()
    time_limit: TimeLimit = None
    preemptible: bool = True
    checkpoint: CheckpointRequest = CheckpointRequest()
    max_restarts: int = Field(3, ge=0, le=MAX_RESTARTS)
    command: Command = ()
    env: Env = Field(default_factory=dict)
    mounts: list[MountRequest] = Field(default_factory=list)
    working_dir: AbsolutePath | None = None  # default: the attempt's own run folder on the node
    cpus_per_replica: int = Field(0, ge=0, le=MAX_CPUS)
    memory_gib_per_replica: float = Field(0.0, ge=0, le=MAX_MEMORY_GIB)
    notify: NotifyEvents = ()  # events sent to the queue's webhook sinks (notify_config.NOTIFY_EVENTS)
    # Slurm's --array and --dependency (config/array_spec.py); the server writes such a job itself
    array: str | None = Field(None, max_length=10_000)
    dependency: str | None = Field(None, max_length=10_000)

    # a plain default: pydantic inspects a default_factory's signature on every parse (~30 µs)
    _locator: Locator | None = PrivateAttr(default=None)


def load_job_spec(path: str | Path) -> JobRequest:
    """Read and validate a job spec file; ConfigError names the file, line, field and fix."""
    data, lines = load_yaml(path)
    return parse_job_spec(data, str(path), lines)


def parse_job_spec(
    data: object, source: str = "job spec", lines: Mapping[FieldPath, int] | None = None
) -> JobRequest:
    """Validate an already-loaded job spec; `lines` (from `load_yaml`) puts line numbers in errors."""
    loc = Locator(source, lines or {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise loc.error(
            (), f"the job spec is a {type(data).__name__}, not a mapping", "write `name:`, `command:`..."
        )
    _refuse_unknown_fields(data, loc)
    try:
        request = JobRequest.model_validate(data)
    except ValidationError as exc:
        raise loc.validation_error(exc) from exc
    request._locator = loc
    return request


# Fields the server adds to a job object (`corral show --json`): a spec that carries them back is
# accepted and they are dropped; `gpus` only when it agrees with replicas x gpus_per_replica.
SERVER_FIELDS = frozenset(
    {
        "id", "state", "user", "team", "attempt", "placement", "reason", "reason_code", "reason_at", "held",
        "priority_class", "restarts", "submit_time", "start_time", "end_time", "exit_code",
        "array_id", "array_task",
        "estimate", "estimate_drawn_on", "estimate_basis", "estimated_end", "reserved_start",
    }
)  # fmt: skip


def _refuse_unknown_fields(data: Mapping[str, object], loc: Locator) -> None:
    """ConfigError for a field the job spec does not define ("did you mean `gpus_per_replica`?")."""
    check_known_fields(data, JobRequest, loc, ignored=SERVER_FIELDS | {"gpus"})
    if "gpus" not in data:
        return
    replicas, per_replica = data.get("replicas", 1), data.get("gpus_per_replica", 1)
    total = replicas * per_replica if isinstance(replicas, int) and isinstance(per_replica, int) else None
    if data["gpus"] != total:
        raise loc.error(
            ("gpus",),
            f"`gpus` is not a job spec field, and {data['gpus']!r} disagrees with replicas x"
            f" gpus_per_replica ({replicas} x {per_replica})",
            "write `replicas:` and `gpus_per_replica:`; `corral submit --gpus N` is the shorthand",
        )


def to_job_spec(
    request: JobRequest,
    *,
    job_id: str,
    seq: int,
    submit_time: float,
    cluster: ClusterConfig,
    default_queue: str,
    user: str = "",
) -> JobSpec:
    """The scheduling spec of `request`: queue, priority value and time limit resolved and checked."""
    loc = request._locator or Locator("job spec")
    queue_name = request.queue or default_queue
    try:
        queue = cluster.queue(queue_name)
    except KeyError:
        names = ", ".join(q.name for q in cluster.queues)
        raise loc.error(("queue",), f"unknown queue {queue_name!r}", f"use one of: {names}") from None
    cls = _resolve_priority(request.priority, cluster, loc)
    if queue.priorities and cls.name not in queue.priorities:
        raise loc.error(
            ("priority",),
            f"queue {queue.name!r} does not allow priority class {cls.name!r}",
            f"use one of: {', '.join(queue.priorities)}, or submit to another queue",
        )
    _check_pack(request.topology.pack, cluster, loc)
    return JobSpec(
        id=JobId(job_id),
        queue=QueueName(queue.name),
        replicas=request.replicas,
        gpus_per_replica=request.gpus_per_replica,
        priority=cls.value,
        priority_class=cls.name,
        submit_time=submit_time,
        seq=seq,
        time_limit=_resolve_time_limit(
            request.time_limit, queue.default_time_limit, queue.max_time_limit, loc
        ),
        preemptible=request.preemptible,
        gpu_model=request.gpu_model,
        cpus_per_replica=request.cpus_per_replica,
        memory_gib_per_replica=request.memory_gib_per_replica,
        topology=Topology(request.topology.pack, request.topology.required),
        launch=request.launch,
        checkpoint_grace=request.checkpoint.grace,
        user=user,
        name=request.name,
    )


def _resolve_priority(priority: str | int | None, cluster: ClusterConfig, loc: Locator) -> PriorityClass:
    names = ", ".join(cls.name for cls in cluster.priority_classes)
    if priority is None:
        return cluster.priority_class(cluster.default_priority)
    for cls in cluster.priority_classes:
        if priority == (cls.name if isinstance(priority, str) else cls.value):
            return cls
    if isinstance(priority, int):
        values = ", ".join(f"{cls.name} ({cls.value})" for cls in cluster.priority_classes)
        raise loc.error(("priority",), f"no priority class has the value {priority}", f"use one of: {values}")
    raise loc.error(("priority",), f"unknown priority class {priority!r}", f"use one of: {names}")


def _resolve_time_limit(
    asked: float | None, default: float | None, maximum: float | None, loc: Locator
) -> float | None:
    limit = asked if asked is not None else default if default is not None else maximum
    if limit is not None and maximum is not None and limit > maximum:
        raise loc.error(
            ("time_limit",),
            f"time limit {format_duration(limit)} exceeds the queue's maximum {format_duration(maximum)}",
            f"ask for at most {format_duration(maximum)}",
        )
    return limit


def _check_pack(pack: str | None, cluster: ClusterConfig, loc: Locator) -> None:
    levels = (PACK_NVLINK, PACK_NODE, *reversed(cluster.topology))
    if pack is not None and pack not in levels:
        raise loc.error(
            ("topology", "pack"), f"unknown pack level {pack!r}", f"use one of: {', '.join(levels)}"
        )


def gpus_shorthand(n: int, largest_node_gpus: int) -> tuple[int, int]:
    """`--gpus N` as (replicas, gpus_per_replica): one replica when N fits a node, else an error."""
    if n < 0:
        raise ConfigError(f"{n} GPUs", where="--gpus", fix="ask for 0 or more GPUs")
    if n <= largest_node_gpus or n == 0:
        return 1, n
    if largest_node_gpus <= 0:
        raise ConfigError(
            "the cluster has no GPUs", where="--gpus", fix="declare nodes with GPUs, or use --gpus 0"
        )
    if n % largest_node_gpus == 0:
        size = largest_node_gpus
    else:
        size = n & -n  # the largest power of two that divides n
        while size > largest_node_gpus:
            size //= 2
    raise ConfigError(
        f"{n} GPUs do not fit one node (the largest has {largest_node_gpus})",
        where="--gpus",
        fix=f"split them: --replicas {n // size} --gpus-per-replica {size}",
    )
