"""The Philly loader against the counts in ../shared/traces/README.md (sections 1 and 7)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path

import pytest

from corral.core.errors import TraceError
from corral.sim.loaders.philly import (
    HELIOS_WINDOW,
    load_helios_reference,
    load_philly,
    load_philly_helios,
    load_vc_nodes,
)
from corral.sim.trace import TraceJob

ALL_PER_VC = {
    "6214e9": 41226, "11cb48": 16091, "6c71a0": 9953, "b436b2": 7423, "103959": 1934, "ee9e8c": 1511,
    "0e4a51": 1435, "ed69ec": 1137, "7f04ca": 723, "2869ce": 422, "e13805": 374, "23dbec": 8, "51b7ef": 4,
    "925e2b": 3, "795a4c": 3,
}  # fmt: skip
GPU_DEMAND = {1: 76627, 2: 1818, 4: 1870, 8: 1643, 12: 7, 16: 199, 24: 7, 32: 67, 64: 6, 128: 3}
WINDOW_PER_VC = {
    "6214e9": 33950, "11cb48": 11897, "6c71a0": 9383, "b436b2": 7222, "103959": 1450, "0e4a51": 1269,
    "ed69ec": 1096, "ee9e8c": 1053, "7f04ca": 604, "2869ce": 315, "e13805": 264,
}  # fmt: skip


@pytest.fixture(scope="module")
def philly(traces: Path) -> list[TraceJob]:
    return load_philly()


@pytest.fixture(scope="module")
def helios(traces: Path) -> list[TraceJob]:
    return load_philly_helios()


def test_the_whole_file(philly: list[TraceJob]) -> None:
    assert len(philly) == 82247
    assert len({job.job_id for job in philly}) == 82247
    assert Counter(job.queue for job in philly) == ALL_PER_VC
    assert Counter(job.gpus for job in philly) == GPU_DEMAND
    assert philly[0].submit_time == 0.0
    assert all(a.submit_time <= b.submit_time for a, b in pairwise(philly))
    assert min(job.duration for job in philly) == 1 and max(job.duration for job in philly) == 4628226


def test_job_ids_are_the_row_numbers_of_the_helios_conversion(philly: list[TraceJob]) -> None:
    by_id = {job.job_id: job for job in philly}
    first, second = (
        by_id["job00000"],
        by_id["job00001"],
    )  # the file's first rows, 2017-10-09 07:01:55 and 06:13:03
    assert (first.queue, first.duration, first.gpus) == ("11cb48", 66.0, 1)
    assert first.submit_time - second.submit_time == 48 * 60 + 52


def test_the_helios_window_gives_68503_jobs_in_11_vcs(helios: list[TraceJob]) -> None:
    assert len(helios) == 68503
    assert Counter(job.queue for job in helios) == WINDOW_PER_VC
    assert helios[0].submit_time == 0.0
    nodes = load_vc_nodes()
    assert all(job.gpus <= 8 * nodes[str(job.queue)] for job in helios)  # nothing had to be dropped or capped
    assert max(job.gpus for job in helios) == 32


def test_window_bounds_are_inclusive_and_the_origin_can_be_given(traces: Path) -> None:
    start = HELIOS_WINDOW[0]
    jobs = load_philly(window=HELIOS_WINDOW, vcs="6214e9, 2869ce", origin="2017-10-01 00:00:00")
    assert Counter(job.queue for job in jobs) == {"6214e9": 33950, "2869ce": 315}
    assert jobs[0].submit_time == 45.0  # the first job in the window is at 00:00:45
    one_second = load_philly(window=(start + timedelta(seconds=45), start + timedelta(seconds=45)))
    assert [job.submit_time for job in one_second] == [0.0] * len(one_second) and one_second
    aware = datetime(2017, 10, 1, 2, 0, 45, tzinfo=timezone(timedelta(hours=2)))  # the same moment at UTC+2
    assert len(load_philly(window=(aware, aware))) == len(one_second)


def test_an_origin_after_a_job_is_an_error(traces: Path) -> None:
    with pytest.raises(TraceError, match=r"column 'timestamp'.*is before the origin"):
        load_philly(vcs=["2869ce"], origin=datetime(2017, 12, 31))


def test_vc_nodes_and_reference(traces: Path) -> None:
    nodes = load_vc_nodes()
    assert len(nodes) == 11 and sum(nodes.values()) == 352
    reference = load_helios_reference()
    assert reference["all"]["avg_jct_s"] == {"fifo": 11585, "sjf": 11543, "srtf": 11532, "qssf": 11553}
    assert reference["2869ce"]["avg_queue_s"]["qssf"] == 6904
    published = load_helios_reference("reference_results_helios_qssf_philly.csv")
    assert published["all"]["avg_jct_s"]["fifo"] == 86072


def test_a_malformed_philly_row_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "philly.csv"
    header = "timestamp,duration,num_gpus,gpu_time,cluster\n"
    path.write_text(header + "2017-10-01 00:00:00,1.0,1,1.0,a\n2017-13-01 00:00:00,1,1,1,a\n")
    with pytest.raises(TraceError, match=r"line 3, column 'timestamp': '2017-13-01 00:00:00' is not a date"):
        load_philly(path)
    path.write_text(header + "2017-10-01 00:00:00,-1.0,1,1.0,a\n")
    with pytest.raises(TraceError, match=r"line 2, column 'duration': '-1.0' is negative"):
        load_philly(path)
    path.write_text("timestamp,duration,gpus\n")
    with pytest.raises(TraceError, match=r"missing required column\(s\) num_gpus, cluster"):
        load_philly(path)
