"""The YAML shape of the cluster file (DESIGN.md 4.1) as pydantic models; unknown fields are ignored."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator

from corral.config.durations import parse_duration
from corral.config.invalid import InvalidValue
from corral.config.notify_config import NotifyEntry

__all__ = ["ClusterFile", "Duration", "Labels", "NodeEntry", "PriorityClassEntry", "QueueEntry"]

_NVLINK_FIX = "write nvlink: all, nvlink: none, or groups of GPU indices such as [[0, 1], [2, 3]]"


def _optional_duration(value: object) -> float | None:
    return None if value is None else parse_duration(value)


def _stringify_scalars(value: object) -> object:
    """Label values like `rack: 7` are names too: numbers become strings."""
    if not isinstance(value, dict):
        return value
    return {
        str(k): str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
        for k, v in value.items()
    }


def _nvlink(value: object) -> str | tuple[tuple[int, ...], ...]:
    if value in ("all", "none"):
        return str(value)
    if not isinstance(value, list) or not value:
        raise InvalidValue(f"nvlink {value!r} is not all, none or a list of groups", _NVLINK_FIX)
    groups: list[tuple[int, ...]] = []
    for group in value:
        if not isinstance(group, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in group
        ):
            raise InvalidValue(f"nvlink group {group!r} is not a list of GPU indices", _NVLINK_FIX)
        groups.append(tuple(group))
    return tuple(groups)


Duration = Annotated[float | None, PlainValidator(_optional_duration)]
"""A duration with units (`90m`, `4h`) in seconds; None when absent."""
Labels = Annotated[dict[str, str], BeforeValidator(_stringify_scalars)]
Nvlink = Annotated[str | tuple[tuple[int, ...], ...], PlainValidator(_nvlink)]


class _Entry(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class NodeEntry(_Entry):
    """One `nodes:` entry; `name` may be a hostlist range that stands for many nodes."""

    name: str
    gpus: int = Field(ge=0)
    gpu_model: str = ""
    gpu_memory_gib: float = Field(0.0, ge=0)
    nvlink: Nvlink = "all"
    cpus: int = Field(0, ge=0)
    memory_gib: float = Field(0.0, ge=0)
    labels: Labels = Field(default_factory=dict)
    network: dict[str, Any] = Field(default_factory=dict)
    address: str = ""


class QueueEntry(_Entry):
    """One `queues:` entry."""

    name: str = Field(min_length=1)
    weight: float = Field(1.0, gt=0)
    quota: int = Field(0, ge=0)
    limit: int | None = Field(None, ge=0)
    cohort: str = ""
    lending_limit: int | None = Field(None, ge=0)
    teams: list[str] | None = None
    default_time_limit: Duration = None
    max_time_limit: Duration = None
    priorities: list[str] = Field(default_factory=list)
    mount_allowlist: list[str] = Field(default_factory=list)


class PriorityClassEntry(_Entry):
    """One `priority_classes:` value: `{value: 100, min_runtime: 10m}`."""

    value: int
    min_runtime: Duration = None


class ClusterFile(_Entry):
    """The whole file, before names are expanded and cross-field rules checked."""

    name: str = "cluster"
    topology: list[str] = Field(default_factory=list)
    checkpoint_root: str | None = None
    nodes: list[NodeEntry] = Field(default_factory=list)
    queues: list[QueueEntry] = Field(default_factory=list)
    priority_classes: dict[str, PriorityClassEntry] | None = None
    default_priority: str = "normal"
    notify: NotifyEntry | None = None  # webhook sinks and the URLs they may use (notify_config.py)
