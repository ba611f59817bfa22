"""Diagnostics in the scheduler process for `server_bench.py --only backlog` (bench only).

With this folder on PYTHONPATH, in the scheduler process (`python -m corral.server.scheduler_main`)
and no other:

- `CORRAL_BENCH_PROFILE=FILE` (`--profile FILE`): cProfile of its main thread from SIGUSR1 to
  SIGUSR2, then the stats are written to FILE.
- `CORRAL_BENCH_SKIP_REASONS=1` (`--skip-reasons`): a what-if, not a way to run: the scheduler
  computes and writes no reasons of waiting jobs (`ReasonBook.changes` returns none), to show
  what the reasons cost a step.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

if "corral.server.scheduler_main" in getattr(sys, "orig_argv", ()):
    if os.environ.get("CORRAL_BENCH_PROFILE"):
        import cProfile

        _profile = cProfile.Profile()

        def _start(*_: Any) -> None:
            _profile.enable()

        def _stop(*_: Any) -> None:
            _profile.disable()
            _profile.dump_stats(os.environ["CORRAL_BENCH_PROFILE"])

        signal.signal(signal.SIGUSR1, _start)
        signal.signal(signal.SIGUSR2, _stop)
    if os.environ.get("CORRAL_BENCH_SKIP_REASONS"):
        from corral.server import reasons

        reasons.ReasonBook.changes = lambda self, state, result: []  # type: ignore[method-assign]
