"""The dependency rule (DESIGN.md 1) is checked, not hoped for: import-linter's contracts hold."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    proc = subprocess.run(
        [exe, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "broken" in proc.stdout and "0 broken" in proc.stdout


def test_core_reads_no_clock_and_does_no_io() -> None:
    forbidden = ("import time", "from time", "datetime.now", "import logging", "open(", "print(", "random.")
    for path in (ROOT / "src" / "corral" / "core").glob("*.py"):
        text = path.read_text()
        for word in forbidden:
            assert word not in text, (
                f"{path.name} uses {word!r}: the core takes time and randomness as parameters"
            )
