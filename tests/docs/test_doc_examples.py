"""The documentation's console examples run: each `$ corral ...` line, and its shown output appears."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```console\n(.*?)```", re.S)


def examples() -> list[tuple[str, str, list[str]]]:
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for block in BLOCK.findall(doc.read_text()):
            lines = block.strip().splitlines()
            if lines and lines[0].startswith("$ corral "):
                found.append((doc.name, lines[0][2:], lines[1:]))
    return found


@pytest.mark.parametrize(("doc", "command", "output"), examples(), ids=lambda v: str(v)[:40])
def test_console_example_runs(
    doc: str, command: str, output: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "200")
    result = CliRunner().invoke(app, shlex.split(command)[1:])
    assert result.exit_code in (0, 1), f"{doc}: {command}: {result.output}"
    text = " ".join(result.output.split())
    for line in output:
        for part in re.split(r"\s{2,}", line.strip()):
            assert part in text, f"{doc}: {command}: {part!r} not in output:\n{result.output}"


def test_there_are_console_examples() -> None:
    assert len(examples()) >= 4
