"""What-if fidelity on a live run: does the baseline replay of the cluster's own history
reproduce the waits it had? (issue 19; docs/whatif.md, "How far to trust it")

Run: `.venv/bin/python bench/whatif_fidelity.py [--jobs 2500] [--nodes 64] [--speed 1000]
[--json OUT]`.

The shadow replay's setting (bench/shadow_replay.py): a Philly slice, one queue per virtual
cluster, compressed `--speed` times, submitted over HTTP to a real `corral server` whose nodes
the fleet plays. Once every job has started, the history is exported (`GET /v1/history`, as
`corral trace export` does) and replayed by `corral whatif`'s code under the configuration in
force (the baseline) and under one proposed quota change (the busiest queue guaranteed a quarter
of the GPUs). Printed: per queue, average wait live against replayed (compressed seconds), and
the what-if's overall difference.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tests.fleet.harness import compress, run_live, submissions  # noqa: E402

from corral.client import Client  # noqa: E402
from corral.sim.whatif import OVERALL, proposed_body  # noqa: E402
from corral.sim.whatif_run import what_if  # noqa: E402
from shadow_replay import cluster_file, philly_slice  # noqa: E402


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    jobs = philly_slice(args.start, args.jobs, "vc")
    queues = sorted({j.queue or "qone" for j in jobs})
    cluster = tmp / "cluster.yaml"
    cluster_file(cluster, args.nodes, [q[1:] for q in queues])
    fast = compress(jobs, args.speed)
    box: dict[str, Any] = {}

    def export(server: Any, _fleet: int) -> None:
        with Client(server.url, server.admin_token, timeout=600) as c:
            box["export"] = c.history(time.time() - 6 * 3600)

    run = run_live(cluster, submissions(fast, "qone"), tmp / "live", policy=args.policy, after=export)
    found = box["export"]
    busiest = max(queues, key=lambda q: sum(j.gpus for j in jobs if j.queue == q))
    proposal = proposed_body(found["config"], queue_change=(busiest, {"quota": args.nodes * 8 // 4}))
    result = what_if(found, proposal, f"queue {busiest}: quota={args.nodes * 8 // 4}")
    return {"started_all": run.started_all, "counts": found["counts"], "result": result}


def main(argv: list[str] | None = None) -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--jobs", type=int, default=2500)
    parser.add_argument("--start", default="2017-10-03 00:00:00")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--speed", type=float, default=1000.0)
    parser.add_argument("--policy", default="default")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args(argv)
    out = measure(args, Path(tempfile.mkdtemp(prefix="corral-whatif-")))
    result = out["result"]
    print(f"{args.jobs} Philly jobs from {args.start}, {args.nodes} nodes x 8 GPUs, clock x{args.speed:g}")
    print(f"export: {out['counts']}; every job started live: {out['started_all']}")
    print(result["fidelity_text"])
    print(f"{'queue':>12} {'jobs':>5} {'live avg wait':>14} {'replayed':>10} {'diff':>9} {'error':>7}")
    for queue, f in result["fidelity"]["queues"].items():
        error = "-" if f["error"] is None else f"{f['error']:.1%}"
        print(
            f"{queue:>12} {f['jobs']:>5} {f['live_avg_wait']:>14.3f} {f['replayed_avg_wait']:>10.3f}"
            f" {f['difference_s']:>+9.3f} {error:>7}"
        )
    b, p = result["baseline"][OVERALL], result["proposed"][OVERALL]
    print(f"what-if {result['change']}: overall avg wait {b['avg_wait']:.3f} -> {p['avg_wait']:.3f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **out}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
