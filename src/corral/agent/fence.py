"""`python -m corral.agent.fence DATA_DIR`: kills a node's workers when its lease runs out.

DESIGN.md 6.1: the lease is enforced by something that outlives the agent. The agent starts this
process in a session of its own and writes the lease after each heartbeat the server accepted;
when the lease passes (20 s without a heartbeat: the agent is dead, hung, or cut off from the
control plane, which declares the node lost after 30 s and runs the work elsewhere), the fence
kills every attempt launched here. One fence per data directory (an exclusive lock); it exits
once no attempt has lived for a while, and the agent starts it again with the next attempt.
Standard library only: it must start fast and keep working when everything else is gone.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

from corral.agent.records import ENDED, is_live, kill, lease_until, unended

TICK = 0.5
IDLE_EXIT = 10.0
LOCK = "fence.lock"


def log(data_dir: Path, message: str) -> None:
    with open(data_dir / "fence.log", "a") as out:
        out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} corral fence: {message}\n")


def run(data_dir: Path) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = open(data_dir / LOCK, "a")  # noqa: SIM115  (held for the life of the process)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another fence guards this directory
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    log(data_dir, f"guarding {data_dir} (pid {os.getpid()})")
    idle_since = time.monotonic()
    while True:
        now = time.monotonic()
        live = [(run_dir, record) for run_dir, record in unended(data_dir) if is_live(record)]
        if live:
            idle_since = now
            until = lease_until(data_dir)
            if until is None or now > until:
                for run_dir, record in live:
                    kill(record)
                    late = now - until if until is not None else 0.0
                    (run_dir / "fenced").write_text(f"the node's lease expired {late:.0f} s ago\n")
                    log(data_dir, f"lease expired: killed {run_dir.parent.name} {run_dir.name}")
        elif now - idle_since > IDLE_EXIT:
            log(data_dir, "no live attempt: exiting")
            return 0
        time.sleep(TICK)


def ensure(data_dir: Path, python: str = sys.executable) -> bool:
    """Start a fence for `data_dir` unless one holds its lock; True when one was started."""
    import subprocess

    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # running
        fcntl.flock(lock, fcntl.LOCK_UN)
    subprocess.Popen(
        [python, "-m", "corral.agent.fence", str(data_dir)],
        start_new_session=True,  # outlives the agent, and a kill of the agent's process group
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )
    return True


__all__ = ["ENDED", "ensure", "run"]

if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))
