"""Every shell example of the README and docs/ runs as written (the convention: docs/examples.md).

Each ```bash or ```sh block is one bash script (`set -euo pipefail`), run from the repository
root with a fresh data directory and CLI config, `corral` being this checkout's; every command
must exit 0. The line before the fence may mark the block:

- `<!-- example: server -->`: run against a fresh `corral server --cluster examples/lab.yaml`
  (SQLite, its admin token in the environment);
- `<!-- example: not run: REASON -->`: not run, for the reason given (no test is made of it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from corral.sim.loaders import TRACES_DIR_ENV, shared_traces_dir
from tests.server.harness import Server

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(
    r"(?:<!--\s*example:\s*(?P<mark>.*?)\s*-->\n)?^```(?:bash|sh)\n(?P<body>.*?)^```", re.S | re.M
)
LAB = ROOT / "examples" / "lab.yaml"


def blocks() -> list[tuple[str, str, str]]:
    """(doc:line, mark, script) of every bash/sh block of the README and docs/."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start("body"))
            found.append((f"{doc.relative_to(ROOT)}:{line}", match["mark"] or "", match["body"]))
    return found


def environment(tmp_path: Path) -> dict[str, str]:
    kept = (TRACES_DIR_ENV, "CORRAL_PURE_PYTHON")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_") or k in kept}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        CORRAL_DATA_DIR=str(tmp_path / "data"),
        CORRAL_CONFIG=str(tmp_path / "config.json"),
        COLUMNS="200",
    )
    return env


def run(script: str, env: dict[str, str], where: str) -> None:
    proc = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, (
        f"{where} exited {proc.returncode}:\n{script}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )


def runnable() -> list[tuple[str, str, str]]:
    """The blocks to run: a block marked `not run: REASON` is not a test (a skip would fail CI,
    tests/conftest.py); `test_every_block_is_run_or_says_why_not` checks that it gives a reason."""
    return [b for b in blocks() if not b[1].startswith("not run:")]


@pytest.mark.parametrize(("where", "mark", "script"), runnable(), ids=[b[0] for b in runnable()])
def test_shell_example_runs(where: str, mark: str, script: str, tmp_path: Path) -> None:
    assert mark in ("", "server"), f"{where}: unknown mark {mark!r} (see docs/examples.md)"
    if "trace convert" in script and not (shared_traces_dir() / "README.md").is_file():
        pytest.skip(f"shared traces not found (set {TRACES_DIR_ENV} to the folder of ../shared/traces)")
    env = environment(tmp_path)
    if mark != "server":
        run(script, env, where)
        return
    server = Server(f"sqlite:///{tmp_path / 'corral.db'}", tmp_path / "server", LAB)
    server.start()
    try:
        run(script, {**env, "CORRAL_SERVER": server.url, "CORRAL_TOKEN": server.admin_token}, where)
    finally:
        server.stop()


def test_every_block_is_run_or_says_why_not() -> None:
    found = blocks()
    assert len(found) >= 15
    assert all(mark in ("", "server") or re.match(r"not run: \S", mark) for _, mark, _ in found)
    assert sum(mark != "" and not mark.startswith("not run") for _, mark, _ in found) >= 3
