"""Loader for Shockwave's synthetic 120-job trace (`shockwave/tacc32_120jobs_dynamic.trace`)."""

from __future__ import annotations

import os

from corral.sim.loaders.location import resolve
from corral.sim.trace import TraceJob, split_gpus
from corral.sim.trace_cells import cell_error, parse_count, parse_seconds

SHOCKWAVE_DIR = "shockwave"
TRACE_FILE = "tacc32_120jobs_dynamic.trace"
NODE_GPUS = 4  # TACC's V100 nodes hold 4 GPUs (the trace's cluster: 32 V100)
FIELDS = (
    "job_type",
    "command",
    "working_directory",
    "num_steps_arg",
    "needs_data_dir",
    "total_steps",
    "scale_factor",
    "mode",
    "priority_weight",
    "SLO",
    "duration_s",
    "arrival_time_s",
)


def load_shockwave(
    path: str | os.PathLike[str] = TRACE_FILE, *, node_gpus: int = NODE_GPUS
) -> list[TraceJob]:
    """Shockwave jobs as rigid jobs: `duration` = `duration_s`, `gpus` = `scale_factor`.

    The batch-size schedules (`mode`: static, accordion, gns) cannot be replayed (the per-epoch
    durations are not public), so each job runs `duration_s` seconds. `job_id` is `<stem>-<row>`.
    """
    source = resolve(path, SHOCKWAVE_DIR, suffix=".trace")
    jobs: list[TraceJob] = []
    with open(source, encoding="utf-8") as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            cells = text.rstrip("\r\n").split("\t")
            if len(cells) != len(FIELDS):
                raise cell_error(
                    source,
                    line,
                    "(line)",
                    f"{len(cells)} tab-separated fields",
                    f"a Shockwave line has {len(FIELDS)}",
                )
            fields = dict(zip(FIELDS, cells, strict=True))
            gpus = parse_count(fields["scale_factor"], source, line, "scale_factor", minimum=1)
            replicas, per_replica = split_gpus(gpus, node_gpus)
            jobs.append(
                TraceJob(
                    job_id=f"{source.stem}-{len(jobs):04d}",
                    submit_time=parse_seconds(fields["arrival_time_s"], source, line, "arrival_time_s"),
                    duration=parse_seconds(fields["duration_s"], source, line, "duration_s"),
                    gpus=gpus,
                    replicas=replicas,
                    gpus_per_replica=per_replica,
                )
            )
    jobs.sort(key=lambda job: job.submit_time)
    return jobs
