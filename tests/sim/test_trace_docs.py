"""The trace file example in docs/traces.md reads as documented."""

from __future__ import annotations

import re
from pathlib import Path

from corral.sim.trace import COLUMNS, read_trace

DOC = Path(__file__).resolve().parents[2] / "docs" / "traces.md"


def test_the_documented_example_loads(tmp_path: Path) -> None:
    blocks = re.findall(r"```csv\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)
    assert blocks, "docs/traces.md has no ```csv block"
    path = tmp_path / "example.csv"
    path.write_text(blocks[0], encoding="utf-8")
    jobs = {job.job_id: job for job in read_trace(path, largest_node_gpus=8)}
    assert blocks[0].splitlines()[0] == ",".join(COLUMNS)
    assert (jobs["train-1"].replicas, jobs["train-1"].gpus_per_replica, jobs["train-1"].time_limit) == (
        2,
        8,
        14400,
    )
    assert (jobs["eval-2"].queue, jobs["eval-2"].preemptible, jobs["eval-2"].priority) == (
        "research",
        True,
        None,
    )
    assert (jobs["sweep-3"].replicas, jobs["sweep-3"].gpus_per_replica) == (3, 4)  # as the page says
    assert jobs["sweep-3"].gpu_model == ("A100*", "H100*") and not jobs["sweep-3"].preemptible
