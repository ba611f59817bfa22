"""The simulator's trace file (DESIGN.md 4.5): the `TraceJob` value, `read_trace` and `write_trace`."""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

from corral.core.errors import ConfigError, TraceError
from corral.sim.trace_cells import cell_error, parse_bool, parse_count, parse_seconds

COLUMNS: tuple[str, ...] = (
    "job_id",
    "submit_time",
    "duration",
    "gpus",
    "queue",
    "replicas",
    "gpus_per_replica",
    "priority",
    "gpu_model",
    "time_limit",
    "preemptible",
    "checkpoint_interval",
    "user",
    "dependency",
)
REQUIRED: tuple[str, ...] = ("job_id", "submit_time", "duration", "gpus")
MODEL_SEPARATOR = "|"


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceJob:
    """One job of a trace: what is submitted when, and how many seconds of work it needs."""

    job_id: str
    submit_time: float  # seconds from the trace's start
    duration: float  # seconds of work when placed in the tightest topology
    gpus: int
    queue: str | None = None
    replicas: int
    gpus_per_replica: int
    priority: str | None = None  # a priority class name
    gpu_model: tuple[str, ...] = ()  # acceptable models or globs; empty: any
    time_limit: float | None = None  # seconds; None: the queue's default, else unlimited
    preemptible: bool = True
    checkpoint_interval: float | None = None  # seconds; None or 0: never checkpoints
    user: str | None = None
    dependency: str | None = None  # Slurm's syntax on trace job ids, e.g. afterok:a:b (sim/dependencies.py)

    def __post_init__(self) -> None:
        if (
            self.replicas < 1
            or self.gpus_per_replica < 0
            or self.gpus != self.replicas * self.gpus_per_replica
        ):
            raise TraceError(
                f"job {self.job_id!r}: gpus={self.gpus} is not replicas={self.replicas}"
                f" x gpus_per_replica={self.gpus_per_replica} (replicas must be 1 or more)"
            )
        if not (self.submit_time >= 0 and self.duration >= 0):
            raise TraceError(
                f"job {self.job_id!r}: submit_time={self.submit_time} and duration={self.duration}"
                " must be 0 or more seconds"
            )


def split_gpus(gpus: int, largest_node_gpus: int) -> tuple[int, int]:
    """(replicas, gpus_per_replica) for a job that gives only `gpus` (DESIGN.md 4.5).

    Up to the largest node: one replica. A multiple of the largest node: whole nodes. Otherwise
    replicas of the largest power of two that divides `gpus` and fits a node.
    """
    if largest_node_gpus < 1:
        raise ConfigError(
            f"largest_node_gpus is {largest_node_gpus}",
            where="largest_node_gpus",
            fix="give the GPU count of the cluster's largest node (1 or more)",
        )
    if gpus <= largest_node_gpus:
        return 1, gpus
    if gpus % largest_node_gpus == 0:
        return gpus // largest_node_gpus, largest_node_gpus
    size = gpus & -gpus  # the largest power of two that divides gpus
    while size > largest_node_gpus:
        size //= 2
    return gpus // size, size


@dataclass(frozen=True, slots=True)
class _Columns:
    """Where each known column sits in a file's header (-1: absent)."""

    job_id: int
    submit_time: int
    duration: int
    gpus: int
    queue: int
    replicas: int
    gpus_per_replica: int
    priority: int
    gpu_model: int
    time_limit: int
    preemptible: int
    checkpoint_interval: int
    user: int
    dependency: int


def _columns(header: Sequence[str], path: object) -> _Columns:
    names = [name.strip() for name in header]
    missing = [name for name in REQUIRED if name not in names]
    if missing:
        raise TraceError(
            f"{path}, line 1: missing required column(s) {', '.join(missing)}; the header has"
            f" {', '.join(repr(n) for n in names)} (fix: the header must name at least"
            f" {', '.join(REQUIRED)}; optional: {', '.join(c for c in COLUMNS if c not in REQUIRED)})"
        )
    for name in COLUMNS:
        if names.count(name) > 1:
            raise TraceError(f"{path}, line 1: column {name!r} appears twice (fix: keep one)")
    return _Columns(**{name: names.index(name) if name in names else -1 for name in COLUMNS})


def read_trace(path: str | os.PathLike[str], *, largest_node_gpus: int) -> list[TraceJob]:
    """Every job of a trace file, sorted stably by submit time; the first malformed row is an error."""
    split_gpus(0, largest_node_gpus)  # checks the argument before the file is read
    jobs: list[TraceJob] = []
    lines: dict[str, int] = {}
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise TraceError(
                f"{path}: the file is empty (fix: start it with a header line: {','.join(REQUIRED)})"
            )
        parse = _RowParser(_columns(header, path), path, largest_node_gpus)
        width = len(header)
        for row in reader:
            if not row:
                continue  # a blank line holds no job
            line = reader.line_num
            if len(row) != width:
                raise TraceError(
                    f"{path}, line {line}: {len(row)} cells but the header has {width} columns"
                    " (fix: give every column a cell, empty for the default; quote cells that hold commas)"
                )
            job = parse(row, line)
            first = lines.setdefault(job.job_id, line)
            if first != line:
                raise cell_error(
                    path,
                    line,
                    "job_id",
                    f"{job.job_id!r} is already the id of line {first}",
                    "make ids unique",
                )
            jobs.append(job)
    jobs.sort(key=attrgetter("submit_time"))
    return jobs


def _is_blank(text: str) -> bool:
    return not text or text.isspace()


def _verbatim(text: str, path: object, line: int) -> str:
    return text


def _preemptible(text: str, path: object, line: int) -> bool:
    return parse_bool(text, path, line, "preemptible")


def _checkpoint(text: str, path: object, line: int) -> float:
    return parse_seconds(text, path, line, "checkpoint_interval")


class _RowParser:
    """Turns the rows of one file into jobs.

    The cells that decide a job's shape, and the optional cells, repeat a lot (a few GPU counts,
    queue names, booleans): each distinct combination is parsed and checked once, then reused.
    """

    def __init__(self, columns: _Columns, path: object, largest: int) -> None:
        self.c = columns
        self.path = path
        self.largest = largest
        converters: dict[str, Callable[[str, object, int], object]] = {
            "queue": _verbatim,
            "priority": _verbatim,
            "gpu_model": _models,
            "time_limit": _time_limit,
            "preemptible": _preemptible,
            "checkpoint_interval": _checkpoint,
            "user": _verbatim,
            "dependency": _verbatim,
        }
        self.optional = [
            (name, getattr(columns, name), f) for name, f in converters.items() if getattr(columns, name) >= 0
        ]
        shape_indices = [i for i in (columns.gpus, columns.replicas, columns.gpus_per_replica) if i >= 0]
        self.shape_key = itemgetter(*shape_indices)
        self.option_key = itemgetter(*(i for _, i, _ in self.optional)) if self.optional else None
        self.shapes: dict[object, tuple[int, int, int]] = {}  # cells -> (gpus, replicas, gpus_per_replica)
        self.options: dict[object, dict[str, Any]] = {}  # cells -> the optional fields they give

    def __call__(self, row: Sequence[str], line: int) -> TraceJob:
        c, path = self.c, self.path
        job_id = row[c.job_id]
        if _is_blank(job_id):
            raise cell_error(path, line, "job_id", "the cell is empty", "give every job a unique id")
        key = self.shape_key(row)
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = self._shape(row, line)
        extra: dict[str, Any] = {}
        if self.option_key is not None:
            key = self.option_key(row)
            found = self.options.get(key)
            if found is None:
                found = self.options[key] = self._options(row, line)
            extra = found
        return TraceJob(
            job_id=job_id,
            submit_time=parse_seconds(row[c.submit_time], path, line, "submit_time"),
            duration=parse_seconds(row[c.duration], path, line, "duration"),
            gpus=shape[0],
            replicas=shape[1],
            gpus_per_replica=shape[2],
            **extra,
        )

    def _options(self, row: Sequence[str], line: int) -> dict[str, Any]:
        """The optional fields a row gives (blank cells give none)."""
        return {name: f(row[i], self.path, line) for name, i, f in self.optional if not _is_blank(row[i])}

    def _shape(self, row: Sequence[str], line: int) -> tuple[int, int, int]:
        """(gpus, replicas, gpus_per_replica) from the given cells, checked, or by `split_gpus`."""
        c, path = self.c, self.path
        gpus = parse_count(row[c.gpus], path, line, "gpus")
        text_r = "" if c.replicas < 0 else row[c.replicas]
        text_g = "" if c.gpus_per_replica < 0 else row[c.gpus_per_replica]
        if _is_blank(text_r) and _is_blank(text_g):
            return (gpus, *split_gpus(gpus, self.largest))
        replicas = None if _is_blank(text_r) else parse_count(text_r, path, line, "replicas", minimum=1)
        per = None if _is_blank(text_g) else parse_count(text_g, path, line, "gpus_per_replica")
        return (gpus, *_checked_shape(replicas, per, gpus, path, line))


def _checked_shape(
    replicas: int | None, per: int | None, gpus: int, path: object, line: int
) -> tuple[int, int]:
    """The shape from replicas, gpus_per_replica or both (one may be None), checked against `gpus`."""
    if replicas is not None and per is not None:
        if replicas * per != gpus:
            raise cell_error(
                path,
                line,
                "gpus",
                f"{gpus} is not replicas x gpus_per_replica = {replicas} x {per}",
                f"write gpus={replicas * per}, or change replicas or gpus_per_replica",
            )
        return replicas, per
    if replicas is not None:
        if gpus % replicas:
            raise cell_error(
                path,
                line,
                "replicas",
                f"{gpus} GPUs do not split evenly into {replicas} replicas",
                "give gpus_per_replica too, or a replica count that divides gpus",
            )
        return replicas, gpus // replicas
    assert per is not None
    if per == 0 or gpus % per:
        raise cell_error(
            path,
            line,
            "gpus_per_replica",
            f"{gpus} GPUs are not a whole number of replicas of {per}",
            "give replicas too, or a gpus_per_replica that divides gpus",
        )
    return gpus // per, per


def _models(text: str, path: object, line: int) -> tuple[str, ...]:
    models = tuple(part.strip() for part in text.split(MODEL_SEPARATOR))
    if not all(models):
        raise cell_error(
            path,
            line,
            "gpu_model",
            f"{text!r} has an empty model name",
            "separate models with one |, as in A100*|H100*",
        )
    return models


def _time_limit(text: str, path: object, line: int) -> float:
    value = parse_seconds(text, path, line, "time_limit")
    if value == 0:
        raise cell_error(
            path, line, "time_limit", "0 is not a time limit", "leave the cell empty for no limit"
        )
    return value


def write_trace(path: str | os.PathLike[str], jobs: Iterable[TraceJob]) -> int:
    """Write `jobs` in the trace form, every column present; returns the number of jobs written."""
    count = 0
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(COLUMNS)
        for job in jobs:
            writer.writerow(_cells(job))
            count += 1
    return count


def _cells(job: TraceJob) -> tuple[str | int, ...]:
    return (
        job.job_id,
        _number(job.submit_time),
        _number(job.duration),
        job.gpus,
        job.queue or "",
        job.replicas,
        job.gpus_per_replica,
        job.priority or "",
        MODEL_SEPARATOR.join(job.gpu_model),
        "" if job.time_limit is None else _number(job.time_limit),
        "true" if job.preemptible else "false",
        "" if job.checkpoint_interval is None else _number(job.checkpoint_interval),
        job.user or "",
        job.dependency or "",
    )


def _number(value: float) -> str:
    """The shortest text that reads back as exactly `value` (whole numbers without `.0`)."""
    value = float(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)
