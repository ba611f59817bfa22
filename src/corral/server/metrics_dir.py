"""Where the processes of one control plane share their Prometheus metrics.

prometheus-client picks its multiprocess mode when it is first imported (from
`PROMETHEUS_MULTIPROC_DIR`), and metrics without labels get their value store when they are
defined. So the directory must be prepared and named before any module that defines metrics is
imported: `corral server` and `corral up` call `prepare()` first thing, and this module imports
nothing of Corral's. `tests/server/test_metrics_process.py` checks a counter of the API process
reaches `/metrics`.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def prepare(data_dir: Path) -> Path:
    """An empty `metrics` folder in the data directory, named in the environment (the scheduler
    process inherits it). Refuses, with the reason, if prometheus-client was imported already."""
    path = data_dir / "metrics"
    if os.environ.get(VARIABLE) == str(path):
        return path  # prepared already by this process (`corral server` then `serve()`)
    if "prometheus_client" in sys.modules:
        raise RuntimeError(
            "prometheus_client was imported before the metrics directory was set: the API's own "
            "counters would be missing from /metrics (an import order bug: see server/metrics_dir.py)"
        )
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    os.environ[VARIABLE] = str(path)
    return path
