"""Node-agent benchmarks on a real control plane and three real agents (issue 5's figures).

Run: `.venv/bin/python bench/agent_bench.py [--jobs 30] [--rounds 5] [--loopback] [--json OUT]`
(as root: it builds network namespaces; `--loopback`, or a machine where `ip netns add` is not
permitted, runs the three agents on this host's loopback instead, and says so).

The cluster is tests/multihost's: `corral server` (SQLite) in one namespace and three agents in
three others, each declaring 4 GPUs and registering its own address; workers are real processes.

- `submit`: submit to every rank running, on an idle cluster (target: p99 <= 1 s). One job at a
  time, 2 replicas of 4 GPUs (so two hosts), whose ranks write `time.time()` as their first
  statement. Measured from the API's acceptance, two ways: the job's `submit` event time (`t`,
  stamped by the server when it commits the job) and the moment the 201 reply reached the client;
  to the last rank's timestamp. Each job ends before the next is sent.
- `preempt`: preemption decision to GPUs free (target: <= grace + 2 s). A low-priority gang on all
  12 GPUs running a `corral.job` training loop (checkpoint: SIGTERM, grace 10 s), then a
  high-priority 2 x 4 job. From the victim's `preempting` event (`t`, the scheduler's decision) to
  its `preempt` event (the attempt ended, its GPUs released) and to the new job's `start`.
- `stubborn`: the same with a victim that ignores the signal (grace 3 s): the kill at the end of
  the grace frees the GPUs, decision to free should be grace + a little.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.multihost.cluster import (  # noqa: E402
    MultiHost,
    events,
    idle,
    steps_job,
    submit,
    wait_state,
)
from tests.multihost.netns import probe  # noqa: E402
from tests.server.harness import wait_for  # noqa: E402

STAMP = "import os, time; open(os.environ['OUT'] + '/t-' + os.environ['RANK'], 'w').write(repr(time.time()))"
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": round(statistics.median(values), 3),
        "p99": round(pct(values, 99), 3),
        "max": round(max(values), 3),
    }


def bench_submit(mh: MultiHost, jobs: int, work: Path) -> dict[str, Any]:
    from_event, from_reply = [], []
    for i in range(jobs):
        out = work / f"submit-{i}"
        out.mkdir()
        spec = {"name": f"stamp-{i}", "replicas": 2, "gpus_per_replica": 4, "max_restarts": 0}
        job_id = submit(mh, **spec, command=[sys.executable, "-c", STAMP], env={"OUT": str(out)})
        replied = time.time()
        done = wait_state(mh, job_id, "finished", "failed", timeout=30)
        assert done["state"] == "finished", done
        last = max(float((out / f"t-{r}").read_text()) for r in range(2))
        accepted = next(e["t"] for e in events(mh, job_id) if e["event"] == "submit")
        from_event.append(last - accepted)
        from_reply.append(last - replied)
    return {"from_submit_event": summary(from_event), "from_201_reply": summary(from_reply)}


def preempt_round(mh: MultiHost, work: Path, i: int, stubborn: bool) -> dict[str, float]:
    out = work / f"{'stubborn' if stubborn else 'preempt'}-{i}"
    if stubborn:
        out.mkdir()
        victim = submit(
            mh,
            name="stubborn",
            replicas=3,
            gpus_per_replica=4,
            priority="low",
            checkpoint={"signal": "SIGTERM", "grace": "3s"},
            command=[sys.executable, "-c", STUBBORN],
        )
        wait_state(mh, victim, "running")
        time.sleep(1.0)  # let Python install its handler
    else:
        victim = steps_job(mh, out, steps=100_000, every=20, step_s=0.05, replicas=3, priority="low")
        wait_state(mh, victim, "running")
        wait_for(lambda: (out / "events.log").exists() and "checkpoint" in (out / "events.log").read_text())
    boss_out = work / f"boss-{'s' if stubborn else 'p'}-{i}"
    boss_out.mkdir()
    boss = submit(
        mh,
        name="boss",
        replicas=2,
        gpus_per_replica=4,
        priority="high",
        command=[sys.executable, "-c", STAMP],
        env={"OUT": str(boss_out)},
    )
    wait_state(mh, boss, "finished", timeout=30)
    evs, boss_evs = events(mh, victim), events(mh, boss)
    decided = next(e["t"] for e in evs if e["event"] == "preempting")
    freed = next(e["t"] for e in evs if e["event"] == "preempt")
    started = next(e["t"] for e in boss_evs if e["event"] == "start")
    ranks = max(float((boss_out / f"t-{r}").read_text()) for r in range(2))
    idle(mh)
    return {"to_freed": freed - decided, "to_new_start": started - decided, "to_new_ranks": ranks - decided}


def bench_preempt(mh: MultiHost, rounds: int, work: Path, stubborn: bool) -> dict[str, Any]:
    samples = [preempt_round(mh, work, i, stubborn) for i in range(rounds)]
    return {key: summary([s[key] for s in samples]) for key in samples[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=30, help="submit-to-running samples")
    parser.add_argument("--rounds", type=int, default=5, help="preemption samples")
    parser.add_argument("--loopback", action="store_true", help="one host, agents on loopback")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    why = None if args.loopback else probe()
    namespaces = not args.loopback and why is None
    where = (
        "network namespaces: server and three agents on four hosts"
        if namespaces
        else "one host: three agents on loopback" + (f" ({why})" if why else "")
    )
    print(f"agent_bench: {where}; {platform.python_version()}, {os.cpu_count()} CPUs", flush=True)
    work = Path(tempfile.mkdtemp(prefix="agent-bench-"))
    mh = MultiHost(work / "cluster", namespaces=namespaces)
    (work / "cluster").mkdir()
    results: dict[str, Any] = {"where": where, "load_before": os.getloadavg()[0]}
    try:
        began = time.monotonic()
        mh.start()
        results["cluster_up_s"] = round(time.monotonic() - began, 2)
        results["submit_to_all_ranks_running_s"] = bench_submit(mh, args.jobs, work)
        print(json.dumps({"submit_to_all_ranks_running_s": results["submit_to_all_ranks_running_s"]}))
        results["preemption_decision_to_gpus_free_s"] = bench_preempt(mh, args.rounds, work, False)
        print(json.dumps({"preemption (grace 10 s)": results["preemption_decision_to_gpus_free_s"]}))
        results["stubborn_victim_grace_3s_s"] = bench_preempt(mh, max(1, args.rounds // 2), work, True)
        print(json.dumps({"preemption, signal ignored (grace 3 s)": results["stubborn_victim_grace_3s_s"]}))
    finally:
        left = mh.stop()
        if left:
            print(f"agent_bench: had to kill {left}", file=sys.stderr)
    results["load_after"] = os.getloadavg()[0]
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
