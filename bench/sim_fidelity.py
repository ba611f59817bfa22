"""Fidelity: replay Philly per virtual cluster as the Helios artifact did and compare with its numbers.

Run: .venv/bin/python bench/sim_fidelity.py [--policy fifo]
Jobs submitted 2017-10-01 .. 2017-11-30 (68,503), each VC on its own 8-GPU nodes, strict FIFO with
head-of-line blocking, consolidated placement. The reference is the Helios simulator run on this
very file (../shared/traces/philly_pollux/reference_results_helios_sim_on_this_file.csv).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from corral.policies.registry import load_policy
from corral.sim.engine import Simulation
from corral.sim.eventlog import EventLog
from corral.sim.loaders.philly import load_helios_reference, load_philly_helios, load_vc_nodes
from corral.sim.metrics import Measures
from philly_setup import vc_cluster


def replay(policy: str = "fifo") -> list[dict[str, float | str]]:
    """Per VC: our average JCT and queueing delay next to the reference's, and the ratios."""
    jobs = load_philly_helios()
    nodes = load_vc_nodes()
    reference = load_helios_reference()
    rows: list[dict[str, float | str]] = []
    total_jct = total_queue = 0.0
    count = 0
    for vc in sorted(nodes, key=lambda v: -sum(1 for j in jobs if j.queue == v)):
        mine = [j for j in jobs if j.queue == vc]
        measures = Measures()
        Simulation(vc_cluster(vc, nodes[vc]), mine, load_policy(policy), EventLog([measures.feed])).run()
        s = measures.summary()
        jct, queue = s["jct"]["mean"], s["queueing_delay"]["mean"]
        total_jct += jct * len(mine)
        total_queue += queue * len(mine)
        count += len(mine)
        ref = reference[vc]
        rows.append(_row(vc, len(mine), jct, queue, ref["avg_jct_s"][policy], ref["avg_queue_s"][policy]))
    ref = reference["all"]
    rows.append(
        _row(
            "all",
            count,
            total_jct / count,
            total_queue / count,
            ref["avg_jct_s"][policy],
            ref["avg_queue_s"][policy],
        )
    )
    return rows


def _row(
    vc: str, jobs: int, jct: float, queue: float, ref_jct: float, ref_queue: float
) -> dict[str, float | str]:
    jct_ratio = jct / ref_jct if ref_jct else 1.0
    queue_ratio = queue / ref_queue if ref_queue else float("nan")
    return {"vc": vc, "jobs": jobs, "jct": jct, "ref_jct": ref_jct, "jct_ratio": jct_ratio} | {
        "queue": queue,
        "ref_queue": ref_queue,
        "queue_ratio": queue_ratio,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="fifo", choices=["fifo", "sjf"])
    args = parser.parse_args()
    started = time.perf_counter()
    rows = replay(args.policy)
    head = ("vc", "jobs", "avg JCT", "Helios", "ratio", "avg queue", "Helios", "ratio")
    print("{:8} {:>6} {:>10} {:>10} {:>6} {:>10} {:>8} {:>6}".format(*head))
    for r in rows:
        print(
            f"{r['vc']:8} {r['jobs']:>6} {r['jct']:>10.1f} {r['ref_jct']:>10.0f} {r['jct_ratio']:>6.3f} "
            f"{r['queue']:>10.1f} {r['ref_queue']:>8.0f} {r['queue_ratio']:>6.3f}"
        )
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
