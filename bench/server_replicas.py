"""`server_bench.py --replicas N [--keyed]`: the `submit` scenario through N `corral server`
replicas on one PostgreSQL database.

Replica 1 runs the scheduler; the others serve the API only (`--no-scheduler`): one scheduler
decides, whichever replica took the submission. The client processes are spread over the
replicas (process i sends to replica i mod N). Submissions per second are counted over all of
them; the API CPU is the sum over the replicas. The scheduler's cycle time (its histogram,
`corral_scheduling_cycle_seconds`, from replica 1's `/metrics`) is taken over the measured
window, so that it can be compared with one replica's: the replicas add API capacity, not
scheduler work. `--keyed` sends an `Idempotency-Key` with every submission, as `corral submit`
does (server/idempotency.py).
"""

from __future__ import annotations

import http.client
from pathlib import Path
from typing import Any

from tests.server.harness import Server


def start_replicas(url: str, tmp: Path, cluster: Path, count: int) -> list[Server]:
    """`count` started replicas on `url`: the first with the scheduler and the cluster file."""
    if count > 1 and url.startswith("sqlite"):
        raise SystemExit("--replicas N > 1 needs PostgreSQL: pass --database-url postgresql+psycopg://...")
    first = Server(url, tmp / "data", cluster)
    first.start()
    servers = [first]
    for i in range(1, count):
        other = Server(url, tmp / f"data{i + 1}", None, extra=["--no-scheduler"])
        other.start()
        other._token = first.admin_token
        servers.append(other)
    return servers


def cycle_histogram(server: Server) -> tuple[float, float]:
    """(sum of seconds, count) of the scheduler's cycles so far, from a replica's `/metrics`."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", "/metrics", None, {"Authorization": f"Bearer {server.admin_token}"})
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("corral_scheduling_cycle_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("corral_scheduling_cycle_seconds_count"):
            count = float(line.split()[-1])
    return total, count


def cycle_figures(before: tuple[float, float], after: tuple[float, float]) -> dict[str, Any]:
    cycles = after[1] - before[1]
    mean = 1000 * (after[0] - before[0]) / cycles if cycles else float("nan")
    return {"cycle_mean_ms": mean, "cycles": int(cycles)}
