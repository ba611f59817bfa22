"""`python -m corral.server.scheduler_main`: the scheduler as its own process."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from corral.server.replica import main
from corral.store.inuse import hold_database


def _parent_watch() -> None:
    """Exit when the server that started us is gone (its stdin pipe is not used: poll the parent).
    The server passes its pid: a server that died while we were starting is noticed too."""
    parent = int(os.environ.get("CORRAL_SERVER_PID") or os.getppid())
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="corral-scheduler")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--policy", default="default")
    parser.add_argument("--holder", default=None, help="the replica's name in the leader lease")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    threading.Thread(target=_parent_watch, daemon=True).start()
    _lease = hold_database(args.database_url)  # held until the process ends
    try:
        main(args.database_url, args.policy, args.holder)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group of `corral server`/`up`
        sys.exit(0)
