"""What `corral trace export`, `corral whatif` and the `--what-if` of configuration changes share:
the window's history from the server, its counts in words, where a report goes, the evidence a
decision records (`whatif_cmd.py` and `whatif_show.py` both use them)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.cli.remote import fail

if TYPE_CHECKING:
    from corral.client import Client


def instant(text: str, now: float, flag: str) -> float:
    """`7d` (that long before now), or a date / date and time (local)."""
    from corral.config.durations import parse_duration
    from corral.core.errors import ConfigError

    try:
        return now - parse_duration(text)
    except (ConfigError, ValueError):
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        fail(f"{flag} {text!r} is neither a duration nor a date", f"e.g. {flag} 7d or {flag} 2026-12-01")


def fetch(corral: Client, since: str, until: str | None) -> dict[str, Any]:
    now = time.time()
    start = instant(since, now, "--since")
    end = None if until is None else instant(until, now, "--until")
    found: dict[str, Any] = corral.history(start, end)
    return found


def when_text(t: float) -> str:
    return datetime.fromtimestamp(float(t)).strftime("%Y-%m-%d %H:%M:%S")


def counts_text(counts: Mapping[str, int]) -> str:
    order = ("finished", "failed", "cancelled", "running", "pending")
    parts = [f"exported {counts.get('exported', 0)} of {counts.get('submitted', 0)} jobs submitted"]
    parts += [f"{k} {counts[k]}" for k in order if counts.get(k)]
    flagged = [f"{v} {k}" for k, v in counts.items() if k.endswith("before starting")]
    text = ", ".join(parts)
    if counts.get("running"):
        text += " (still running: duration = run time so far, flagged `running`)"
    if flagged:
        text += "; left out, never started: " + ", ".join(flagged)
    return text


def report_path(report: Path | None, reports: Mapping[str, Any] | None) -> Path | None:
    """A bare name goes into the server's reports folder (when this machine has it: `corral up`),
    so the dashboard lists it; a path is used as given."""
    if report is None or len(report.parts) > 1 or not reports or not reports.get("folder"):
        return report
    folder = Path(str(reports["folder"]))
    return folder / report.name if folder.is_dir() or not folder.exists() else report


def decision_json(result: Mapping[str, Any]) -> dict[str, Any]:
    from corral.sim.whatif_run import evidence_of

    return {"evidence": json.loads(json.dumps(evidence_of(result), default=float))}
