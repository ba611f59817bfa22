"""Loader for the Tiresias simulator's job CSVs (`tiresias/60_job.csv`) and cluster specs."""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass

from corral.core.errors import TraceError
from corral.sim.loaders.location import resolve
from corral.sim.trace import TraceJob, split_gpus
from corral.sim.trace_cells import cell_error, column_indices, parse_count, parse_seconds

TIRESIAS_DIR = "tiresias"
NODE_GPUS = 4  # cluster_spec.csv, the spec of the 60-job testbed mix: 16 nodes of 4 GPUs
_JOB_COLUMNS = ("job_id", "num_gpu", "submit_time", "duration")
_SPEC_COLUMNS = ("num_switch", "num_node_p_switch", "num_gpu_p_node", "num_cpu_p_node", "mem_p_node")


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A Tiresias cluster: identical nodes under identical switches."""

    switches: int
    nodes_per_switch: int
    gpus_per_node: int
    cpus_per_node: int
    memory_per_node: int  # as the spec gives it (GB in the Tiresias simulator)

    @property
    def nodes(self) -> int:
        return self.switches * self.nodes_per_switch

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def load_cluster_spec(path: str | os.PathLike[str] = "cluster_spec.csv") -> ClusterSpec:
    """The one row of a cluster spec CSV (`cluster_spec.csv`, `n32g4.csv`, `n160g8.csv`, ...)."""
    source = resolve(path, TIRESIAS_DIR, suffix=".csv")
    with open(source, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        index = column_indices(next(reader, None), _SPEC_COLUMNS, source)
        rows = [(reader.line_num, row) for row in reader if row]
    if len(rows) != 1:
        raise TraceError(f"{source}: {len(rows)} spec rows (fix: a cluster spec has exactly one row)")
    line, row = rows[0]
    values = [parse_count(row[index[name]], source, line, name, minimum=1) for name in _SPEC_COLUMNS]
    return ClusterSpec(*values)


def load_tiresias(
    path: str | os.PathLike[str] = "60_job.csv", *, node_gpus: int = NODE_GPUS
) -> list[TraceJob]:
    """Tiresias jobs: `job_id` kept, `gpus` = `num_gpu`, `duration` and `submit_time` in seconds.

    `iterations`, `model_name` and `interval` are not used: `duration` is the job's measured run time.
    """
    source = resolve(path, TIRESIAS_DIR, suffix=".csv")
    jobs: list[TraceJob] = []
    lines: dict[str, int] = {}
    with open(source, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        index = column_indices(next(reader, None), _JOB_COLUMNS, source)
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            if len(row) != len(index):
                raise TraceError(f"{source}, line {line}: {len(row)} cells, the header has {len(index)}")
            job_id = row[index["job_id"]]
            first = lines.setdefault(job_id, line)
            if first != line:
                raise cell_error(
                    source, line, "job_id", f"{job_id!r} is also on line {first}", "make ids unique"
                )
            gpus = parse_count(row[index["num_gpu"]], source, line, "num_gpu")
            replicas, per_replica = split_gpus(gpus, node_gpus)
            jobs.append(
                TraceJob(
                    job_id=job_id,
                    submit_time=parse_seconds(row[index["submit_time"]], source, line, "submit_time"),
                    duration=parse_seconds(row[index["duration"]], source, line, "duration"),
                    gpus=gpus,
                    replicas=replicas,
                    gpus_per_replica=per_replica,
                )
            )
    jobs.sort(key=lambda job: job.submit_time)
    return jobs
