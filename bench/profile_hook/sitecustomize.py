"""Profiling of the scheduler process for `server_bench.py --only backlog --profile OUT`.

With this folder on PYTHONPATH and `CORRAL_BENCH_PROFILE` set, the scheduler process
(`python -m corral.server.scheduler_main`) profiles its main thread with cProfile from SIGUSR1 to
SIGUSR2, then writes the stats to that file. Any other process is left alone.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

if os.environ.get("CORRAL_BENCH_PROFILE") and "corral.server.scheduler_main" in getattr(sys, "orig_argv", ()):
    import cProfile

    _profile = cProfile.Profile()

    def _start(*_: Any) -> None:
        _profile.enable()

    def _stop(*_: Any) -> None:
        _profile.disable()
        _profile.dump_stats(os.environ["CORRAL_BENCH_PROFILE"])

    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
