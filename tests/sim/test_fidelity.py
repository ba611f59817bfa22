"""Fidelity against the Helios artifact's own simulator, run on the same Philly file (per VC, FIFO)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from corral.sim.loaders.location import shared_traces_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (shared_traces_dir() / "philly_pollux").is_dir(), reason="shared traces not present")
def test_per_vc_fifo_replay_is_within_ten_percent_of_helios() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from sim_fidelity import replay
    finally:
        sys.path.pop(0)
    rows = replay("fifo")
    assert len(rows) == 12  # 11 VCs and the overall row
    for r in rows:
        # the reference truncates to whole seconds: allow that, and 10 % otherwise
        assert abs(float(r["jct"]) - float(r["ref_jct"])) <= max(0.10 * float(r["ref_jct"]), 1.0), r
        assert abs(float(r["queue"]) - float(r["ref_queue"])) <= max(0.10 * float(r["ref_queue"]), 1.0), r
