"""What the agent leaves on disk about each attempt, so that its fence and its next incarnation
can find the workers: `DATA_DIR/run/<job>/attempt-<n>/attempt.json` (the order, each rank's shim
pid and start time, the cgroup), `rank-<r>.exit` written by the shims, `ended` once reported.

Also the lease (`DATA_DIR/lease.json`): "valid until monotonic time T", written after each
heartbeat the server accepted; the fence (`corral.agent.fence`) kills every live attempt when T
passes (DESIGN.md 6.1). CLOCK_MONOTONIC is one clock for every process of the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from corral.agent.files import write_file

RECORD = "attempt.json"
ENDED = "ended"
LEASE = "lease.json"


def write_json(path: Path, body: dict[str, Any]) -> None:
    """Replace `path` with `body`, readable by the agent's user only (an order holds the job's env)."""
    write_file(path, json.dumps(body).encode())


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a pid from its reuse)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has ended
        return None
    return int(fields[19])


def alive(pid: int, started: int | None) -> bool:
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def write_record(
    run_dir: Path, order: dict[str, Any], ranks: list[dict[str, Any]], cgroup: str | None, launched: float
) -> None:
    body = {"order": order, "ranks": ranks, "cgroup": cgroup, "launched": launched}
    write_json(run_dir / RECORD, body)


def read_record(run_dir: Path) -> dict[str, Any] | None:
    try:
        body = json.loads((run_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def unended(data_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Attempts launched here whose end was not reported yet."""
    out = []
    for path in sorted((data_dir / "run").glob(f"*/attempt-*/{RECORD}")):
        run_dir = path.parent
        if (run_dir / ENDED).exists():
            continue
        record = read_record(run_dir)
        if record is not None:
            out.append((run_dir, record))
    return out


def cgroup_pids(cgroup: str | None) -> list[int]:
    if not cgroup:
        return []
    try:
        return [int(p) for p in Path(cgroup, "cgroup.procs").read_text().split()]
    except OSError:
        return []


def is_live(record: dict[str, Any]) -> bool:
    if cgroup_pids(record.get("cgroup")):
        return True
    return any(alive(int(r["pid"]), r.get("start")) for r in record.get("ranks", []))


def kill(record: dict[str, Any]) -> None:
    """SIGKILL every process of the attempt: its cgroup, and each rank's process group."""
    cgroup = record.get("cgroup")
    if cgroup:
        with contextlib.suppress(OSError):
            Path(cgroup, "cgroup.kill").write_text("1")
        for pid in cgroup_pids(cgroup):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    for r in record.get("ranks", []):
        if alive(int(r["pid"]), r.get("start")):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(r["pid"]), signal.SIGKILL)


def write_lease(data_dir: Path, until: float) -> None:
    write_json(data_dir / LEASE, {"until": until, "agent": os.getpid(), "written": time.monotonic()})


def lease_until(data_dir: Path) -> float | None:
    try:
        return float(json.loads((data_dir / LEASE).read_text())["until"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
