"""The trace file: reading, writing, the gpus-only rule, and every error a malformed row gives."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.core.errors import ConfigError, TraceError
from corral.sim.trace import COLUMNS, TraceJob, read_trace, split_gpus, write_trace


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("gpus", "largest", "shape"),
    [
        (0, 8, (1, 0)),
        (1, 8, (1, 1)),
        (8, 8, (1, 8)),
        (12, 16, (1, 12)),  # up to the largest node: one replica
        (16, 8, (2, 8)),
        (24, 8, (3, 8)),
        (128, 8, (16, 8)),  # multiples of the node: whole nodes
        (12, 8, (3, 4)),
        (20, 8, (5, 4)),
        (10, 8, (5, 2)),
        (6, 4, (3, 2)),
        (7, 4, (7, 1)),
        (3, 2, (3, 1)),  # otherwise: the largest power of two that divides it and fits
        (48, 32, (3, 16)),
    ],
)
def test_gpus_only_rule(gpus: int, largest: int, shape: tuple[int, int]) -> None:
    assert split_gpus(gpus, largest) == shape


@given(st.integers(min_value=0, max_value=4096), st.integers(min_value=1, max_value=64))
def test_gpus_only_rule_always_covers_the_gpus_with_replicas_that_fit(gpus: int, largest: int) -> None:
    replicas, per = split_gpus(gpus, largest)
    assert replicas >= 1 and replicas * per == gpus and per <= largest
    if gpus > largest:
        assert per & (per - 1) == 0 or per == largest  # a power of two, or a whole node


def test_largest_node_must_be_positive(tmp_path: Path) -> None:
    path = write(tmp_path, "job_id,submit_time,duration,gpus\na,0,1,1\n")
    with pytest.raises(ConfigError, match="largest_node_gpus"):
        read_trace(path, largest_node_gpus=0)


def test_required_columns_only_and_stable_sort(tmp_path: Path) -> None:
    path = write(tmp_path, "job_id,submit_time,duration,gpus\nc,5,10,1\na,0,20,16\nb,5,30,12\nd,5,1,0\n")
    jobs = read_trace(path, largest_node_gpus=8)
    assert [j.job_id for j in jobs] == ["a", "c", "b", "d"]  # ties at t=5 keep row order
    assert jobs[0] == TraceJob(
        job_id="a", submit_time=0.0, duration=20.0, gpus=16, replicas=2, gpus_per_replica=8
    )
    assert (jobs[2].replicas, jobs[2].gpus_per_replica) == (3, 4)
    assert (jobs[3].replicas, jobs[3].gpus_per_replica) == (1, 0)


def test_optional_columns_and_defaults(tmp_path: Path) -> None:
    text = (
        "job_id,submit_time,duration,gpus,queue,replicas,gpus_per_replica,priority,gpu_model,time_limit,"
        "preemptible,checkpoint_interval,user,comment\n"
        "j1,0,3600,16,research,2,8,high,A100*|H100-80GB,7200,false,600,ana,ignored\n"
        "j2,1,60,4,,,,,,,,,,\n"
        "j3,2,60,8,prod,4,,,H100-80GB,,TRUE,0,,\n"
        "j4,3,60,8,,,2,,,, 0 ,,,\n"
    )
    jobs = read_trace(write(tmp_path, text), largest_node_gpus=8)
    assert jobs[0] == TraceJob(
        job_id="j1",
        submit_time=0.0,
        duration=3600.0,
        gpus=16,
        queue="research",
        replicas=2,
        gpus_per_replica=8,
        priority="high",
        gpu_model=("A100*", "H100-80GB"),
        time_limit=7200.0,
        preemptible=False,
        checkpoint_interval=600.0,
        user="ana",
    )
    assert jobs[1] == TraceJob(
        job_id="j2", submit_time=1.0, duration=60.0, gpus=4, replicas=1, gpus_per_replica=4
    )
    assert (jobs[2].replicas, jobs[2].gpus_per_replica, jobs[2].preemptible) == (4, 2, True)
    assert jobs[2].checkpoint_interval == 0.0 and jobs[2].gpu_model == ("H100-80GB",)
    assert (jobs[3].replicas, jobs[3].gpus_per_replica, jobs[3].preemptible) == (4, 2, False)


def test_byte_order_mark_blank_lines_and_spaces_in_the_header(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffjob_id, submit_time ,duration,gpus\n\na,0,1,1\n\n".encode())
    assert [j.job_id for j in read_trace(path, largest_node_gpus=8)] == ["a"]


def test_round_trip_is_exact(tmp_path: Path) -> None:
    jobs = [
        TraceJob(job_id="x,1", submit_time=0.1 + 0.2, duration=1e-7, gpus=3, replicas=3, gpus_per_replica=1),
        TraceJob(
            job_id='q"uote',
            submit_time=12.0,
            duration=123456789.125,
            gpus=16,
            queue="a b",
            replicas=2,
            gpus_per_replica=8,
            priority="urgent",
            gpu_model=("H100*", "A100-80GB"),
            time_limit=1.5,
            preemptible=False,
            checkpoint_interval=0.0,
            user="é",
        ),
    ]
    first, second = tmp_path / "1.csv", tmp_path / "2.csv"
    assert write_trace(first, jobs) == 2
    back = read_trace(first, largest_node_gpus=1)
    assert back == jobs
    write_trace(second, back)
    assert first.read_text(encoding="utf-8") == second.read_text(encoding="utf-8")
    assert first.read_text(encoding="utf-8").splitlines()[0] == ",".join(COLUMNS)


def test_trace_job_refuses_an_inconsistent_shape() -> None:
    with pytest.raises(TraceError, match="replicas"):
        TraceJob(job_id="a", submit_time=0, duration=1, gpus=8, replicas=3, gpus_per_replica=2)
    with pytest.raises(TraceError, match="0 or more"):
        TraceJob(job_id="a", submit_time=-1, duration=1, gpus=1, replicas=1, gpus_per_replica=1)


HEADER = "job_id,submit_time,duration,gpus,replicas,gpus_per_replica,preemptible,time_limit,gpu_model\n"
GOOD = "ok,0,1,1,,,,,\n"


@pytest.mark.parametrize(
    ("row", "column", "words"),
    [
        ("a,zero,1,1,,,,,", "submit_time", "'zero' is not a number"),
        ("a,0,ten,1,,,,,", "duration", "'ten' is not a number"),
        ("a,0,-5,1,,,,,", "duration", "'-5' is negative"),
        ("a,-1,5,1,,,,,", "submit_time", "'-1' is negative"),
        ("a,0,nan,1,,,,,", "duration", "not a finite number"),
        ("a,0,inf,1,,,,,", "duration", "not a finite number"),
        ("a,0,1,-2,,,,,", "gpus", "'-2' is less than 0"),
        ("a,0,1,2.5,,,,,", "gpus", "'2.5' is not a whole number"),
        ("a,0,1,eight,,,,,", "gpus", "'eight' is not a whole number"),
        ("a,0,1,,,,,,", "gpus", "the cell is empty"),
        ("a,,1,1,,,,,", "submit_time", "the cell is empty"),
        (",0,1,1,,,,,", "job_id", "the cell is empty"),
        ("a,0,1,16,3,8,,,", "gpus", "16 is not replicas x gpus_per_replica = 3 x 8"),
        ("a,0,1,16,3,,,,", "replicas", "do not split evenly into 3 replicas"),
        ("a,0,1,16,,6,,,", "gpus_per_replica", "not a whole number of replicas of 6"),
        ("a,0,1,16,0,,,,", "replicas", "'0' is less than 1"),
        ("a,0,1,1,,,yes,,", "preemptible", "'yes' is not a boolean"),
        ("a,0,1,1,,,,0,", "time_limit", "0 is not a time limit"),
        ("a,0,1,1,,,,-60,", "time_limit", "'-60' is negative"),
        ("a,0,1,1,,,,,A100||H100", "gpu_model", "has an empty model name"),
    ],
)
def test_a_malformed_row_names_the_file_line_and_column(
    tmp_path: Path, row: str, column: str, words: str
) -> None:
    path = write(tmp_path, HEADER + GOOD + "\n" + row + "\n")  # the blank line counts: the row is on line 4
    with pytest.raises(TraceError) as caught:
        read_trace(path, largest_node_gpus=8)
    message = str(caught.value)
    assert message.startswith(f"{path}, line 4, column {column!r}: ")
    assert words in message
    assert "(fix: " in message


def test_duplicate_job_id_names_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "job_id,submit_time,duration,gpus\na,0,1,1\nb,0,1,1\na,3,1,1\n")
    with pytest.raises(TraceError, match=r"line 4, column 'job_id': 'a' is already the id of line 2"):
        read_trace(path, largest_node_gpus=8)


def test_missing_required_column_names_it_and_shows_the_header(tmp_path: Path) -> None:
    path = write(tmp_path, "job_id,submit,gpus\na,0,1\n")
    with pytest.raises(TraceError) as caught:
        read_trace(path, largest_node_gpus=8)
    message = str(caught.value)
    assert f"{path}, line 1: missing required column(s) submit_time, duration" in message
    assert "the header has 'job_id', 'submit', 'gpus'" in message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "the file is empty"),
        ("job_id,submit_time,duration,gpus,gpus\n", "column 'gpus' appears twice"),
        ("job_id,submit_time,duration,gpus\na,0,1\n", "line 2: 3 cells but the header has 4 columns"),
        ("job_id,submit_time,duration,gpus\na,0,1,1,9\n", "line 2: 5 cells but the header has 4 columns"),
    ],
)
def test_malformed_files(tmp_path: Path, text: str, words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TraceError, match=words):
        read_trace(path, largest_node_gpus=8)


def test_a_quoted_cell_over_two_lines_keeps_line_numbers_physical(tmp_path: Path) -> None:
    path = write(tmp_path, 'job_id,submit_time,duration,gpus,user\na,0,1,1,"two\nlines"\nb,0,-1,1,\n')
    with pytest.raises(TraceError, match="line 4, column 'duration'"):
        read_trace(path, largest_node_gpus=8)
