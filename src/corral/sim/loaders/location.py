"""Where the shared public traces live: `<repo root>/../shared/traces`, or `$CORRAL_TRACES_DIR`."""

from __future__ import annotations

import os
from pathlib import Path

from corral.core.errors import TraceError

TRACES_DIR_ENV = "CORRAL_TRACES_DIR"
_REPO_ROOT = Path(__file__).resolve().parents[4]  # src/corral/sim/loaders/location.py -> repo root


def shared_traces_dir() -> Path:
    """The folder of shared traces (it may not exist: callers that need a file say so)."""
    override = os.environ.get(TRACES_DIR_ENV)
    if override:
        return Path(override)
    return _REPO_ROOT.parent / "shared" / "traces"


def resolve(path_or_name: str | os.PathLike[str], subdir: str, *, suffix: str = "") -> Path:
    """An existing file: `path_or_name` itself, else under `shared_traces_dir()/subdir` (`suffix` added)."""
    given = Path(path_or_name)
    if given.is_file():
        return given
    base = shared_traces_dir() / subdir
    for candidate in (base / given, base / f"{given}{suffix}"):
        if candidate.is_file():
            return candidate
    raise TraceError(
        f"{path_or_name}: no such trace file, here or under {base}"
        f" (fix: give an existing path, or set {TRACES_DIR_ENV} to the folder of shared traces)"
    )
