"""`corral simulate --arg PLUGIN.KEY=VALUE`: plugin arguments reach the policies that use them."""

from __future__ import annotations

import json
from pathlib import Path

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
    assert code != 0 and "has no argument bogus" in out and "reclaim, surplus" in out, out
    code, out = simulate("-c", cluster, "-t", trace, "--arg", "surplus")
    assert code != 0 and "write PLUGIN.KEY=VALUE" in out, out
