"""The Gavel loader: the msr Philly traces and the physical-cluster traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.core.errors import TraceError
from corral.sim.loaders.gavel import load_gavel, load_throughputs, msr_trace_paths, throughput

MSR_JOBS = {
    "11cb48": 2000, "6214e9": 2000, "6c71a0": 2000, "b436b2": 2000, "ee9e8c": 2000, "0e4a51": 1181,
    "103959": 986, "7f04ca": 972, "ed69ec": 951, "e13805": 607, "2869ce": 533, "51b7ef": 18, "23dbec": 9,
    "925e2b": 4, "795a4c": 3,
}  # fmt: skip
PHYSICAL_JOBS = {
    "artifact_evaluation": 15, "debug": 14, "debug_v2": 14, "highmem_test": 8, "max_min_fairness": 96,
    "medium_test": 20, "minimize_makespan": 100, "small_test": 20,
}  # fmt: skip


def test_msr_traces(traces: Path) -> None:
    counts: dict[str, int] = {}
    extrapolated = 0
    for path in msr_trace_paths():
        trace = load_gavel(path)
        counts[path.stem] = len(trace.jobs)
        extrapolated += len(trace.extrapolated)
        assert {job.queue for job in trace.jobs} == {path.stem}
        assert trace.jobs[0].submit_time == 0.0
    assert counts == MSR_JOBS and sum(counts.values()) == 15264
    assert extrapolated == 1548  # jobs whose (job type, scale factor) has no measured throughput


def test_msr_durations_are_steps_over_v100_throughput(traces: Path) -> None:
    rates = load_throughputs("simulation_throughputs.json")
    first = load_gavel("msr_philly_seed0/2869ce.trace").jobs[
        0
    ]  # Transformer (batch size 128), 5352613 steps, 4 GPUs
    assert first.duration == 5352613 / rates[("Transformer (batch size 128)", 4)]
    assert (first.gpus, first.replicas, first.gpus_per_replica) == (4, 1, 4)
    assert throughput(rates, "CycleGAN", 4) == (rates[("CycleGAN", 1)] * 4, True)
    assert throughput(rates, "LM (batch size 20)", 32) == (rates[("LM (batch size 20)", 8)] * 4, True)
    assert throughput(rates, "LM (batch size 20)", 8) == (rates[("LM (batch size 20)", 8)], False)
    with pytest.raises(TraceError, match="no throughput for job type 'Nope'"):
        throughput(rates, "Nope", 1)


def test_physical_cluster_traces(traces: Path) -> None:
    for stem, count in PHYSICAL_JOBS.items():
        trace = load_gavel(f"physical_cluster/{stem}")
        assert len(trace.jobs) == count and not trace.extrapolated
        assert all(job.queue is None and job.duration > 0 for job in trace.jobs)


def test_a_job_type_that_cannot_run_on_a_worker_type_is_an_error(traces: Path) -> None:
    rates = load_throughputs("physical_cluster_throughputs.json", "k80")
    assert rates[("ResNet-50 (batch size 128)", 1)] == 0
    with pytest.raises(TraceError, match=r"max_min_fairness.trace, line \d+: throughput 0 for 'ResNet-50"):
        load_gavel("physical_cluster/max_min_fairness", worker_type="k80")


def test_a_bad_gavel_line_names_its_line(traces: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.trace"
    good = "ResNet-18 (batch size 16)\tcmd\t-n\t1\t1000\t0.000000\t1\n"
    path.write_text(good + "ResNet-18 (batch size 16)\tcmd\t-n\t1\n")
    with pytest.raises(TraceError, match=r"bad.trace, line 2, column '\(line\)': 4 tab-separated fields"):
        load_gavel(path)
    path.write_text(good + "ResNet-18 (batch size 16)\tcmd\t-n\t1\tmany\t5\t1\n")
    with pytest.raises(TraceError, match=r"line 2, column 'total_steps': 'many' is not a number"):
        load_gavel(path)
