"""The Tiresias and Shockwave loaders."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from corral.core.errors import TraceError
from corral.sim.loaders.shockwave import load_shockwave
from corral.sim.loaders.tiresias import ClusterSpec, load_cluster_spec, load_tiresias


def test_tiresias_60_jobs(traces: Path) -> None:
    jobs = load_tiresias()
    assert len(jobs) == 60
    assert Counter(job.gpus for job in jobs) == {1: 30, 2: 10, 4: 10, 8: 10}
    assert min(job.duration for job in jobs) == 121 and max(job.duration for job in jobs) == 1800
    assert max(job.submit_time for job in jobs) == 1779
    assert {(job.replicas, job.gpus_per_replica) for job in jobs if job.gpus == 8} == {(2, 4)}


def test_tiresias_cluster_specs(traces: Path) -> None:
    assert load_cluster_spec() == ClusterSpec(1, 16, 4, 128, 254)
    gpus = {name: load_cluster_spec(name).gpus for name in ("n1g4", "n32g4", "n160g8", "n256g8")}
    assert gpus == {"n1g4": 4, "n32g4": 128, "n160g8": 1280, "n256g8": 2048}
    assert load_cluster_spec("n160g8").nodes == 160


def test_tiresias_duplicate_ids_are_an_error(traces: Path) -> None:
    with pytest.raises(TraceError, match=r"tf_job.csv, line 3, column 'job_id': '10' is also on line 2"):
        load_tiresias("tf_job.csv")


def test_shockwave_120_jobs(traces: Path) -> None:
    jobs = load_shockwave()
    assert len(jobs) == 120
    assert Counter(job.gpus for job in jobs) == {1: 92, 2: 20, 4: 8}
    assert jobs[0].duration == 1418 and jobs[0].submit_time == 0
