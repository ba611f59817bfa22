"""A small shadow replay: 200 Philly jobs through `corral simulate` and through a live control
plane with the fleet, on a clock 100 times faster (about 45 s in all).

The slice (jobs 57,500-57,699 of Philly's Oct-Dec 2017, one queue per virtual cluster, 8 nodes
of 8 GPUs) keeps the cluster busy: about half the jobs wait. The live run differs from the
simulator by its latencies: a start order reaches the fleet tens of milliseconds after the
decision, an exit is taken in by the next cycle (cycles are at least 20 ms apart), so each job
holds its GPUs about 30-60 ms longer than its duration (3-6 s of trace time at x100), and
which of two equally good nodes a job gets depends on the order earlier jobs ended. The bounds
below allow for that and no more (measured on the 2-core CI machine under load: start order
rho 1.000, median |wait difference| 0.11-0.16 s, p90 0.3-0.7 s, equally good placements
85-87 %); the same bounds fail when the simulator runs another policy (`fifo`: median 2.4 s,
p90 9 s, 58 % equally good), which is checked here too, so the test can fail.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from corral.fleet.shadow import Comparison, compare, first_starts, live_timing
from corral.sim.loaders.philly import load_philly
from tests.fleet.harness import compress, run_live, simulate, submissions

SPEED = 100.0
NODES = 8
SLICE = (57_500, 57_700)
TOLERANCE = 0.2  # compressed seconds: a shorter wait counts as none


def violations(c: Comparison, jobs: int) -> list[str]:
    """What lies outside the bounds the live system's timing explains (the module's docstring)."""
    out = []
    if (c.jobs, c.only_sim, c.only_live) != (jobs, 0, 0):
        out.append(f"jobs started in both / only one: {c.jobs} / {c.only_sim} / {c.only_live} of {jobs}")
    if c.rank_correlation < 0.99:
        out.append(f"start order rank correlation {c.rank_correlation:.3f} < 0.99")
    if c.wait_diff_p50 > 0.5:
        out.append(f"median |wait difference| {c.wait_diff_p50:.3f} s > 0.5 s")
    if c.wait_diff_p90 > 2.5:
        out.append(f"p90 |wait difference| {c.wait_diff_p90:.3f} s > 2.5 s")
    if c.same_shape < 0.75:
        out.append(f"equally good placements {c.same_shape:.1%} < 75 %")
    return out


def cluster_file(path: Path, queues: list[str]) -> None:
    nodes = f'  - {{name: "n[1-{NODES}]", gpus: 8, gpu_model: H100-80GB, labels: {{leaf: l0}}}}'
    path.write_text(
        "name: shadow\ntopology: [leaf]\nnodes:\n" + nodes + "\nqueues:\n"
        + "\n".join(f"  - {{name: {q}}}" for q in queues) + "\n"
    )  # fmt: skip


def test_live_control_plane_decides_as_the_simulator(tmp_path: Path) -> None:
    jobs = load_philly(window=("2017-10-01 00:00:00", "2017-12-31 00:00:00"))[slice(*SLICE)]
    origin = jobs[0].submit_time
    jobs = [dataclasses.replace(j, queue=f"q{j.queue}", submit_time=j.submit_time - origin) for j in jobs]
    cluster = tmp_path / "cluster.yaml"
    cluster_file(cluster, sorted({str(j.queue) for j in jobs}))
    fast = compress(jobs, SPEED)
    sim = first_starts(simulate(cluster, fast, tmp_path / "sim.jsonl", "default"))
    fifo = first_starts(simulate(cluster, fast, tmp_path / "fifo.jsonl", "fifo"))

    run = run_live(cluster, submissions(fast, "default"), tmp_path / "live", timeout=60.0)

    assert run.started_all and not run.submitted.refused, run.submitted.refused
    live = first_starts(run.events, run.names, run.origin)
    found = compare(sim, live, TOLERANCE)
    assert not violations(found, len(jobs)), (violations(found, len(jobs)), found)
    # the simulator fed the live run's own timing: what is left is not timing
    times = live_timing(run.events, run.names, run.origin)
    timed_jobs = [
        dataclasses.replace(j, submit_time=times[j.job_id][0], duration=times[j.job_id][1])
        if j.job_id in times
        else j
        for j in fast
    ]
    timed = first_starts(simulate(cluster, timed_jobs, tmp_path / "timed.jsonl", "default"))
    closer = compare(timed, live, TOLERANCE)
    assert not violations(closer, len(jobs)), (violations(closer, len(jobs)), closer)
    assert closer.wait_diff_p90 < 0.5, closer
    # the bounds are tight enough to tell another scheduler apart
    assert violations(compare(fifo, live, TOLERANCE), len(jobs))
