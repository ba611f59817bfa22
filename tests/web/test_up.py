"""`corral up` and the dashboard: the one-time login link it prints signs a browser in; a job
submitted with the CLI shows up and runs on this machine's real node agent without a reload,
and its page shows its placement, events and log."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.server.harness import free_port
from tests.web.conftest import CORRAL, VIEWPORT, shot

LINK = re.compile(r"(http://127\.0\.0\.1:\d+/login#code=[\w-]+)")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A running `corral up` (4 declared GPUs, node `box`): its login link and the CLI's environment."""
    env = dict(os.environ, CORRAL_DATA_DIR=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    env.pop("CORRAL_SERVER", None)
    env.pop("CORRAL_TOKEN", None)
    log_path = tmp_path / "up.log"
    argv = ["up", "--gpus", "4", "--gpu-model", "H100-80GB", "--port", str(free_port()), "--node", "box"]
    if os.geteuid() == 0:  # as root, jobs would run as nobody, who cannot enter pytest's folders
        argv += ["--run-as", "root"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*CORRAL, *argv], env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (found := LINK.search(log_path.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        yield found.group(1), env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_corral_up_prints_a_login_link_and_a_cli_job_runs_live(
    browser: Any, up: tuple[str, dict[str, str]], artefacts: Path
) -> None:
    link, env = up
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(link)
        expect(page.locator("#map")).to_have_attribute("data-rendered", "1")
        expect(page.locator('#map .node[data-node="box"] i.f')).to_have_count(4)
        assert "code=" not in page.url
        page.click('#nav a[data-page="jobs"]')
        page.evaluate("window.__sameDocument = true")
        words = "hello from the dashboard test"
        command = f"import time; print({words!r}, flush=True); time.sleep(60)"
        argv = ["submit", "--json", "--name", "hello-dash", "--gpus", "2", "--", "python", "-c", command]
        submitted = subprocess.run([*CORRAL, *argv], env=env, capture_output=True, text=True, timeout=60)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        job = json.loads(submitted.stdout)["id"]
        row = page.locator(f'tr[data-job="{job}"]')
        expect(row.locator(".badge").first).to_have_text("running")
        shot(page, artefacts, "13-up-jobs")
        row.click()
        expect(page.locator("#placement-map i.hl")).to_have_count(2)
        expect(page.locator(".card:has(h2:text('Events')) tbody")).to_contain_text("start")
        # the real agent serves the log; should it not (yet), the page says so and stays whole
        log = page.locator("#log pre.log, #log .unavailable")
        expect(log).to_be_visible()
        if page.locator("#log pre.log").count():
            expect(page.locator("#log pre.log")).to_contain_text(words)
        shot(page, artefacts, "14-up-job")
        assert page.evaluate("window.__sameDocument") is True, "the page was reloaded"
        # cancelled, the job's worker stops now rather than when `corral up` stops
        config = json.loads((Path(env["XDG_CONFIG_HOME"]) / "corral" / "config.json").read_text())
        headers = {"Authorization": f"Bearer {config['token']}"}
        httpx.post(f"{config['server']}/v1/jobs/{job}/cancel", headers=headers).raise_for_status()
        expect(page.locator("#job-state")).to_contain_text("cancelled")
    finally:
        context.close()
    assert not errors, errors
