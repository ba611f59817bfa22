"""`python -m corral.fleet`: play many node agents against a running `corral server`.

    python -m corral.fleet --server http://127.0.0.1:8400 --cluster cluster.yaml --duration 300
    python -m corral.fleet --server URL --nodes 1000 --gpus 8 --stats-out fleet.json   # dynamic nodes

The admin token comes from `--token-file` or `$CORRAL_TOKEN`; it only makes one agent token per
node. With `--cluster` the nodes are the file's (declared: the server must have been started
with it); with `--nodes N` they are `fleet00001`.. with `--gpus` each, 32 to a `leaf` label
(the server needs `--allow-dynamic-nodes`). The fleet runs until `--duration` seconds have
passed or it gets SIGINT or SIGTERM, then writes `--stats-out` (JSON: counts and every
request's send time and latency) and prints a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from corral.fleet.agents import Fleet, FleetOptions, create_tokens


def inventories(args: argparse.Namespace) -> list[dict[str, Any]]:
    """What each node's agent reports at registration."""
    if args.cluster:
        from corral.config.cluster_file import load_cluster_file

        return [
            {
                "node": str(n.name),
                "gpus": n.gpus,
                "gpu_model": n.gpu_model,
                "gpu_memory_gib": n.gpu_memory_gib,
                "cpus": n.cpus,
                "memory_gib": n.memory_gib,
                "labels": dict(n.labels),
                "nvlink": [list(g) for g in n.nvlink],
                "address": "127.0.0.1",
            }
            for n in load_cluster_file(args.cluster).nodes
        ]
    return [
        {
            "node": f"{args.prefix}{i + 1:05d}",
            "gpus": args.gpus,
            "gpu_model": args.gpu_model,
            "labels": {"leaf": f"l{i // 32}"},
            "address": "127.0.0.1",
        }
        for i in range(args.nodes)
    ]


async def play(args: argparse.Namespace, token: str) -> dict[str, Any]:
    nodes = inventories(args)
    started = time.monotonic()
    tokens = await create_tokens(args.server, token, [n["node"] for n in nodes])
    options = FleetOptions(
        heartbeat=args.heartbeat, poll_wait=args.poll_wait, pool=args.pool, speed=args.speed,
        default_run=args.default_run, honour_grace=args.honour_grace, seed=args.seed,
    )  # fmt: skip
    fleet = Fleet(args.server, nodes, tokens, options)
    await fleet.register(args.register_concurrency)
    joined = time.monotonic() - started
    print(f"fleet: {len(nodes)} nodes registered in {joined:.1f} s", file=sys.stderr, flush=True)
    gc.collect()
    gc.freeze()  # the nodes live for the whole run: keep them out of the collector's way
    loop = asyncio.get_running_loop()
    if args.ready_file:  # once every node's first long poll has been sent
        ready = Path(args.ready_file)
        loop.call_later(
            fleet.poll_spread + 0.5, ready.write_text, json.dumps({"nodes": len(nodes), "joined_s": joined})
        )
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, fleet.stop)
    if args.duration:
        loop.call_later(args.duration, fleet.stop)
    await fleet.run()
    return {"summary": fleet.summary(), "joined_s": joined, "samples": fleet.recorder.dump()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m corral.fleet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--server", default="http://127.0.0.1:8400", help="the server's URL (plain HTTP)")
    parser.add_argument("--token-file", help="a file holding an admin token (default: $CORRAL_TOKEN)")
    parser.add_argument("--cluster", help="play the nodes declared in this cluster file")
    parser.add_argument("--nodes", type=int, default=100, help="without --cluster: this many dynamic nodes")
    parser.add_argument("--prefix", default="fleet", help="without --cluster: node name prefix")
    parser.add_argument("--gpus", type=int, default=8, help="without --cluster: GPUs per node")
    parser.add_argument("--gpu-model", default="H100-80GB", help="without --cluster: the GPU model")
    parser.add_argument(
        "--duration", type=float, default=0.0, help="seconds to run (default: until a signal)"
    )
    parser.add_argument("--heartbeat", type=float, default=5.0, help="seconds between heartbeats")
    parser.add_argument("--poll-wait", type=float, default=30.0, help="seconds each long poll waits")
    parser.add_argument("--pool", type=int, default=64, help="connections for heartbeats and reports")
    parser.add_argument("--speed", type=float, default=1.0, help="a `sleep N` job runs N / SPEED seconds")
    parser.add_argument("--default-run", type=float, default=60.0, help="seconds any other job runs")
    parser.add_argument("--honour-grace", action="store_true", help="a stopped job exits after its grace")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--register-concurrency",
        type=int,
        default=32,
        help="registrations in flight (1: in the nodes' order)",
    )
    parser.add_argument("--stats-out", help="write counts and every request's latency here (JSON)")
    parser.add_argument("--ready-file", help="write this file once every node has registered and polls")
    args = parser.parse_args(argv)
    token = (
        Path(args.token_file).read_text().strip() if args.token_file else os.environ.get("CORRAL_TOKEN", "")
    )
    if not token:
        parser.error("no admin token: give --token-file or set CORRAL_TOKEN")
    out = asyncio.run(play(args, token))
    if args.stats_out:
        Path(args.stats_out).write_text(json.dumps(out))
    from corral.fleet.stats import Recorder

    print(json.dumps({**out["summary"], "latency": Recorder.load(out["samples"]).summary()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
