"""SHA-256 of whole replays' event logs (and of every cycle's reasons), to show that a change of
the core decides exactly as before.

Run the same command on the code before and after a change and compare the lines:

    .venv/bin/python bench/replay_hashes.py [--only NAME[,NAME]] [--reasons] [--arg PLUGIN.KEY=VALUE]
    PYTHONPATH=/tmp/before/src .venv/bin/python bench/replay_hashes.py ...   # a snapshot of before

Each line: the replay's name, its event log's SHA-256 and event count, and with `--reasons` the
SHA-256 of every cycle's reasons (job id, code and sentence of each job the cycle looked at and
did not start, sorted by job id; the reason of the jobs it did not reach; its `next_wake`), and
the seconds (wall and CPU) it took. `--search-again` answers no reservation search from memory
(`reserve.earliest_fit`), to show the memory changes nothing (interpreted core only). `--arg`
gives the replays' policy plugin arguments, as `sim_speed.py`'s does (e.g. `--only
philly_tiresias --arg tiresias.estimate_weight=4`); a replay whose policy lacks the plugin fails.
`--no-skip` runs every cycle after arrivals alone (`SimOptions.skip_quiet` off; see
`core/quiet.py`): the hashes are the same either way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from corral.config.cluster_file import ClusterConfig  # noqa: E402
from corral.core.decisions import CycleResult  # noqa: E402
from corral.policies.registry import load_policy, parse_plugin_args  # noqa: E402
from corral.sim.engine import SimOptions, Simulation  # noqa: E402
from corral.sim.eventlog import EventLog  # noqa: E402
from corral.sim.jobmodel import PreemptionCost  # noqa: E402
from corral.sim.loaders.philly import load_philly, load_vc_nodes  # noqa: E402
from corral.sim.trace import TraceJob  # noqa: E402
from overload_trace import overload_cluster, overload_trace  # noqa: E402
from philly_setup import shared_cluster  # noqa: E402
from sim_speed import flat_cluster  # noqa: E402

Case = Callable[[], tuple[ClusterConfig, list[TraceJob], str, SimOptions]]


def _philly_shared(fraction: float, policy: str, options: SimOptions | None = None) -> Case:
    def case() -> tuple[ClusterConfig, list[TraceJob], str, SimOptions]:
        jobs = load_philly()
        return shared_cluster(load_vc_nodes(), jobs, fraction), jobs, policy, options or SimOptions()

    return case


def _philly_las() -> tuple[ClusterConfig, list[TraceJob], str, SimOptions]:
    jobs = [replace(j, queue=None) for j in load_philly()]
    return flat_cluster(128), jobs, "las", SimOptions()


def _overload(nodes: int, count: int, policy: str) -> Case:
    def case() -> tuple[ClusterConfig, list[TraceJob], str, SimOptions]:
        return overload_cluster(nodes), overload_trace()[:count], policy, SimOptions()

    return case


CASES: dict[str, Case] = {
    "philly_default": _philly_shared(1.0, "default"),
    "philly_quarter_default": _philly_shared(0.25, "default"),
    "philly_quarter_las": _philly_shared(0.25, "las"),
    "philly_half_fifo": _philly_shared(0.5, "fifo"),
    "philly_half_sjf": _philly_shared(0.5, "sjf"),
    "philly_las_1024": _philly_las,
    "philly_quarter_default_ckpt_interval_failures": _philly_shared(
        0.25,
        "default",
        SimOptions(
            min_interval=30.0, node_mtbf=30 * 86400.0, preemption=PreemptionCost(default_interval=1800.0)
        ),
    ),
    "overload32_default_600": _overload(32, 600, "default"),
    "overload128_default_1000": _overload(128, 1000, "default"),
    "overload128_las_1000": _overload(128, 1000, "las"),
    "overload128_default_3000": _overload(128, 3000, "default"),
    "overload128_las_3000": _overload(128, 3000, "las"),
    "overload64_default_2000": _overload(64, 2000, "default"),
    # `sim_speed.py`'s `overload128` and `overload --jobs 20000` whole (issue 15, reservation memory)
    "overload128_default_5000": _overload(128, 5000, "default"),
    "overload5000_default_20000": _overload(5000, 20000, "default"),
    # the estimator (issue 16; not on a main without the `estimated` policy)
    "philly_quarter_estimated": _philly_shared(0.25, "estimated"),
    "overload128_estimated_1000": _overload(128, 1000, "estimated"),
    # Tiresias inside a queue (issue 16, fifth pass; not on a main without the `tiresias` policy)
    "philly_quarter_tiresias": _philly_shared(0.25, "tiresias"),
    "overload128_tiresias_1000": _overload(128, 1000, "tiresias"),
    # `sim_speed.py --only overload128 --policy tiresias` whole (tir11: its memory of fresh candidates)
    "overload128_tiresias_5000": _overload(128, 5000, "tiresias"),
    # whole Philly and a fifth under `tiresias` (issue 16, ninth pass: with `--arg
    # tiresias.estimate_weight=4`, the estimator's cache against the long way)
    "philly_tiresias": _philly_shared(1.0, "tiresias"),
    "philly_fifth_tiresias": _philly_shared(0.2, "tiresias"),
}
QUICK = ["philly_las_1024", "philly_half_sjf", "overload64_default_2000"]


class Digest:
    """Hashes the event log as `--events-out` writes it, and optionally every cycle's reasons."""

    def __init__(self) -> None:
        self.log = hashlib.sha256()
        self.reasons = hashlib.sha256()
        self.events = 0
        self._dumps = json.JSONEncoder(separators=(",", ":")).encode

    def event(self, event: dict[str, Any]) -> None:
        self.events += 1
        self.log.update(self._dumps(event).encode())
        self.log.update(b"\n")

    def cycle(self, result: CycleResult) -> None:
        lines = [f"{job}\t{r.code.value}\t{r.message}" for job, r in sorted(result.reasons.items())]
        others = "" if result.others is None else f"{result.others.code.value}\t{result.others.message}"
        self.reasons.update(f"{result.now!r}\n{result.next_wake!r}\n{others}\n".encode())
        self.reasons.update("\n".join(lines).encode())


def replay(name: str, reasons: bool, args: list[str] | None = None, skip: bool = True) -> dict[str, Any]:
    cluster, jobs, policy, options = CASES[name]()
    options = replace(options, skip_quiet=skip)
    digest = Digest()
    profile = load_policy(policy, parse_plugin_args(args or []))
    sim = Simulation(cluster, jobs, profile, EventLog([digest.event]), options)
    if reasons:
        sim.on_cycle = digest.cycle
    started, cpu = time.perf_counter(), time.process_time()
    sim.run()
    out: dict[str, Any] = {"case": name} | ({"args": args} if args else {})
    out |= {"events": digest.events, "log_sha256": digest.log.hexdigest()}
    if reasons:
        out["reasons_sha256"] = digest.reasons.hexdigest()
    out["cycles"], out["skipped"] = sim.stats.cycles, sim.stats.skipped
    out["s"] = round(time.perf_counter() - started, 1)
    out["cpu_s"] = round(time.process_time() - cpu, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated replays: {', '.join(CASES)}")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--reasons", action="store_true", help="hash every cycle's reasons too")
    parser.add_argument(
        "--search-again",
        action="store_true",
        help="search every reservation again instead of answering from memory (interpreted core only)",
    )
    parser.add_argument("--arg", action="append", default=[], help="PLUGIN.KEY=VALUE, policy arguments")
    parser.add_argument("--no-skip", action="store_true", help="run every cycle after arrivals alone")
    args = parser.parse_args(argv)
    if args.search_again:
        from corral.core import reserve

        reserve.REMEMBER = False
    names = args.only.split(",") if args.only else QUICK if args.quick else list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown replay {', '.join(unknown)}; known: {', '.join(CASES)}")
    for name in names:
        print(json.dumps(replay(name, args.reasons, args.arg, not args.no_skip)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
