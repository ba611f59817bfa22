"""Fixtures for the simulator's trace tests: the shared public traces, skipped when absent."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.sim.loaders import TRACES_DIR_ENV, shared_traces_dir


@pytest.fixture(scope="session")
def traces() -> Path:
    """The shared traces folder; tests that need it are skipped (with the reason) when it is missing."""
    folder = shared_traces_dir()
    if not (folder / "README.md").is_file():
        pytest.skip(
            f"shared traces not found at {folder} (set {TRACES_DIR_ENV} to the folder of ../shared/traces)"
        )
    return folder
