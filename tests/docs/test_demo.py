"""`scripts/demo.sh` compares four policies on a trace where they give different numbers (a trace
that fits its cluster without queueing would show four identical columns and demonstrate nothing)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from corral.sim.loaders import TRACES_DIR_ENV, shared_traces_dir

ROOT = Path(__file__).resolve().parents[2]
CORRAL = [sys.executable, "-c", "from corral.cli.main import main; main()"]


def demo_commands() -> tuple[list[str], list[str]]:
    """The demo's `trace convert` and `simulate` command lines (continuations joined)."""
    text = (ROOT / "scripts" / "demo.sh").read_text().replace("\\\n", " ")
    convert = re.search(r"\.venv/bin/corral (trace convert [^;\n]*?)(?: 2>/dev/null)?;", text)
    simulate = re.search(r"\.venv/bin/corral (simulate [^\n]*)", text)
    assert convert and simulate, "demo.sh converts a trace and simulates it"
    return shlex.split(convert.group(1)), shlex.split(simulate.group(1))


def test_the_demo_policies_differ(tmp_path: Path) -> None:
    if not (shared_traces_dir() / "README.md").is_file():
        pytest.skip(f"shared traces not found (set {TRACES_DIR_ENV} to the folder of ../shared/traces)")
    convert, simulate = demo_commands()
    trace = tmp_path / "trace.csv"
    convert = [
        str(trace) if prev in ("-o", "--out") else a for prev, a in zip(["", *convert], convert, strict=False)
    ]
    simulate = [
        str(trace) if prev == "--trace" else a for prev, a in zip(["", *simulate], simulate, strict=False)
    ]
    subprocess.run([*CORRAL, *convert], cwd=ROOT, check=True, capture_output=True)
    out = subprocess.run([*CORRAL, *simulate, "--json"], cwd=ROOT, check=True, capture_output=True, text=True)
    results = json.loads(out.stdout)
    assert sorted(results) == ["default", "fifo", "las", "sjf"]
    mean_jct = {policy: round(r["jct"]["mean"]) for policy, r in results.items()}
    assert len(set(mean_jct.values())) == 4, mean_jct  # four different answers to compare
