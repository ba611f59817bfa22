"""Shared probes of the control-plane benchmarks (bench/server_bench.py): a process's CPU and
memory from /proc, the scheduler's pid, a fresh database, percentiles, polling."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server.harness import Server, drop_postgres, fresh_postgres  # noqa: E402

LAB = ROOT / "examples" / "lab.yaml"
CLK = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024
SPEC = {"name": "bench", "queue": "research", "gpus_per_replica": 1, "command": ["python", "train.py"]}


# ---- processes ------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def run_queue_wait(pid: int) -> float:
    """Seconds the process's main thread was runnable but waiting for a CPU (Linux schedstat)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def status_mib(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def child_pid(pid: int, timeout: float = 10.0) -> int:
    """The scheduler: the API process's child."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = f.read().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.01)
    raise RuntimeError(f"process {pid} started no scheduler within {timeout} s")


def api_pid(server: Server) -> int:
    assert server.proc is not None
    return server.proc.pid


@contextmanager
def database(admin_url: str | None, tmp: Path) -> Iterator[str]:
    """A fresh database: SQLite under `tmp`, or a new database on the PostgreSQL server."""
    if not admin_url:
        yield f"sqlite:///{tmp / 'corral.db'}"
        return
    url, name = fresh_postgres(admin_url)
    try:
        yield url
    finally:
        drop_postgres(admin_url, name)


def percentile(values: list[float], p: float) -> float:
    """Nearest rank: p99 of 200 samples is the 198th smallest."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, int(-(-p * len(ordered) // 100)))
    return ordered[rank - 1]


def loads_in(log: Path) -> list[float]:
    """The `state loaded in X ms` figures the scheduler has logged so far."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if "state loaded in" in line:
            out.append(float(line.split("state loaded in", 1)[1].split("ms", 1)[0]))
    return out


def wait_until(fn: Callable[[], Any], timeout: float, interval: float = 0.005) -> float:
    """Poll `fn` until truthy; returns the monotonic time it became so."""
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise RuntimeError(f"condition not met within {timeout} s")
        time.sleep(interval)
    return time.monotonic()
