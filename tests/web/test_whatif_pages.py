"""The dashboard's side of the what-if (docs/whatif.md), in real Chromium: the revisions page
shows the evidence a change was decided on, with a link to its report; the reports page lists
what-if reports as such, and the report opens with its fidelity line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from corral.sim.whatif import proposed_body
from corral.sim.whatif_run import what_if
from tests.server.harness import Server
from tests.web.conftest import CLUSTER, VIEWPORT, shot, sign_in

REPORT = "whatif-batch-weight"


def row(i: int, queue: str) -> dict[str, Any]:
    """One finished job of 8 GPUs for 300 s, waiting 50 ms live."""
    return {
        "job_id": f"j{i}", "submit_time": 10.0 * i, "duration": 300.0, "gpus": 8, "queue": queue,
        "replicas": 1, "gpus_per_replica": 8, "priority": "", "gpu_model": "", "time_limit": None,
        "preemptible": True, "checkpoint_interval": None, "user": "u", "observed": "finished",
        "live_wait": 0.05, "attempts": 1, "preemptions": 0,
    }  # fmt: skip


def history(config: dict[str, Any]) -> dict[str, Any]:
    """A small history of the tests' cluster, shaped as `GET /v1/history` answers."""
    now = time.time()
    rows = [row(i, q) for i, q in enumerate(["research", "prod", "batch"] * 8)]
    label = {"spine": "s1", "leaf": "l1"}
    nodes = [{"name": f"dgx0{i}", "gpus": 8, "gpu_model": "H100-80GB", "labels": label} for i in range(1, 9)]
    return {
        "since": now - 86400, "until": now, "counts": {"submitted": 24, "finished": 24, "exported": 24},
        "jobs": rows, "config": config, "nodes": nodes, "topology": [], "revision": 1, "policy": "default",
    }  # fmt: skip


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    """A server of its own (the shared one's revisions and reports are other tests' business)."""
    found = Server(
        f"sqlite:///{tmp_path / 'corral.db'}", tmp_path / "data", CLUSTER,
        extra=["--reports-dir", str(tmp_path / "reports")],
    )  # fmt: skip
    found.start(timeout=120)
    yield found
    found.stop()


@pytest.fixture
def tab(browser: Any) -> Iterator[Any]:
    """A fresh browser tab; an uncaught script error fails the test."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(10_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"script errors in the page: {errors}"


def test_revision_page_shows_its_evidence_and_reports_list_whatifs(
    tab: Any, server: Server, artefacts: Path
) -> None:
    page = tab
    with server.client() as c:
        folder = Path(c.get("/v1/reports").json()["folder"])
        assert folder.parent == server.data_dir.parent
        config = c.get("/v1/config").json()["config"]
        proposal = proposed_body(config, queue_change=("batch", {"weight": 2}))
        result = what_if(history(config), proposal, "queue batch: weight=2", folder / REPORT)
        evidence = {
            "window_days": result["window"]["days"], "jobs": 24, "summary": result["fidelity_text"],
            "report": REPORT,
        }  # fmt: skip
        r = c.put("/v1/queues/batch", json={"weight": 2, "evidence": evidence})
        assert r.status_code == 200, r.text
        revision = r.json()["revision"]
        r = c.put("/v1/queues/batch", json={"weight": 1, "force": True, "reason": "undo for the test"})
        assert r.status_code == 200, r.text

    sign_in(page, server.url, server.admin_token)
    page.click('#nav a[data-page="revisions"]')
    row = page.locator(f'#revisions tr[data-revision="{revision}"]')
    expect(row.locator("td.evidence")).to_have_text("what-if over 1.00 days, 24 jobs")
    expect(page.locator(f'#revisions tr[data-revision="{revision + 1}"] td.evidence')).to_have_text(
        "forced: undo for the test"
    )
    shot(page, artefacts, "30-revisions")
    row.locator("a").first.click()
    expect(page.locator("#evidence .summary")).to_contain_text("fidelity: baseline average wait per queue")
    expect(page.locator("#revision pre")).to_contain_text('"weight": 2')
    shot(page, artefacts, "31-revision")
    page.click("#evidence a.report-link")
    expect(page.locator("#report p.fidelity")).to_contain_text("fidelity: ")
    expect(page.locator("#report h1")).to_have_text("what-if: queue batch: weight=2")
    page.click('#nav a[data-page="reports"]')
    expect(page.locator(f"#reports tr:has(a:text('{REPORT}')) td").nth(1)).to_have_text("what-if")
    shot(page, artefacts, "32-reports")
