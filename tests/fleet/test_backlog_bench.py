"""`bench/server_bench.py --only backlog --quick` runs end to end and produces its figures: a real
`corral server`, the bench's fleet (8 nodes), a backlog of 2,000 jobs in arrays, an idle-blocked
window and 8 jobs ended by the fleet, each followed by a start on its GPUs. Behaviour only: the
figures' values are the benchmark's business (docs/benchmarks.md), not a test's."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_backlog_quick_produces_its_figures(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from bench import server_bench

    out = tmp_path / "out.json"
    assert server_bench.main(["--only", "backlog", "--quick", "--json", str(out)]) == 0
    got = json.loads(out.read_text())["results"]["backlog"]
    assert (got["nodes"], got["pending"], got["fill_jobs"], got["ends"]) == (8, 2000, 30, 8)
    assert got["matched"] >= 1  # an ended job's GPUs went to a waiting job, and it was measured
    assert got["matched"] + got["no_next_start"] == got["ends"]
    for key in ("next_start_p50_s", "agent_start_p99_s", "exit_to_cycle_p50_s", "idle_scheduler_cpu_pct"):
        assert math.isfinite(got[key]) and got[key] >= 0, key
    assert (
        got["agent_start_p50_s"] >= got["next_start_p50_s"]
    )  # the agent hears of a start after it is decided
    assert got["preemptions"] == 0 and got["scheduler_rss_max_mib"] > 0
