"""`corral simulate --arg PLUGIN.KEY=VALUE`: plugin arguments reach the policies that use them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app

CLUSTER = """\
name: two-teams
nodes:
  - {name: "n[1-2]", gpus: 8}
queues:
  - {name: a, quota: 2}
  - {name: b, quota: 2}
"""


def files(tmp_path: Path) -> tuple[str, str]:
    """Team a borrows 14 of 16 GPUs; then team b wants 10, above its quota of 2."""
    rows = ["job_id,submit_time,duration,gpus,queue"]
    rows += [f"a{i},0,3000,1,a" for i in range(14)]
    rows += [f"b{i},700,3000,1,b" for i in range(10)]
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "trace.csv").write_text("\n".join(rows) + "\n")
    return str(tmp_path / "cluster.yaml"), str(tmp_path / "trace.csv")


def simulate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["simulate", *args])
    return result.exit_code, result.output


def test_surplus_reclaim_is_off_by_default_and_on_with_an_argument(tmp_path: Path) -> None:
    cluster, trace = files(tmp_path)
    code, out = simulate("-c", cluster, "-t", trace, "--json")
    assert code == 0, out
    assert json.loads(out)["jobs"]["preemptions"] == 0  # b waits for a's jobs: no borrower preempts another
    code, out = simulate(
        "-c", cluster, "-t", trace, "--json", "-p", "default", "-p", "fifo",
        "--arg", "priority_reclaim.surplus=true",
    )  # fmt: skip
    assert code == 0, out
    both = json.loads(out)
    assert both["default"]["jobs"]["preemptions"] == 6  # b rebalanced to 8 + 8 by preemption
    assert both["fifo"]["jobs"]["preemptions"] == 0  # fifo has no such plugin: the argument skips it


def test_a_bad_argument_names_it_and_the_fix(tmp_path: Path) -> None:
    cluster, trace = files(tmp_path)
    code, out = simulate("-c", cluster, "-t", trace, "-p", "fifo", "--arg", "priority_reclaim.surplus=true")
    assert code != 0 and "no policy given uses plugin priority_reclaim" in out, out
    code, out = simulate("-c", cluster, "-t", trace, "--arg", "priority_reclaim.bogus=1")
    assert code != 0 and "has no argument bogus" in out and "reclaim, spare_after, surplus" in out, out
    code, out = simulate("-c", cluster, "-t", trace, "--arg", "surplus")
    assert code != 0 and "write PLUGIN.KEY=VALUE" in out, out


def test_a_checkpoint_interval_for_jobs_without_one_keeps_their_work_up_to_the_last(tmp_path: Path) -> None:
    cluster, trace = files(tmp_path)
    base = ["-c", cluster, "-t", trace, "--json", "--arg", "priority_reclaim.surplus=true"]
    lost = []
    for extra in ([], ["--checkpoint-interval", "600"]):
        code, out = simulate(*base, *extra)
        assert code == 0, out
        lost.append(json.loads(out)["preempted_gpu_hours_lost"])
    # six 1-GPU victims preempted 700 s after their start stop after their 30 s grace: all 730 s
    # lost, or the 130 s since their checkpoint at 600 s
    assert lost[0] == pytest.approx(6 * 730 / 3600, rel=0.01), lost
    assert lost[1] == pytest.approx(6 * 130 / 3600, rel=0.01), lost
    code, out = simulate(*base, "--checkpoint-interval", "0")
    assert code != 0 and "checkpoint interval > 0" in out, out
