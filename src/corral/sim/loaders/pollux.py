"""Loader for the Pollux and Sia 160-job workloads, with durations derived from the Pollux profiles.

A workload row gives `name, time, application, num_replicas, batch_size` and no run time. The
duration is what the Pollux simulator (petuum/adaptdl, osdi21-artifact, `simulator/simulator.py`
`Job.step` and `simulator/applications.py`) spends on a job whose R replicas and batch size B never
change, as in its Tiresias+TunedJobs runs (`pollux_profile.rigid_duration`):

1. placement: R packed on 4-GPU nodes, (4, ..., 4, rest), the T4 nodes the profiles come from;
2. batch: local = ceil(B / R); accumulation a = ceil(local / max_local_bsz) - 1 (at least 1 when
   R = 1 and B exceeds the initial batch); per-step m = ceil(local / (a + 1)), capped at
   max_batch_size / (R (a + 1)); effective batch b = R m (a + 1);
3. time per step t = step + a (step - sync), step and sync linear in m over `placements.csv` at the
   placement (beyond four nodes: `scalability.csv` rows of the same node and replica counts);
4. gain in epoch e: g = (var + sqr) / (var / (b / initial batch) + sqr), from row e of the
   `validation-<size>.csv` files, linear between the validated sizes around b;
5. duration = sum over the epochs (as many as validation rows) of (P(e+1) - P(e)) t / g, P(e) being
   the smallest `progress` of row e - 1 over the validation files.

Checked against the authors' Tiresias runs at 0.5x load: 533 of 640 reference JCTs equal the wait for
the next 60 s round + 30 s restart + this duration within -5..+16 s (the simulator rounds every epoch's
end to a second). Not included: the 30 s restart, the 60 s rounds, looser placements, and Pollux's
own adaptation of replicas and batch size. docs/traces.md has the details and caveats.
"""

from __future__ import annotations

import csv
import os
from functools import lru_cache
from pathlib import Path

from corral.core.errors import TraceError
from corral.sim.loaders.location import TRACES_DIR_ENV, resolve, shared_traces_dir
from corral.sim.loaders.pollux_profile import AppProfile, load_profile, rigid_duration
from corral.sim.trace import TraceJob, split_gpus
from corral.sim.trace_cells import cell_error, column_indices, parse_count, parse_seconds

POLLUX_DIR = "pollux"
SIA_WORKLOADS_DIR = "sia/workloads_philly"
NODE_GPUS = 4  # the Pollux cluster: 16 AWS g4dn.12xlarge nodes of 4 T4 GPUs; the profiles were measured there
_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


def load_profiles(directory: Path | None = None) -> dict[str, AppProfile]:
    """Every application profile under `directory` (default: the shared `pollux/profiles`), read once."""
    return _profiles((directory or shared_traces_dir() / POLLUX_DIR / "profiles").resolve())


@lru_cache(maxsize=4)
def _profiles(root: Path) -> dict[str, AppProfile]:
    if not root.is_dir():
        raise TraceError(f"{root}: no such folder (fix: give profiles_dir, or set {TRACES_DIR_ENV})")
    profiles = {path.name: load_profile(path) for path in sorted(root.iterdir()) if path.is_dir()}
    if not profiles:
        raise TraceError(f"{root}: no application profiles (fix: point at pollux/profiles)")
    return profiles


def load_pollux(path: str | os.PathLike[str], *, profiles_dir: Path | None = None) -> list[TraceJob]:
    """A Pollux workload (`pollux/<folder>/workload-N.csv`) as rigid jobs, sorted stably by submit time.

    `gpus` is `num_replicas` (one GPU per replica); `duration` is `rigid_duration` of the job's
    application at its replica count and batch size, packed on 4-GPU nodes; `job_id` is `name`.
    """
    return _load(resolve(path, POLLUX_DIR, suffix=".csv"), profiles_dir)


def load_sia(path: str | os.PathLike[str], *, profiles_dir: Path | None = None) -> list[TraceJob]:
    """A Sia Philly workload (`sia/workloads_philly/workload-N.csv`), converted as `load_pollux` does.

    Sia's `aws` profiles are the Pollux profiles byte for byte, so the durations are for T4 GPUs.
    """
    return _load(resolve(path, SIA_WORKLOADS_DIR, suffix=".csv"), profiles_dir)


def _load(source: Path, profiles_dir: Path | None) -> list[TraceJob]:
    profiles = load_profiles(profiles_dir)
    durations: dict[tuple[str, int, int], float] = {}  # the workloads repeat a few configurations
    jobs: list[TraceJob] = []
    lines: dict[str, int] = {}
    with open(source, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        index = column_indices(next(reader, None), _COLUMNS, source)
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            job = _job(row, index, profiles, durations, source, line)
            first = lines.setdefault(job.job_id, line)
            if first != line:
                raise cell_error(
                    source, line, "name", f"{job.job_id!r} is also on line {first}", "make names unique"
                )
            jobs.append(job)
    jobs.sort(key=lambda job: job.submit_time)
    return jobs


def _job(
    row: list[str],
    index: dict[str, int],
    profiles: dict[str, AppProfile],
    durations: dict[tuple[str, int, int], float],
    source: Path,
    line: int,
) -> TraceJob:
    if len(row) != len(index):
        raise TraceError(
            f"{source}, line {line}: {len(row)} cells, the header has {len(index)} (fix: repair the row)"
        )
    application = row[index["application"]]
    profile = profiles.get(application)
    if profile is None:
        raise cell_error(
            source,
            line,
            "application",
            f"no profile for {application!r}",
            f"use one of {', '.join(sorted(profiles))}",
        )
    replicas = parse_count(row[index["num_replicas"]], source, line, "num_replicas", minimum=1)
    batch_size = parse_count(row[index["batch_size"]], source, line, "batch_size", minimum=1)
    key = (application, replicas, batch_size)
    duration = durations.get(key)
    if duration is None:
        try:
            duration = durations[key] = rigid_duration(profile, replicas, batch_size, node_gpus=NODE_GPUS)
        except TraceError as error:
            raise TraceError(f"{source}, line {line}: {error}") from None
    shape = split_gpus(replicas, NODE_GPUS)
    return TraceJob(
        job_id=row[index["name"]],
        submit_time=parse_seconds(row[index["time"]], source, line, "time"),
        duration=duration,
        gpus=replicas,
        replicas=shape[0],
        gpus_per_replica=shape[1],
    )
