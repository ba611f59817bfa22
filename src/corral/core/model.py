"""The scheduling model: frozen specs of nodes, queues, priority classes and jobs, and placements.

Specs are created once and never change; the state that changes every cycle lives in
`corral.core.state`. Times are seconds (floats); "now" is always a parameter, never read.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NewType

JobId = NewType("JobId", str)
NodeName = NewType("NodeName", str)
QueueName = NewType("QueueName", str)

INFINITY = float("inf")


class NodeState(enum.Enum):
    """Lifecycle of a node; only `up` nodes receive new work."""

    UP = "up"
    CORDONED = "cordoned"
    DRAINING = "draining"
    DOWN = "down"
    LOST = "lost"


class Launch(enum.Enum):
    """How a job's replicas become processes (DESIGN.md 4.3)."""

    PER_GPU = "per_gpu"
    PER_NODE = "per_node"


class JobState(enum.Enum):
    """The job states of DESIGN.md 4.7, shared by the API, the CLI and the simulator."""

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({JobState.FINISHED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED})

# Pack levels below the cluster file's own levels; the file's levels follow, innermost first.
PACK_NVLINK = "nvlink"
PACK_NODE = "node"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A machine: integer GPUs of one model, CPUs, memory, labels and NVLink domains.

    `nvlink` holds groups of GPU indices with fast links between them; every GPU is in
    exactly one group (the default is one group with all GPUs).
    """

    name: NodeName
    gpus: int
    gpu_model: str = ""
    gpu_memory_gib: float = 0.0
    cpus: int = 0
    memory_gib: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    nvlink: tuple[tuple[int, ...], ...] = ()
    address: str = ""
    network: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise ValueError(f"node {self.name}: gpus must be >= 0, got {self.gpus}")
        if not self.nvlink:
            groups: tuple[tuple[int, ...], ...] = (tuple(range(self.gpus)),) if self.gpus else ()
            object.__setattr__(self, "nvlink", groups)
        seen = sorted(i for group in self.nvlink for i in group)
        if seen != list(range(self.gpus)):
            raise ValueError(
                f"node {self.name}: nvlink groups must cover GPUs 0..{self.gpus - 1} exactly once, "
                f"got {[list(g) for g in self.nvlink]}"
            )


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A named priority; `min_runtime` protects a running job from preemption for that long."""

    name: str
    value: int
    min_runtime: float = 0.0


DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("low", 0, 600.0),
    PriorityClass("normal", 100, 600.0),
    PriorityClass("high", 1000, 0.0),
    PriorityClass("urgent", 10000, 0.0),
)


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A team's share of the cluster (DESIGN.md 4.1).

    `quota` is the guaranteed GPU count; `limit` caps GPUs in use (quota plus borrowed), None
    meaning the whole cluster; `lending_limit` caps how many idle guaranteed GPUs are lent.
    """

    name: QueueName
    weight: float = 1.0
    quota: int = 0
    limit: int | None = None
    cohort: str = ""
    lending_limit: int | None = None
    teams: tuple[str, ...] = ()
    priorities: tuple[str, ...] = ()
    default_time_limit: float | None = None
    max_time_limit: float | None = None
    mount_allowlist: tuple[str, ...] = ()  # directories job mounts may come from (control plane)

    def __post_init__(self) -> None:
        if self.weight <= 0:
            raise ValueError(f"queue {self.name}: weight must be > 0, got {self.weight}")
        if self.quota < 0:
            raise ValueError(f"queue {self.name}: quota must be >= 0, got {self.quota}")
        if self.limit is not None and self.limit < self.quota:
            raise ValueError(f"queue {self.name}: quota {self.quota} exceeds limit {self.limit}")
        if self.lending_limit is not None and self.lending_limit < 0:
            raise ValueError(f"queue {self.name}: lending_limit must be >= 0")

    @property
    def lendable(self) -> int:
        """How many of the guaranteed GPUs other queues may borrow while they are idle."""
        if self.lending_limit is None:
            return self.quota
        return min(self.quota, self.lending_limit)


@dataclass(frozen=True, slots=True)
class Topology:
    """What a gang prefers or requires about its placement.

    `pack` is None (prefer the tightest), `nvlink`, `node`, or a level of the cluster file.
    """

    pack: str | None = None
    required: bool = False


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A gang: `replicas` x `gpus_per_replica` GPUs, scheduled as one unit.

    `priority` is the class's value; `time_limit` is per attempt (None: unlimited);
    `gpu_model` holds acceptable models or globs (empty: any). `seq` is the submission
    sequence number, the last tie-break before the id.
    """

    id: JobId
    queue: QueueName
    replicas: int = 1
    gpus_per_replica: int = 1
    priority: int = 100
    priority_class: str = "normal"
    submit_time: float = 0.0
    seq: int = 0
    time_limit: float | None = None
    preemptible: bool = True
    gpu_model: tuple[str, ...] = ()
    gpu_memory_gib: float = 0.0
    cpus_per_replica: int = 0
    memory_gib_per_replica: float = 0.0
    node_selector: Mapping[str, str] = field(default_factory=dict)
    topology: Topology = Topology()
    launch: Launch = Launch.PER_GPU
    checkpoint_grace: float = 30.0
    user: str = ""
    name: str = ""

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"job {self.id}: replicas must be >= 1, got {self.replicas}")
        if self.gpus_per_replica < 0:
            raise ValueError(f"job {self.id}: gpus_per_replica must be >= 0, got {self.gpus_per_replica}")
        if self.time_limit is not None and self.time_limit <= 0:
            raise ValueError(f"job {self.id}: time_limit must be > 0, got {self.time_limit}")

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """Where one replica runs: a node and GPU indices on it."""

    node: NodeName
    gpus: tuple[int, ...]


Placement = tuple[ReplicaPlacement, ...]
"""One entry per replica, in rank order."""
