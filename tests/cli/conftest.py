"""Fixtures for the command line: the real `corral` commands (in-process, through Typer's runner)
against a real `corral server` on SQLite and on PostgreSQL (the server tests' fixtures)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from corral.cli.main import app
from tests.server.conftest import database_url, server  # noqa: F401  (fixtures)
from tests.server.harness import Server


@dataclass
class Cli:
    """`corral ARGS...` run against one server, with the admin token unless told another."""

    server: Server
    config: Path

    def __call__(self, *args: object, token: str | None = None, input: str | None = None) -> Result:
        env = {
            "CORRAL_SERVER": self.server.url,
            "CORRAL_TOKEN": token or self.server.admin_token,
            "CORRAL_CONFIG": str(self.config),
            "COLUMNS": "200",
        }
        return CliRunner().invoke(app, [str(a) for a in args], env=env, input=input)

    def ok(self, *args: object, token: str | None = None) -> Result:
        result = self(*args, token=token)
        assert result.exit_code == 0, f"corral {' '.join(map(str, args))}: {result.output}"
        return result

    def json(self, *args: object, token: str | None = None) -> Any:
        """`corral ARGS... --json` (put before `--`), its stdout parsed."""
        words = [str(a) for a in args]
        at = words.index("--") if "--" in words else len(words)
        return json.loads(self.ok(*words[:at], "--json", *words[at:], token=token).stdout)


@pytest.fixture
def cli(server: Server, tmp_path: Path) -> Cli:  # noqa: F811
    return Cli(server, tmp_path / "no-config.json")
