"""The commands users run against a server: `submit` (`submit_cmd.py`), `jobs` and `show`
(`jobs_cmds.py`), then, here, `cancel`, `hold`, `release`, `requeue`, `events` and `usage`
(DESIGN.md 4.9). Tables for people, `--json` for programs. The two modules above are imported
first: their commands come first in `corral --help`."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from corral.cli import submit_cmd  # noqa: F401  (registered before the commands below)
from corral.cli.jobs_cmds import event_detail, is_held
from corral.cli.remote import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    connect,
    fail,
    print_json,
    print_json_line,
    print_table,
    report,
    when,
)
from corral.cli.root import app

PANEL = "Jobs"

# ---- cancel, hold, release, requeue ------------------------------------------------------------
JobIds = Annotated[list[str], typer.Argument(metavar="JOB...", help="job ids")]


def _act(
    ctx: typer.Context, action: str, job_ids: list[str], server: str | None, token: str | None, as_json: bool
) -> None:
    """Apply `action` to each job; every refusal is printed; exits with the first refusal's code."""
    from corral.client import ClientError

    code = 0
    with connect(ctx, server, token) as corral:
        for job_id in job_ids:
            try:
                job = getattr(corral, action)(job_id)
            except ClientError as err:
                if err.is_unreachable:
                    raise
                code = code or report(err)
                continue
            if as_json:
                print_json_line(job)
            elif job.get("array"):
                from corral.cli.array_view import counts_text

                typer.echo(f"{job['id']}: array of {job['tasks']} tasks: {counts_text(job['states'])}")
            else:
                held = " (held)" if is_held(job) else ""
                note = "; it checkpoints, then stops" if job["state"] == "stopping" else ""
                typer.echo(f"{job['id']}: {job['state']}{held}{note}")
    raise typer.Exit(code)


ACTIONS = (
    (
        "cancel",
        "Cancel jobs: a pending one at once; a running one is told to checkpoint, then stopped.\n\n"
        "With --json: each job object on its own line.",
    ),
    ("hold", "Keep pending jobs from starting until released."),
    ("release", "Let held jobs start again."),
    ("requeue", "Stop running jobs (checkpoint signal, then a kill) and put them back in their queue."),
)


def _action_command(action: str, help_text: str) -> None:
    """`corral cancel|hold|release|requeue JOB...`: one command per job action, all alike."""

    def command(
        ctx: typer.Context,
        job_ids: JobIds,
        server: ServerOpt = None,
        token: TokenOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        _act(ctx, action, job_ids, server, token, as_json)

    command.__doc__ = help_text
    app.command(name=action, rich_help_panel=PANEL)(command)


for _action, _help in ACTIONS:
    _action_command(_action, _help)


# ---- events and usage --------------------------------------------------------------------------
@app.command(rich_help_panel=PANEL)
def events(
    ctx: typer.Context,
    follow: Annotated[
        bool, typer.Option("--follow", "-F", help="keep printing new events until Ctrl-C")
    ] = False,
    after: Annotated[int, typer.Option(help="only events with a larger seq", min=0)] = 0,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="JSON Lines, exactly as the API returns them")
    ] = False,
) -> None:
    """The event log (DESIGN.md 4.6): submissions, starts, preemptions and endings, in order."""
    from corral.client.http import PAGE

    with connect(ctx, server, token) as corral:
        try:
            while True:
                batch = corral.events(after=after, wait=30.0 if follow else 0.0)
                for e in batch:
                    if as_json:
                        print_json_line(e)
                    else:
                        typer.echo(
                            f"{e['seq']:>6}  {when(e.get('t'))}  {e['event']:<10} {e.get('job', '')} "
                            f"{event_detail(e)}".rstrip()
                        )
                if batch:
                    after = batch[-1]["seq"]
                elif not follow:
                    return
                if not follow and len(batch) < PAGE:
                    return
        except KeyboardInterrupt:
            return


@app.command(rich_help_panel=PANEL)
def usage(
    ctx: typer.Context,
    since: Annotated[str | None, typer.Option(help="only the last period, e.g. 7d or 24h")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """GPU-hours per queue and user (yours: your team's), from the attempts the event log records."""
    start = 0.0
    if since is not None:
        from corral.config.durations import parse_duration

        try:
            start = time.time() - parse_duration(since)
        except ValueError as exc:
            fail(f"--since {since!r}: {exc}")
    with connect(ctx, server, token) as corral:
        rows = corral.usage(since=start)
    if as_json:
        print_json({"usage": rows})
        return
    print_table(
        ("QUEUE", "USER", "GPU-HOURS"),
        [(r["queue"], r["user"], f"{r['gpu_hours']:.2f}") for r in rows],
        empty="no GPU time used",
    )
