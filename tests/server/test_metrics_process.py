"""Counters of the API process reach `/metrics` (the scheduler's too).

The API and the scheduler share metrics through prometheus-client's multiprocess mode, which is
chosen when prometheus-client is first imported: if any module that defines metrics is imported
before `corral server` names the directory, the API's own counters vanish from `/metrics` while
the scheduler's stay (a bug an import reordering brought once; server/metrics_dir.py)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.server.conftest import LAB
from tests.server.harness import Server, wait_for


def _value(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_the_api_processs_counters_and_the_schedulers_reach_metrics(tmp_path: Path) -> None:
    srv = Server(f"sqlite:///{tmp_path / 'corral.db'}", tmp_path / "data", LAB)
    srv.start()
    try:
        with srv.client() as c:
            for _ in range(3):  # counted by the API process (`corral_submissions_total`)
                r = c.post("/v1/jobs", json={"queue": "research", "command": ["true"], "gpus": 1})
                assert r.status_code == 201, r.text

            def scraped() -> str:
                return str(c.get("/metrics").text)

            wait_for(lambda: _value(scraped(), 'corral_submissions_total{status="201"}') == 3)
            # the scheduler process runs cycles over them (its histogram, from another process)
            wait_for(lambda: _value(scraped(), "corral_scheduling_cycle_seconds_count") >= 1, timeout=30)
    finally:
        srv.stop()


def test_prepare_refuses_once_prometheus_is_imported(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import prometheus_client, pathlib\n"
        "from corral.server import metrics_dir\n"
        f"metrics_dir.prepare(pathlib.Path({str(tmp_path)!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "imported before the metrics directory was set" in done.stderr
