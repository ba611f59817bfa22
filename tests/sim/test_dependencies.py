"""The trace's dependency column in a replay: pipelines run in order, impossible ones are cancelled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.core.errors import TraceError
from corral.sim.metrics import Measures
from corral.sim.trace import read_trace, write_trace
from tests.sim.test_engine import cluster, job, replay


def ends(events: list[dict[str, Any]]) -> dict[str, tuple[str, float]]:
    kinds = ("finish", "fail", "cancel", "reject")
    return {e["job"]: (e["event"], e["t"]) for e in events if e["event"] in kinds}


def test_a_pipeline_runs_in_order_though_all_arrive_at_once() -> None:
    jobs = [
        job("prep", 0, 100, gpus=1),
        job("train", 0, 200, gpus=1, dependency="afterok:prep"),
        job("eval", 0, 50, gpus=1, dependency="afterok:train"),
        job("report", 0, 10, gpus=1, dependency="afterany:eval,after:prep"),
    ]
    events = replay(jobs, "default", cluster(gpus=4))
    start = {e["job"]: e["t"] for e in events if e["event"] == "start"}
    assert start == {"prep": 0, "train": 100, "eval": 300, "report": 350}
    assert [e.get("dependency") for e in events if e["event"] == "submit"] == [
        None,
        "afterok:prep",
        "afterok:train",
        "afterany:eval,after:prep",
    ]


def test_a_failed_step_cancels_what_waits_for_it_and_runs_its_afternotok() -> None:
    jobs = [
        job("prep", 0, 100, gpus=1, time_limit=50),  # killed at its limit: `fail`
        job("train", 0, 200, gpus=1, dependency="afterok:prep"),
        job("eval", 0, 50, gpus=1, dependency="afterok:train"),
        job("cleanup", 0, 10, gpus=1, dependency="afternotok:prep"),
    ]
    events = replay(jobs, "default", cluster(gpus=4))
    assert ends(events) == {
        "prep": ("fail", 50),
        "train": ("cancel", 50),
        "eval": ("cancel", 50),
        "cleanup": ("finish", 60),
    }
    reasons = {e["job"]: e["reason"] for e in events if e["event"] == "cancel"}
    assert reasons["train"] == "dependency never satisfied: prep did not finish successfully (afterok:prep)"
    measures = Measures()
    for e in events:
        measures.feed(e)
    assert measures.summary()["jobs"]["cancelled"] == 2


def test_the_column_reads_and_writes_back(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time,duration,gpus,dependency\na,0,10,1,\nb,0,10,1,afterok:a\n")
    jobs = read_trace(path, largest_node_gpus=8)
    assert [j.dependency for j in jobs] == [None, "afterok:a"]
    write_trace(tmp_path / "back.csv", jobs)
    assert read_trace(tmp_path / "back.csv", largest_node_gpus=8) == jobs


@pytest.mark.parametrize(
    ("deps", "says"),
    [
        ({"a": "afterok:b", "b": "afterany:c", "c": "after:a"}, "dependency cycle: a -> b -> c -> a"),
        ({"a": "afterok:a"}, "dependency cycle: a -> a"),
        ({"a": "afterok:nope"}, "names 'nope', which is not a job of the trace"),
        ({"a": "singleton"}, "singleton needs job names"),
        ({"a": "afterwards:b"}, "'afterwards' is not a dependency type"),
    ],
)
def test_bad_dependencies_are_fatal_and_name_the_job(deps: dict[str, str], says: str) -> None:
    jobs = [job(name, 0, 10, gpus=1, dependency=deps.get(name)) for name in ("a", "b", "c")]
    with pytest.raises(TraceError) as err:
        replay(jobs, "default", cluster(gpus=4))
    assert says in str(err.value)
