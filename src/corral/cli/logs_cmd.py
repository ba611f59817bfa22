"""`corral logs JOB [--rank N] [--attempt A] [--follow]`: a rank's output, read from its node."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer

from corral.cli.remote import ServerOpt, TokenOpt, connect
from corral.cli.root import app

TERMINAL = {"finished", "failed", "cancelled", "rejected"}
FOLLOW_EVERY = 0.5


@app.command(rich_help_panel="Jobs")
def logs(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="the job's id")],
    rank: Annotated[int, typer.Option("--rank", "-r", min=0, help="the replica (rank) to read")] = 0,
    attempt: Annotated[
        int | None, typer.Option(min=1, help="which attempt (default: the latest)", show_default=False)
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep printing until the job ends (new attempts too)")
    ] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print a rank's log (stdout and stderr together), kept on the node that ran it."""
    out = sys.stdout.buffer
    with connect(ctx, server, token) as corral:
        chunk, size, number = corral.job_log(job_id, rank, attempt, 0)
        offset = len(chunk)
        out.write(chunk)
        out.flush()
        while offset < size:  # a long log comes in chunks
            chunk, size, number = corral.job_log(job_id, rank, number, offset)
            if not chunk:
                break
            offset += len(chunk)
            out.write(chunk)
            out.flush()
        while follow:
            state = corral.job(job_id)
            latest = int(state.get("attempt") or number)
            if attempt is None and latest > number and state["state"] in ("starting", "running"):
                number, offset = latest, 0  # a new attempt: its log starts from the beginning
                out.write(f"--- attempt {number} ---\n".encode())
            chunk, size, number = corral.job_log(job_id, rank, number, offset)
            offset += len(chunk)
            out.write(chunk)
            out.flush()
            if not chunk:
                if state["state"] in TERMINAL:
                    break
                time.sleep(FOLLOW_EVERY)
