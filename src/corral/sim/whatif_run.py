"""One what-if, from an export to its result: validate the proposal, replay the history twice,
compare, and (optionally) write the HTML report with both runs (`corral whatif`, `--what-if`)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.sim.whatif import (
    check_proposed,
    cluster_body,
    cluster_of,
    profile_of,
    replay,
    require_jobs,
    trace_jobs,
)
from corral.sim.whatif_compare import difference, fidelity, figures, headline, start_latency

BASELINE, PROPOSED = "baseline", "proposed"


def what_if(
    export: Mapping[str, Any], proposed: Mapping[str, Any], change: str, report: Path | None = None
) -> dict[str, Any]:
    """Replay `export` (`GET /v1/history`) under its configuration in force and under `proposed`
    (a whole configuration body). Raises ConfigError, before any replay, when the window has no
    finished job or `proposed` is not a valid configuration."""
    rows = export["jobs"]
    require_jobs(rows, export["counts"])
    default_policy = str(export.get("policy") or "default")
    base_body = cluster_body(export)
    prop_body = cluster_body(export, proposed)
    prop_cfg, prop_profile = check_proposed(prop_body, default_policy)
    base_cfg = cluster_of(base_body, f"configuration revision {export.get('revision')}")
    jobs = trace_jobs(rows)
    base = replay(base_cfg, jobs, profile_of(base_body, default_policy), BASELINE)
    prop = replay(prop_cfg, jobs, prop_profile, PROPOSED)
    fid = fidelity(rows, base, start_latency(rows, base))
    base_fig, prop_fig = figures(base), figures(prop)
    window_days = (float(export["until"]) - float(export["since"])) / 86400.0
    result: dict[str, Any] = {
        "window": {"since": export["since"], "until": export["until"], "days": window_days},
        "counts": dict(export["counts"]),
        "revision": export.get("revision"),
        "change": change,
        "fidelity": fid,
        "fidelity_text": headline(fid),
        "baseline": base_fig,
        "proposed": prop_fig,
        "difference": difference(base_fig, prop_fig),
    }
    if report is not None:
        from corral.sim.report import write_report

        runs = {
            f"{BASELINE} (revision {export.get('revision')})": (base.summary(), base.measures.series()),
            f"{PROPOSED}: {change}": (prop.summary(), prop.measures.series()),
        }
        page = write_report(report, runs, title=f"what-if: {change}")
        _add_fidelity(page, str(result["fidelity_text"]))
        result["report"] = report.name
        text = json.dumps(result, indent=2, default=float) + "\n"
        (report / "whatif.json").write_text(text, encoding="utf-8")
    return result


def _add_fidelity(page: Path, text: str) -> None:
    """The fidelity line under the report's heading: how far to trust the difference."""
    html_text = page.read_text(encoding="utf-8")
    at = html_text.find("</h1>")
    if at >= 0:
        line = f'<p class="fidelity"><b>{html.escape(text)}</b></p>'
        page.write_text(html_text[: at + 5] + line + html_text[at + 5 :], encoding="utf-8")


def summary_line(result: Mapping[str, Any]) -> str:
    """One paragraph for the evidence: the fidelity, then overall and per-queue average waits."""
    from corral.sim.whatif import OVERALL

    parts = [str(result["fidelity_text"])]
    for queue, _diff in sorted(result["difference"].items(), key=lambda kv: kv[0] != OVERALL):
        b, p = result["baseline"].get(queue, {}), result["proposed"].get(queue, {})
        if b.get("avg_wait") is None or p.get("avg_wait") is None:
            continue
        parts.append(
            f"{queue}: avg wait {b['avg_wait']:.3g} -> {p['avg_wait']:.3g} s, "
            f"GPU-hours {b['gpu_hours']:.3g} -> {p['gpu_hours']:.3g}"
        )
    return "; ".join(parts)[:3900]


def evidence_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """What `PUT /v1/queues/NAME` and `PUT /v1/policy` keep with the revision (server/evidence.py)."""
    fid = result["fidelity"]
    return {
        "window_days": round(float(result["window"]["days"]), 6),
        "jobs": int(result["counts"].get("exported", 0)),
        "summary": summary_line(result),
        "fidelity": fid.get("worst_error"),
        "report": str(result.get("report") or ""),
        "details": {k: result[k] for k in ("window", "counts", "revision", "change", "fidelity_text")}
        | {
            "overall": {
                "baseline": result["baseline"].get("(all)"),
                "proposed": result["proposed"].get("(all)"),
            }
        },
    }
