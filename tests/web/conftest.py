"""Fixtures for the dashboard's browser tests: Debian's Chromium driven by Playwright against a
real `corral server` (the cluster of tests/web/cluster.yaml, its nodes served by fake agents that
report their workers running), and a folder for the screenshots each test keeps.

Chromium comes from Debian (`scripts/browser.sh`, which CI runs); Playwright never downloads a
browser. The tests skip, saying why, only when Chromium is absent and cannot be installed.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import ROOT, Server
from tests.web.fleet import Fleet

CHROMIUM = Path("/usr/bin/chromium")
CORRAL = [sys.executable, "-c", "from corral.cli.main import main; main()"]
CLUSTER = Path(__file__).with_name("cluster.yaml")
AGENTS = {name: 8 for name in ("dgx01", "dgx02", "dgx03", "dgx04", "dgx05", "dgx07", "dgx08")}  # dgx06: none
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
VIEWPORT = {"width": 1440, "height": 900}


def _chromium() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    script = ROOT / "scripts" / "browser.sh"
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not CHROMIUM.exists():
        pytest.skip(
            f"Chromium is not installed and `bash scripts/browser.sh` could not install it: "
            f"{(proc.stdout + proc.stderr)[-400:]}"
        )
    return CHROMIUM


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: run `bash scripts/setup.sh` (it is in the dev extra)")
    executable = _chromium()
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(executable), args=LAUNCH_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: $CORRAL_TEST_ARTEFACTS, else a temporary folder."""
    folder = Path(os.environ.get("CORRAL_TEST_ARTEFACTS") or tmp_path_factory.mktemp("web-artefacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A `corral server` on the tests' cluster (cluster.yaml) with every node but dgx06 up, and
    a simulation report in its reports folder, written by `corral simulate --report` (running
    meanwhile: `report()` waits for it). Shared by the tests here: each makes its own jobs."""
    base = tmp_path_factory.mktemp("web")
    reports = base / "reports"
    simulate = _simulate(base, reports / "policies")
    server = Server(
        f"sqlite:///{base / 'corral.db'}",
        base / "data",
        CLUSTER,
        extra=["--reports-dir", str(reports)],
    )
    server.start()
    fleet = Fleet(server, AGENTS)
    fleet.simulation = simulate  # the report test waits for it; the others need not
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()
        server.stop()
        if simulate.returncode is None:
            simulate.kill()
            simulate.communicate()


def report(fleet: Fleet) -> None:
    """Wait for the fixture's `corral simulate --report`."""
    assert fleet.simulation is not None
    if fleet.simulation.returncode is None:
        fleet.simulation_output, _ = fleet.simulation.communicate(timeout=120)
    assert fleet.simulation.returncode == 0, fleet.simulation_output


def _simulate(base: Path, report: Path) -> subprocess.Popen[str]:
    """`corral simulate` of 40 jobs on the tests' cluster under two policies, with its HTML report."""
    rows = ["job_id,submit_time,duration,gpus,queue"]
    for i in range(40):
        gpus, duration = (1, 2, 4, 8, 16)[i * 7 % 5], (600, 1200, 3600, 5400)[i % 4]
        rows.append(f"t{i},{i * 60},{duration},{gpus},{('research', 'prod')[i % 3 == 0]}")
    trace = base / "trace.csv"
    trace.write_text("\n".join(rows) + "\n")
    argv = ["simulate", "--cluster", str(CLUSTER), "--trace", str(trace), "-p", "default", "-p", "fifo"]
    return subprocess.Popen(
        [*CORRAL, *argv, "--report", str(report)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture
def page(browser: Any, fleet: Fleet) -> Iterator[Any]:
    """A fresh browser tab (its own sessionStorage); an uncaught script error fails the test."""
    context = browser.new_context(viewport=VIEWPORT)
    tab = context.new_page()
    tab.set_default_timeout(10_000)
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield tab
    finally:
        context.close()
    assert not errors, f"script errors in the page: {errors}"


def corral(server: Server, token: str, command: str) -> Any:
    """`corral COMMAND --json` (the real command line, in-process) against `server` as `token`."""
    from typer.testing import CliRunner

    from corral.cli.main import app

    env = {"CORRAL_SERVER": server.url, "CORRAL_TOKEN": token, "CORRAL_CONFIG": "/nonexistent/corral.json"}
    words = shlex.split(command)
    at = words.index("--") if "--" in words else len(words)
    result = CliRunner().invoke(app, [*words[:at], "--json", *words[at:]], env=env)
    assert result.exit_code == 0, f"corral {command}: {result.output}"
    return json.loads(result.stdout)


def shot(page: Any, artefacts: Path, name: str) -> Path:
    """A full-page screenshot kept as a test artefact."""
    path = artefacts / f"{name}.png"
    page.locator("#tip").evaluate("el => el.hidden = true")
    page.screenshot(path=str(path), full_page=True)
    return path


def sign_in(page: Any, url: str, token: str) -> None:
    """Open the dashboard and sign in with `token` through the login form."""
    page.goto(url + "/")
    page.fill("#token", token)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#top:not([hidden])")
