"""Loader for Gavel's tab-separated traces (`gavel/msr_philly_seed0/`, `gavel/physical_cluster/`).

duration = total_steps / throughput(job type, scale factor) on one worker type (v100 by default),
as Gavel's simulator runs a job alone. Only scale factors 1, 2, 4 and 8 are measured (only 1 for
A3C, CycleGAN and Recommendation): otherwise the largest measured scale factor s below is scaled
ideally, throughput(s) x scale factor / s; 1,548 of the 15,264 msr jobs need it, and
`GavelTrace.extrapolated` lists them. These are Gavel's durations, not Philly's: the msr traces'
total_steps were made from 1-GPU throughputs of another table (docs/traces.md has the measurement).
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass
from pathlib import Path

from corral.core.errors import TraceError
from corral.sim.loaders.location import resolve, shared_traces_dir
from corral.sim.trace import TraceJob, split_gpus
from corral.sim.trace_cells import cell_error, parse_count, parse_seconds

GAVEL_DIR = "gavel"
SIMULATION_THROUGHPUTS = "simulation_throughputs.json"
PHYSICAL_THROUGHPUTS = "physical_cluster_throughputs.json"
WORKER_TYPE = "v100"
NODE_GPUS = 8  # Philly's large servers hold 8 GPUs; Gavel itself models no nodes for these traces

# Field names per layout, keyed by the number of tab-separated fields.
MSR_FIELDS = (
    "job_type",
    "command",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "arrival_time_s",
    "scale_factor",
)
PHYSICAL_FIELDS = (
    "job_type",
    "command",
    "working_directory",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "scale_factor",
    "priority_weight",
    "SLO",
    "arrival_time_s",
)
_LAYOUTS = {len(MSR_FIELDS): MSR_FIELDS, len(PHYSICAL_FIELDS): PHYSICAL_FIELDS}

Throughputs = dict[tuple[str, int], float]  # (job type, scale factor) -> steps per second, running alone


@dataclass(frozen=True, slots=True)
class GavelTrace:
    """The jobs of one Gavel trace, and which of them got an extrapolated throughput."""

    jobs: list[TraceJob]
    extrapolated: tuple[str, ...]  # ids of jobs whose (job type, scale factor) has no measured throughput


def load_throughputs(path: str | os.PathLike[str], worker_type: str = WORKER_TYPE) -> Throughputs:
    """`throughputs[worker_type]["('<job type>', <scale factor>)"]["null"]` of a Gavel throughput file."""
    source = resolve(path, GAVEL_DIR)
    with open(source, encoding="utf-8") as handle:
        table = json.load(handle)
    if worker_type not in table:
        raise TraceError(f"{source}: no worker type {worker_type!r} (fix: use one of {', '.join(table)})")
    result: Throughputs = {}
    for key, entry in table[worker_type].items():
        job_type, scale_factor = ast.literal_eval(key)
        rate = float(entry["null"])
        if not rate >= 0:
            raise TraceError(f"{source}: throughput {rate} for {key} (fix: throughputs are 0 or more)")
        result[(job_type, int(scale_factor))] = rate
    return result


def throughput(throughputs: Throughputs, job_type: str, scale_factor: int) -> tuple[float, bool]:
    """(steps per second, whether extrapolated) for a job type on `scale_factor` GPUs.

    Without a measurement for that scale factor, the largest measured one below it, s, is scaled
    ideally: throughput(s) x scale_factor / s (for A3C, CycleGAN and Recommendation, s is 1).
    """
    measured = throughputs.get((job_type, scale_factor))
    if measured == 0:
        raise TraceError(
            f"throughput 0 for {job_type!r} on {scale_factor} GPU(s): it cannot run on this worker type"
            " (fix: choose another worker_type)"
        )
    if measured is not None:
        return measured, False
    below = [s for (name, s) in throughputs if name == job_type and s < scale_factor]
    if not below:
        raise TraceError(
            f"no throughput for job type {job_type!r} (fix: use a throughput file that measures it)"
        )
    base = max(below)
    return throughput(throughputs, job_type, base)[0] * scale_factor / base, True


def load_gavel(
    path: str | os.PathLike[str],
    *,
    throughputs: str | os.PathLike[str] | None = None,
    worker_type: str = WORKER_TYPE,
    node_gpus: int = NODE_GPUS,
) -> GavelTrace:
    """A Gavel trace as trace jobs: duration = total_steps / throughput(job type, scale factor).

    The layout follows the field count: 7 (msr: `queue` is the file's stem, the Philly VC) or 10
    (physical cluster). The throughput file defaults to `simulation_throughputs.json` for the
    former and `physical_cluster_throughputs.json` for the latter, read for `worker_type`.
    `job_id` is `<file stem>-<0-based row>`; `gpus` is the scale factor.
    """
    source = resolve(path, GAVEL_DIR, suffix=".trace")
    rows = _rows(source)
    msr = bool(rows) and len(rows[0][1]) == len(MSR_FIELDS)
    table = load_throughputs(
        throughputs or (SIMULATION_THROUGHPUTS if msr else PHYSICAL_THROUGHPUTS), worker_type
    )
    jobs: list[TraceJob] = []
    extrapolated: list[str] = []
    for number, (line, cells) in enumerate(rows):
        job_id = f"{source.stem}-{number:04d}"
        fields = dict(zip(_LAYOUTS[len(cells)], cells, strict=True))
        gpus = parse_count(fields["scale_factor"], source, line, "scale_factor", minimum=1)
        steps = parse_seconds(fields["total_steps"], source, line, "total_steps")
        try:
            rate, guessed = throughput(table, fields["job_type"], gpus)
        except TraceError as error:
            raise TraceError(f"{source}, line {line}: {error}") from None
        if guessed:
            extrapolated.append(job_id)
        shape = split_gpus(gpus, node_gpus)
        jobs.append(
            TraceJob(
                job_id=job_id,
                submit_time=parse_seconds(fields["arrival_time_s"], source, line, "arrival_time_s"),
                duration=steps / rate,
                gpus=gpus,
                queue=source.stem if msr else None,
                replicas=shape[0],
                gpus_per_replica=shape[1],
            )
        )
    jobs.sort(key=lambda job: job.submit_time)
    return GavelTrace(jobs, tuple(extrapolated))


def _rows(source: Path) -> list[tuple[int, list[str]]]:
    """(line number, fields) per non-blank line; every line has the same known number of fields."""
    rows: list[tuple[int, list[str]]] = []
    with open(source, encoding="utf-8") as handle:
        for line, text in enumerate(handle, start=1):
            text = text.rstrip("\r\n")
            if not text.strip():
                continue
            cells = text.split("\t")
            if len(cells) not in _LAYOUTS or (rows and len(cells) != len(rows[0][1])):
                expected = len(rows[0][1]) if rows else " or ".join(str(n) for n in _LAYOUTS)
                raise cell_error(
                    source,
                    line,
                    "(line)",
                    f"{len(cells)} tab-separated fields",
                    f"a Gavel trace line has {expected}",
                )
            rows.append((line, cells))
    return rows


def msr_trace_paths() -> list[Path]:
    """The 15 per-VC msr traces in the shared folder, sorted by name."""
    return sorted((shared_traces_dir() / GAVEL_DIR / "msr_philly_seed0").glob("*.trace"))
