"""The `corral` command line: the composition root that wires config, policies and the core.

`root.py` holds the Typer application; each command module registers its commands on it when
imported, in the order below (the order of `corral --help`). Imports of heavy modules stay inside
the commands, so `corral --help` loads nothing heavy.
"""

from __future__ import annotations

import sys

from corral.cli import (  # noqa: F401  (imported for their commands)
    acct_cmd,
    admin_cmds,
    agent_cmd,
    client_cmds,
    dashboard_cmd,
    logs_cmd,
    offline_cmds,
    ops_cmds,
    run_cmd,
    serve,
    up,
    whatif_cmd,
)
from corral.cli.root import app

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover - console entry point
    sys.exit(app())
