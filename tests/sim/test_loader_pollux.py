"""The Pollux and Sia loaders: every workload loads, and durations agree with the Pollux simulator's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from corral.core.errors import TraceError
from corral.sim.loaders.pollux import load_pollux, load_profiles, load_sia
from corral.sim.loaders.pollux_profile import canonical, local_batch, packed, rigid_duration, step_times

FOLDERS = {
    "sim_workloads": 160,
    "sim_workloads-0.5": 80,
    "sim_workloads-1.5": 240,
    "sim_workloads-2.0": 320,
    "sim_workloads-realistic": 160,
    "testbed_workloads": 160,
    "testbed_workloads-realistic": 160,
}


@pytest.mark.parametrize(("folder", "jobs_per_file"), FOLDERS.items())
def test_every_pollux_workload_loads(traces: Path, folder: str, jobs_per_file: int) -> None:
    files = sorted((traces / "pollux" / folder).glob("workload-*.csv"))
    assert files
    for path in files:
        jobs = load_pollux(path)
        assert len(jobs) == jobs_per_file if folder.startswith("sim") else len(jobs) > 0
        assert all(job.duration > 0 and job.replicas * job.gpus_per_replica == job.gpus for job in jobs)
        assert all(job.gpus_per_replica <= 4 for job in jobs)


def test_every_sia_workload_loads(traces: Path) -> None:
    for n in range(1, 9):
        jobs = load_sia(f"workload-{n}")
        assert len(jobs) == 160
        assert {job.job_id.rsplit("-", 1)[0] for job in jobs} <= {
            "bert",
            "cifar10",
            "deepspeech2",
            "imagenet",
            "yolov3",
        }


def test_durations_match_the_pollux_simulators_tiresias_runs(traces: Path) -> None:
    """Reference JCT = wait for the next 60 s round + 30 s restart + run time, for a job that never waited.

    At 0.5x load most jobs never wait: our duration must then be the simulator's run time, give or
    take its rounding of every epoch's end to a whole second (here -5 .. +16 s per job).
    """
    summary = traces / "pollux/reference_results/results-jobload/tiresias-0.5/summary.json"
    reference = json.loads(summary.read_text())["jcts"]
    close = total = 0
    for path in sorted((traces / "pollux/sim_workloads-0.5").glob("workload-*.csv")):
        for job in load_pollux(path):
            start = 60 * max(1, math.ceil(job.submit_time / 60))
            residual = reference[path.stem][job.job_id] - (start - job.submit_time) - 30 - job.duration
            close += -5 <= residual <= 16
            total += 1
    assert total == 640 and close >= 0.8 * total  # 533 of 640 at the time of writing


def test_placements_and_batches(traces: Path) -> None:
    assert packed(10, 4) == (4, 4, 2) and canonical((4, 4, 2)) == (2, 4, 4) and canonical((0, 3, 1)) == (1, 3)
    profiles = load_profiles()
    assert local_batch(profiles["ncf"], 1, 32768) == (
        16384,
        1,
    )  # one replica above the initial batch accumulates
    assert local_batch(profiles["cifar10"], 12, 4096) == (341, 0)  # capped at the largest batch size
    # Beyond four nodes: linear in the batch size over scalability.csv (equal to scipy's 3-D result here).
    step, sync = step_times(profiles["imagenet"], packed(24, 4), 134)
    assert step == pytest.approx(0.74533214, abs=1e-8) and sync == pytest.approx(0.05992654, abs=1e-8)


def test_profile_limits_are_errors(traces: Path) -> None:
    profiles = load_profiles()
    with pytest.raises(TraceError, match="outside the validated"):
        rigid_duration(profiles["cifar10"], 1, 64)
    with pytest.raises(TraceError, match="no step time measured"):
        rigid_duration(profiles["cifar10"], 128, 4096)


def test_a_bad_workload_row_names_its_line(traces: Path, tmp_path: Path) -> None:
    path = tmp_path / "workload.csv"
    path.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,1,128\nb,5,mnist,1,128\n")
    with pytest.raises(TraceError, match=r"line 3, column 'application': no profile for 'mnist'"):
        load_pollux(path)
    path.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,1,64\n")
    with pytest.raises(TraceError, match=r"workload.csv, line 2: cifar10: batch size"):
        load_pollux(path)
    path.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,1,128\na,1,cifar10,1,128\n")
    with pytest.raises(TraceError, match=r"line 3, column 'name': 'a' is also on line 2"):
        load_pollux(path)
