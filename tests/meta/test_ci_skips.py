"""Under CI a skip of a test the environment must support fails the run (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).parents[1] / "conftest.py"
TESTS = """
import pytest

def test_needs_namespaces():
    pytest.skip("multi-host tests need network namespaces: ip netns add: Operation not permitted")

@pytest.fixture
def traces():
    pytest.skip("shared traces not found at ../shared/traces")

def test_needs_traces(traces):
    pass

@pytest.mark.skipif(True, reason="shared traces not present")
def test_marked():
    pass

def test_gpu_machine():
    pytest.skip("this machine has NVIDIA GPUs")

def test_runs():
    assert True
"""


def run_inner(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_inner.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "CORRAL_PURE_PYTHON")}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_under_ci_a_skip_of_what_ci_provides_fails_the_run(tmp_path: Path) -> None:
    proc = run_inner(tmp_path, "true")
    assert proc.returncode == 1, proc.stdout
    assert "1 failed, 1 passed, 1 skipped, 2 errors" in proc.stdout, proc.stdout
    assert "CI=true and this test skipped: multi-host tests need network namespaces" in proc.stdout
    assert "SKIPPED" in proc.stdout and "this machine has NVIDIA GPUs" in proc.stdout  # allowed


@pytest.mark.parametrize("ci", [None, "false"])
def test_outside_ci_the_same_skips_stay_skips(tmp_path: Path, ci: str | None) -> None:
    proc = run_inner(tmp_path, ci)
    assert proc.returncode == 0, proc.stdout
    assert "1 passed, 4 skipped" in proc.stdout, proc.stdout
