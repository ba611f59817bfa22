"""`convert` for the CLI: every source converts to a trace file that reads back as the same jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.core.errors import ConfigError, TraceError
from corral.sim.loaders import TRACES_DIR_ENV, convert, load
from corral.sim.trace import read_trace

CASES = [
    ("philly", None, {}, 8, 82247),
    ("philly", None, {"window": ("2017-10-01 00:00:00", "2017-11-30 23:59:00"), "vcs": "2869ce"}, 8, 315),
    ("pollux", "sim_workloads/workload-1.csv", {}, 4, 160),
    ("sia", "workload-2", {}, 4, 160),
    ("gavel", "msr_philly_seed0/6214e9.trace", {}, 8, 2000),
    ("gavel", "physical_cluster/max_min_fairness", {"worker_type": "p100"}, 8, 96),
    ("tiresias", None, {}, 4, 60),
    ("shockwave", None, {}, 4, 120),
]


@pytest.mark.parametrize(("source", "name", "options", "largest", "count"), CASES)
def test_convert_round_trips(
    traces: Path,
    tmp_path: Path,
    source: str,
    name: str | None,
    options: dict[str, object],
    largest: int,
    count: int,
) -> None:
    out = tmp_path / "out.csv"
    assert convert(source, name, out, **options) == count
    jobs = read_trace(out, largest_node_gpus=largest)
    assert jobs == load(source, name, **options)
    again = tmp_path / "again.csv"
    assert convert("csv", out, again, largest_node_gpus=largest) == count
    assert again.read_bytes() == out.read_bytes()


def test_bad_requests(traces: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown trace source 'slurm'.*philly, pollux"):
        convert("slurm", None, tmp_path / "x.csv")
    with pytest.raises(ConfigError, match=r"option\(s\) windw do not apply to philly traces"):
        load("philly", windw=("a", "b"))
    with pytest.raises(ConfigError, match="pollux needs a trace file"):
        load("pollux")
    with pytest.raises(TraceError, match="workload-99: no such trace file"):
        load("pollux", "workload-99")


def test_the_traces_folder_can_be_moved(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(TRACES_DIR_ENV, str(tmp_path))
    (tmp_path / "tiresias").mkdir()
    (tmp_path / "tiresias" / "60_job.csv").write_text(
        "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n7,2,5,10,vgg16,100,1\n"
    )
    [job] = load("tiresias")
    assert (job.job_id, job.gpus, job.submit_time, job.duration) == ("7", 2, 5.0, 100.0)
    with pytest.raises(TraceError, match=f"under {tmp_path}/philly_pollux.*set {TRACES_DIR_ENV}"):
        load("philly")
