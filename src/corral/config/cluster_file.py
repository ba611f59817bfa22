"""Loads the cluster file (DESIGN.md 4.1) into a ClusterConfig of frozen core specs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from corral.config.cluster_schema import ClusterFile, NodeEntry, PriorityClassEntry, QueueEntry
from corral.config.durations import format_duration
from corral.config.gpu_models import normalise_gpu_model
from corral.config.hostlist import expand_hostlist
from corral.config.invalid import InvalidValue
from corral.config.notify_config import NotifyConfig, build_notify
from corral.config.unknown_fields import check_known_fields
from corral.config.yaml_source import FieldPath, Locator, load_yaml
from corral.core.model import (
    DEFAULT_PRIORITY_CLASSES,
    PACK_NODE,
    PACK_NVLINK,
    NodeName,
    NodeSpec,
    PriorityClass,
    QueueName,
    QueueSpec,
)

__all__ = ["DEFAULT_QUEUE", "ClusterConfig", "load_cluster_file", "parse_cluster_config"]

DEFAULT_QUEUE = "default"
_DOCS = "see docs/cluster-file.md"
NO_NOTIFY = NotifyConfig()


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """A loaded cluster file: topology levels (outermost first), expanded nodes, queues, classes."""

    name: str
    topology: tuple[str, ...]
    checkpoint_root: str | None
    nodes: tuple[NodeSpec, ...]
    queues: tuple[QueueSpec, ...]
    priority_classes: tuple[PriorityClass, ...]
    default_priority: str
    notify: NotifyConfig = NO_NOTIFY  # webhook sinks (none unless `notify:` declares some)

    def priority_class(self, name: str) -> PriorityClass:
        """The class called `name`; KeyError when there is none."""
        for cls in self.priority_classes:
            if cls.name == name:
                return cls
        raise KeyError(f"unknown priority class {name!r}")

    def queue(self, name: str) -> QueueSpec:
        """The queue called `name`; KeyError when there is none."""
        for queue in self.queues:
            if queue.name == name:
                return queue
        raise KeyError(f"unknown queue {name!r}")

    @property
    def gpus(self) -> int:
        """GPUs of every declared node."""
        return sum(node.gpus for node in self.nodes)

    @property
    def largest_node_gpus(self) -> int:
        """GPUs of the largest declared node (0 without nodes)."""
        return max((node.gpus for node in self.nodes), default=0)


def load_cluster_file(path: str | Path) -> ClusterConfig:
    """Read, validate and expand a cluster file; ConfigError names the file, line, field and fix."""
    data, lines = load_yaml(path)
    return parse_cluster_config(data, str(path), lines)


# Kept by the control plane with a stored configuration revision (`corral admin policy`).
REVISION_FIELDS = ("policy", "policy_args")


def parse_cluster_config(
    data: object, source: str = "", lines: Mapping[FieldPath, int] | None = None, *, strict: bool = True
) -> ClusterConfig:
    """Validate an already-loaded document; `lines` (from `load_yaml`) puts line numbers in errors.

    `strict` refuses unknown fields (a typo in a file someone wrote); the control plane reads its
    own stored revisions with `strict=False`, so a revision stored before a field was known loads."""
    loc = Locator(source, lines or {})
    if data is None:
        raise loc.error((), "the cluster file is empty", f"declare at least `nodes:`; {_DOCS}")
    if not isinstance(data, dict):
        raise loc.error(
            (),
            f"the top level is a {type(data).__name__}, not a mapping",
            f"write `name:`, `nodes:`...; {_DOCS}",
        )
    if strict:
        check_known_fields(data, ClusterFile, loc, ignored=REVISION_FIELDS)
    try:
        model = ClusterFile.model_validate(data)
    except ValidationError as exc:
        raise loc.validation_error(exc) from exc
    topology = _check_topology(model.topology, loc)
    nodes = _build_nodes(model.nodes, topology, loc)
    classes = _build_classes(model.priority_classes, loc)
    names = [cls.name for cls in classes]
    if model.default_priority not in names:
        raise loc.error(
            ("default_priority",),
            f"unknown priority class {model.default_priority!r}",
            f"set default_priority to one of: {', '.join(names)}",
        )
    queues = _build_queues(model.queues, names, loc)
    _check_cohort_quotas(queues, sum(node.gpus for node in nodes), loc)
    return ClusterConfig(
        name=model.name,
        topology=topology,
        checkpoint_root=model.checkpoint_root,
        nodes=nodes,
        queues=queues,
        priority_classes=classes,
        default_priority=model.default_priority,
        notify=build_notify(model.notify, [q.name for q in queues], loc),
    )


def _check_topology(levels: list[str], loc: Locator) -> tuple[str, ...]:
    for i, level in enumerate(levels):
        if not level:
            raise loc.error(("topology", i), "empty level name", "name every level, e.g. [spine, leaf]")
        if level in (PACK_NVLINK, PACK_NODE):
            raise loc.error(
                ("topology", i),
                f"{level!r} is a built-in level below the node",
                "rename the level, e.g. rack",
            )
        if level in levels[:i]:
            raise loc.error(("topology", i), f"level {level!r} is listed twice", "list each level once")
    return tuple(levels)


def _build_nodes(entries: list[NodeEntry], topology: tuple[str, ...], loc: Locator) -> tuple[NodeSpec, ...]:
    nodes: list[NodeSpec] = []
    first_entry: dict[str, int] = {}
    for i, entry in enumerate(entries):
        try:
            names = expand_hostlist(entry.name)
        except InvalidValue as exc:
            raise loc.invalid(("nodes", i, "name"), exc) from exc
        _check_labels(entry, i, topology, loc)
        nvlink = _nvlink_groups(entry, i, loc)
        for name in names:
            if name in first_entry:
                raise loc.error(
                    ("nodes", i, "name"),
                    f"node {name} is declared twice (also by nodes[{first_entry[name]}])",
                    "remove one of the two declarations or change the range",
                )
            first_entry[name] = i
            nodes.append(_node_spec(entry, name, nvlink))
    return tuple(nodes)


def _node_spec(entry: NodeEntry, name: str, nvlink: tuple[tuple[int, ...], ...]) -> NodeSpec:
    return NodeSpec(
        name=NodeName(name),
        gpus=entry.gpus,
        gpu_model=normalise_gpu_model(entry.gpu_model),
        gpu_memory_gib=entry.gpu_memory_gib,
        cpus=entry.cpus,
        memory_gib=entry.memory_gib,
        labels=dict(entry.labels),
        nvlink=nvlink,
        address=entry.address,
        network=dict(entry.network),
    )


def _check_labels(entry: NodeEntry, i: int, topology: tuple[str, ...], loc: Locator) -> None:
    levels = ", ".join(topology) or "none declared"
    for key in entry.labels:
        if key not in topology:
            raise loc.error(
                ("nodes", i, "labels", key),
                f"label {key!r} names no level of `topology:` ({levels})",
                f"add {key} to `topology:` or remove the label",
            )
    for level in topology:
        if level not in entry.labels:
            raise loc.error(
                ("nodes", i, "labels"),
                f"no label for the topology level {level!r}",
                f"add `{level}: <name>` to the labels, saying which {level} the node sits in",
            )


def _nvlink_groups(entry: NodeEntry, i: int, loc: Locator) -> tuple[tuple[int, ...], ...]:
    gpus = entry.gpus
    if entry.nvlink == "all":
        return (tuple(range(gpus)),) if gpus else ()
    if isinstance(entry.nvlink, str):  # "none": every GPU alone
        return tuple((gpu,) for gpu in range(gpus))
    groups = entry.nvlink
    listed = sorted(gpu for group in groups for gpu in group)
    if listed != list(range(gpus)):
        missing = sorted(set(range(gpus)) - set(listed))
        twice = sorted({gpu for gpu in listed if listed.count(gpu) > 1})
        extra = sorted(gpu for gpu in set(listed) if not 0 <= gpu < gpus)
        problems = [
            f"{label} {values}"
            for label, values in (("missing", missing), ("listed twice", twice), ("out of range", extra))
            if values
        ]
        raise loc.error(
            ("nodes", i, "nvlink"),
            f"nvlink groups must cover GPUs 0..{gpus - 1} exactly once ({'; '.join(problems)})",
            "put every GPU index of the node in exactly one group, e.g. [[0, 1, 2, 3], [4, 5, 6, 7]]",
        )
    return tuple(group for group in groups if group)


def _build_classes(entries: dict[str, PriorityClassEntry] | None, loc: Locator) -> tuple[PriorityClass, ...]:
    if entries is None:
        return DEFAULT_PRIORITY_CLASSES
    if not entries:
        raise loc.error(
            ("priority_classes",),
            "no priority classes are defined",
            "remove `priority_classes:` for the built-in ones, or define at least one",
        )
    classes: list[PriorityClass] = []
    for name, entry in entries.items():
        for other in classes:
            if other.value == entry.value:
                raise loc.error(
                    ("priority_classes", name, "value"),
                    f"classes {other.name!r} and {name!r} both have value {entry.value}",
                    "give each class its own value",
                )
        classes.append(PriorityClass(name, entry.value, entry.min_runtime or 0.0))
    return tuple(classes)


def _build_queues(entries: list[QueueEntry], classes: list[str], loc: Locator) -> tuple[QueueSpec, ...]:
    if not entries:
        return (QueueSpec(QueueName(DEFAULT_QUEUE), teams=(DEFAULT_QUEUE,)),)
    queues: list[QueueSpec] = []
    for i, entry in enumerate(entries):
        if any(q.name == entry.name for q in queues):
            raise loc.error(("queues", i, "name"), f"queue {entry.name!r} is declared twice", "rename one")
        _check_queue(entry, i, classes, loc)
        queues.append(
            QueueSpec(
                name=QueueName(entry.name),
                weight=float(entry.weight),
                quota=entry.quota,
                limit=entry.limit,
                cohort=entry.cohort,
                lending_limit=entry.lending_limit,
                teams=tuple(entry.teams) if entry.teams is not None else (entry.name,),
                priorities=tuple(entry.priorities),
                default_time_limit=entry.default_time_limit,
                max_time_limit=entry.max_time_limit,
                mount_allowlist=tuple(entry.mount_allowlist),
            )
        )
    return tuple(queues)


def _check_queue(entry: QueueEntry, i: int, classes: list[str], loc: Locator) -> None:
    if entry.limit is not None and entry.quota > entry.limit:
        raise loc.error(
            ("queues", i, "quota"),
            f"quota {entry.quota} exceeds the queue's limit {entry.limit}",
            f"lower quota to at most {entry.limit} or raise limit to at least {entry.quota}",
        )
    for field in ("default_time_limit", "max_time_limit"):
        if getattr(entry, field) == 0:
            raise loc.error(("queues", i, field), "a time limit of zero", "use a positive duration, e.g. 4h")
    default, maximum = entry.default_time_limit, entry.max_time_limit
    if default is not None and maximum is not None and default > maximum:
        raise loc.error(
            ("queues", i, "default_time_limit"),
            f"default_time_limit {format_duration(default)} exceeds "
            f"max_time_limit {format_duration(maximum)}",
            f"lower default_time_limit to at most {format_duration(maximum)}",
        )
    for k, name in enumerate(entry.priorities):
        if name not in classes:
            raise loc.error(
                ("queues", i, "priorities", k),
                f"unknown priority class {name!r}",
                f"use one of: {', '.join(classes)} (or define it under `priority_classes:`)",
            )


def _check_cohort_quotas(queues: tuple[QueueSpec, ...], gpus: int, loc: Locator) -> None:
    totals: dict[str, list[tuple[int, QueueSpec]]] = {}
    for i, queue in enumerate(queues):
        members = totals.setdefault(queue.cohort, [])
        members.append((i, queue))
        total = sum(q.quota for _, q in members)
        if total > gpus:
            cohort = f"cohort {queue.cohort!r}" if queue.cohort else "the queues without a cohort"
            parts = " + ".join(f"{q.name} {q.quota}" for _, q in members)
            raise loc.error(
                ("queues", i, "quota"),
                f"quotas of {cohort} add up to {total} GPUs ({parts}) but the cluster has {gpus}",
                "lower the quotas so that they fit, or declare more nodes",
            )
