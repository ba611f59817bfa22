"""The fleet of `server_bench.py --only backlog`: `python -m corral.fleet`'s agents, with two
additions the scenario needs (bench/server_backlog.py starts it as its own process).

- Every start order a node receives is recorded (job, attempt, node, GPUs, wall time), so the
  time from an exit report to the next start can be taken where the start happens: at the agent.
- The jobs run `sleep 1000000` (nothing ends by itself). When the file `--ends-file` appears,
  holding `{"rate": R, "count": K, "prefix": P}`, the fleet ends K running jobs whose name starts
  with P, R per second, picked at random: each exits 0 and its node reports `exited`, as a job
  that finishes does. The benchmark thus decides when the window of endings begins, whatever the
  time the backlog took to submit.

Run by the scenario: `python bench/backlog_fleet.py --server URL --token-file F --cluster C
--ready-file R --ends-file E --stats-out S`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from corral.config.cluster_file import load_cluster_file
from corral.fleet.agents import Fleet, FleetOptions, Node, create_tokens
from corral.protocol import StartOrder, StopOrder, TerminalOrder


class EndingFleet(Fleet):
    """A fleet that records start orders and ends jobs when told to."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.started: list[dict[str, Any]] = []  # every start order received, in order
        self.names: dict[tuple[str, int], str] = {}
        self.where: dict[tuple[str, int], Node] = {}
        self.ended: list[dict[str, Any]] = []  # every job this fleet ended, when
        self.ender_error: str | None = None

    def _handle(self, node: Node, orders: list[StartOrder | StopOrder | TerminalOrder]) -> None:
        now = time.time()
        for order in orders:
            if isinstance(order, StartOrder) and (order.job, order.attempt) not in node.jobs:
                key = (order.job, order.attempt)
                self.names[key] = str(order.spec.get("name", ""))
                self.where[key] = node
                self.started.append({"job": order.job, "attempt": order.attempt, "node": node.name, "t": now})
        super()._handle(node, orders)

    async def ender(self, path: Path) -> None:
        """Wait for `path`, then end what it asks for at its rate. An error is kept in
        `self.ender_error` (a spawned task's exception would otherwise go unseen)."""
        try:
            await self._end(path)
        except Exception as exc:  # kept for the stats; the benchmark raises it
            self.ender_error = f"{type(exc).__name__}: {exc}"
            raise

    async def _end(self, path: Path) -> None:
        while not path.exists():  # the benchmark renames the plan into place: never half written
            await asyncio.sleep(0.2)
        plan = json.loads(path.read_text())
        rng = random.Random(plan.get("seed", 0))
        prefix, rate, count = str(plan["prefix"]), float(plan["rate"]), int(plan["count"])
        loop = asyncio.get_running_loop()
        due = loop.time()
        for _ in range(count):
            live = [k for k, n in self.where.items() if self.names[k].startswith(prefix) and n.jobs.get(k)]
            if not live:
                raise RuntimeError(f"asked to end {count} jobs named {prefix}*, {len(self.ended)} ended, "
                                   f"none is left running on this fleet ({self.counts.get('starts', 0)} "
                                   "start orders received)")  # fmt: skip
            key = rng.choice(live)
            node = self.where[key]
            timer = node.jobs[key]
            assert timer is not None
            timer.cancel()
            self.ended.append({"job": key[0], "attempt": key[1], "node": node.name, "t": time.time()})
            self._exit(node, key, 0, None)
            due += 1.0 / rate
            await asyncio.sleep(max(0.0, due - loop.time()))


def write_whole(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` whole: a reader that sees the path sees all of it."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(data))
    part.replace(path)


def inventories(cluster: str) -> list[dict[str, Any]]:
    return [
        {"node": str(n.name), "gpus": n.gpus, "gpu_model": n.gpu_model, "labels": dict(n.labels),
         "address": "127.0.0.1"}
        for n in load_cluster_file(cluster).nodes
    ]  # fmt: skip


async def play(args: argparse.Namespace, token: str) -> dict[str, Any]:
    nodes = inventories(args.cluster)
    began = time.monotonic()
    tokens = await create_tokens(args.server, token, [n["node"] for n in nodes])
    fleet = EndingFleet(args.server, nodes, tokens, FleetOptions(poll_wait=30.0, pool=64))
    await fleet.register(32)
    joined = time.monotonic() - began
    gc.collect()
    gc.freeze()
    loop = asyncio.get_running_loop()
    ready = Path(args.ready_file)
    loop.call_later(fleet.poll_spread + 0.5, write_whole, ready, {"joined_s": joined})
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, fleet.stop)
    ender = fleet.spawn(fleet.ender(Path(args.ends_file)))
    await fleet.run()
    ender.cancel()
    return {
        "summary": fleet.summary(), "joined_s": joined, "samples": fleet.recorder.dump(),
        "started": fleet.started, "ended": fleet.ended, "ender_error": fleet.ender_error,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for name in ("--server", "--token-file", "--cluster", "--ready-file", "--ends-file", "--stats-out"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    token = Path(args.token_file).read_text().strip()
    out = asyncio.run(play(args, token))
    write_whole(Path(args.stats_out), out)
    print(json.dumps(out["summary"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
