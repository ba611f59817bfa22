"""Loader for the Philly trace of the Pollux artifact (`philly_pollux/`) and its Helios per-VC references."""

from __future__ import annotations

import csv
import os
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path

from corral.core.errors import ConfigError, TraceError
from corral.sim.loaders.location import resolve
from corral.sim.trace import TraceJob, split_gpus
from corral.sim.trace_cells import cell_error, column_indices, parse_count, parse_float, parse_seconds

PHILLY_DIR = "philly_pollux"
PHILLY_FILE = "philly.csv"
VC_NODES_FILE = "philly_vc_nodes_helios_artifact.csv"
REFERENCE_FILE = "reference_results_helios_sim_on_this_file.csv"
HELIOS_NODE_GPUS = 8  # the Helios artifact replays Philly on 8-GPU nodes
HELIOS_WINDOW = (datetime(2017, 10, 1, 0, 0, 0, tzinfo=UTC), datetime(2017, 11, 30, 23, 59, 0, tzinfo=UTC))
_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")

Row = tuple[
    datetime, int, int, float, int, str
]  # timestamp (naive UTC), row number, line, duration, gpus, vc


def load_philly(
    path: str | os.PathLike[str] | None = None,
    *,
    window: tuple[datetime | str, datetime | str] | None = None,
    vcs: Collection[str] | str | None = None,
    origin: datetime | str | None = None,
    node_gpus: int = HELIOS_NODE_GPUS,
) -> list[TraceJob]:
    """Philly jobs as trace jobs, sorted stably by submit time.

    `window` keeps jobs submitted from its start to its end, both included; `vcs` keeps those VCs.
    Times are seconds since `origin`, by default the first kept job's timestamp (so it is t = 0).
    Timestamps without a zone are UTC; `job_id` is `job%05d` of the 0-based row number in the file.
    Dates may be datetimes or ISO strings (`2017-10-01 00:00:00`); `vcs` may be a comma-separated string.
    """
    source = resolve(path or PHILLY_FILE, PHILLY_DIR)
    rows = _read_rows(source)
    if isinstance(vcs, str):
        vcs = {name.strip() for name in vcs.split(",") if name.strip()}
    low, high = (None, None) if window is None else (_naive_utc(window[0]), _naive_utc(window[1]))
    kept = [
        row
        for row in rows
        if (vcs is None or row[5] in vcs)
        and (low is None or low <= row[0])
        and (high is None or row[0] <= high)
    ]
    if not kept:
        return []
    start = min(row[0] for row in kept) if origin is None else _naive_utc(origin)
    jobs = _jobs(kept, start, source, node_gpus)
    jobs.sort(key=_submit_time)
    return jobs


def load_philly_helios(path: str | os.PathLike[str] | None = None) -> list[TraceJob]:
    """The Helios per-VC replay's input (README section 7): the window, the 11 VCs, t = 0 at the first job."""
    return load_philly(path, window=HELIOS_WINDOW, vcs=set(load_vc_nodes()), node_gpus=HELIOS_NODE_GPUS)


def _submit_time(job: TraceJob) -> float:
    return job.submit_time


def _naive_utc(moment: datetime | str) -> datetime:
    """A datetime (or ISO string) as naive UTC; one without a zone is taken as UTC already."""
    if isinstance(moment, str):
        try:
            moment = datetime.fromisoformat(moment)
        except ValueError:
            raise ConfigError(
                f"{moment!r} is not a date and time",
                where="philly window/origin",
                fix="write YYYY-MM-DD HH:MM:SS",
            ) from None
    if moment.tzinfo is None:
        return moment
    return moment.astimezone(UTC).replace(tzinfo=None)


def _read_rows(source: Path) -> list[Row]:
    rows: list[Row] = []
    with open(source, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        index = column_indices(next(reader, None), _COLUMNS, source)
        i_time, i_dur, i_gpus, i_vc = (index[name] for name in _COLUMNS)
        width = len(index)
        for row in reader:
            if not row:
                continue  # a blank line holds no job
            line = reader.line_num
            if len(row) != width:
                raise TraceError(
                    f"{source}, line {line}: {len(row)} cells, the header has {width} (fix: repair the row)"
                )
            rows.append(
                (
                    _timestamp(row[i_time], source, line),
                    len(rows),
                    line,
                    parse_seconds(row[i_dur], source, line, "duration"),
                    parse_count(row[i_gpus], source, line, "num_gpus"),
                    row[i_vc],
                )
            )
    return rows


def _timestamp(text: str, source: Path, line: int) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise cell_error(
            source, line, "timestamp", f"{text!r} is not a date and time", "write YYYY-MM-DD HH:MM:SS (UTC)"
        ) from None
    return _naive_utc(moment)


def _jobs(rows: list[Row], start: datetime, source: Path, node_gpus: int) -> list[TraceJob]:
    shapes: dict[int, tuple[int, int]] = {}  # gpus -> (replicas, gpus_per_replica), computed once per count
    jobs: list[TraceJob] = []
    append = jobs.append
    for moment, number, line, duration, gpus, vc in rows:
        submit = (moment - start).total_seconds()
        if submit < 0:
            raise cell_error(
                source,
                line,
                "timestamp",
                f"{moment} is before the origin {start}",
                "give an origin at or before it",
            )
        shape = shapes.get(gpus)
        if shape is None:
            shape = shapes[gpus] = split_gpus(gpus, node_gpus)
        append(
            TraceJob(
                job_id=f"job{number:05d}",
                submit_time=submit,
                duration=duration,
                gpus=gpus,
                queue=vc,
                replicas=shape[0],
                gpus_per_replica=shape[1],
            )
        )
    return jobs


def load_vc_nodes(path: str | os.PathLike[str] | None = None) -> dict[str, int]:
    """VC -> number of 8-GPU nodes, from the Helios artifact's `philly_vc.csv` (in file order)."""
    source = resolve(path or VC_NODES_FILE, PHILLY_DIR)
    nodes: dict[str, int] = {}
    with open(source, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        index = column_indices(next(reader, None), ("vc", "node num"), source)
        for row in reader:
            if row:
                nodes[row[index["vc"]]] = parse_count(
                    row[index["node num"]], source, reader.line_num, "node num"
                )
    return nodes


def load_helios_reference(
    path: str | os.PathLike[str] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """vc -> metric -> policy -> value from a Helios reference file (`all` is the job-weighted mean)."""
    source = resolve(path or REFERENCE_FILE, PHILLY_DIR)
    result: dict[str, dict[str, dict[str, float]]] = {}
    with open(source, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        index = column_indices(header, ("vc", "vc_nodes_8gpu", "metric"), source)
        policies = [name for name in index if name not in ("vc", "vc_nodes_8gpu", "metric")]
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            values = {p: parse_float(row[index[p]], source, line, p) for p in policies}
            result.setdefault(row[index["vc"]], {})[row[index["metric"]]] = values
    return result
