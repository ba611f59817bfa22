"""`corral acct`: accounting rows, one per job and attempt (like Slurm's `sacct`), as a table,
JSON (the API's rows) or CSV; filtered by user, queue, state and time, paged by a cursor."""

from __future__ import annotations

import csv
import sys
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from corral.cli.remote import JsonOpt, ServerOpt, TokenOpt, connect, fail, print_json, print_table, when
from corral.cli.root import app

# the API's row fields (server/api_acct.py FIELDS), in order, with what each column says
FIELDS = {
    "id": "job id",
    "attempt": "attempt number (empty: the job never started)",
    "name": "job name",
    "user": "who submitted it",
    "team": "the submitter's team",
    "queue": "queue",
    "state": "the attempt's state, or how it ended (the job's state when it never started)",
    "job_state": "the job's state now",
    "submit": "when the job was submitted",
    "start": "when the attempt started",
    "end": "when the attempt ended (the job, when it never started)",
    "elapsed": "run time of the attempt (so far, while it runs)",
    "wait": "wait before the attempt: since submission, or since the previous attempt ended",
    "gpus": "GPUs of the attempt (asked for, when it never started)",
    "gpu_hours": "GPUs x elapsed, in hours",
    "exit_code": "exit code (of the failing rank, when one failed)",
    "reason": "why the attempt ended, or why the job waits or was refused",
    "nodes": "nodes of the attempt",
}
DEFAULT_TABLE = "id,attempt,name,user,queue,state,start,elapsed,wait,gpus,gpu_hours,exit_code,nodes"
TIMES = ("submit", "start", "end")
DURATIONS = ("elapsed", "wait")
PAGE = 100


def parse_fields(text: str) -> list[str]:
    """`--format` as field names; an unknown one fails listing the valid ones."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in FIELDS]
    if unknown or not names:
        fail(
            f"--format: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"
            if unknown
            else "--format: no field given",
            f"use some of: {','.join(FIELDS)}",
        )
    return names


def parse_time(text: str, flag: str, now: float) -> float:
    """`7d` (that long ago), `now`, or an ISO date or time (local unless it gives a zone)."""
    from corral.config.durations import parse_duration
    from corral.config.invalid import InvalidValue

    if text.strip().lower() == "now":
        return now
    try:
        return now - parse_duration(text)
    except InvalidValue:
        pass
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        fail(
            f"{flag} {text!r} is neither a duration nor a date",
            "write e.g. 7d, 12h, 2026-12-01 or 2026-12-01T08:00",
        )


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    total = round(seconds)
    days, rest = divmod(total, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock  # Slurm's elapsed form


def _iso(t: float | None) -> str:
    return "" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cell(row: dict[str, Any], name: str, for_csv: bool) -> Any:
    value = row.get(name)
    if name == "nodes":
        return ",".join(value or [])
    if value is None:
        return ""
    if name in TIMES:
        return _iso(value) if for_csv else when(value)
    if name in DURATIONS:
        return round(value, 3) if for_csv else _duration(value)
    if name == "gpu_hours":
        return round(value, 4) if for_csv else f"{value:.2f}"
    return value


@app.command(rich_help_panel="Jobs")
def acct(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option(help="only this user's jobs")] = None,
    queue: Annotated[str | None, typer.Option(help="only this queue")] = None,
    state: Annotated[
        list[str] | None,
        typer.Option(
            help="only rows in this state (repeat, or a comma list), e.g. failed", show_default=False
        ),
    ] = None,
    since: Annotated[str | None, typer.Option(help="rows active since: 7d (ago), or a date/time")] = None,
    until: Annotated[
        str | None, typer.Option(help="rows active before: a duration ago, or a date/time")
    ] = None,
    fmt: Annotated[
        str | None, typer.Option("--format", "-o", help="comma-separated fields (--help-format lists them)")
    ] = None,
    help_format: Annotated[bool, typer.Option("--help-format", help="list the fields and exit")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV with a header line (times in UTC)")] = False,
    limit: Annotated[int, typer.Option(min=1, max=5000, help="rows per page")] = PAGE,
    page: Annotated[
        str | None, typer.Option(help="start after this cursor (a previous page's `next`)")
    ] = None,
    all_pages: Annotated[bool, typer.Option("--all", "-a", help="every page, not only the first")] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Accounting, like `sacct`: one row per job and attempt, from the control plane's database.

    Members see their team's jobs; admins every job. One page at a time (`--limit`): the
    cursor of the next one is printed (`--page CURSOR`), or use `--all`.
    """
    if help_format:
        for name, text in FIELDS.items():
            typer.echo(f"{name:10} {text}")
        return
    if as_json and as_csv:
        fail("--json and --csv together", "choose one")
    names = parse_fields(fmt) if fmt is not None else None
    now = time.time()
    filters: dict[str, Any] = {
        "user": user,
        "queue": queue,
        "state": [s.strip() for item in state or [] for s in item.split(",") if s.strip()],
        "since": parse_time(since, "--since", now) if since else None,
        "until": parse_time(until, "--until", now) if until else None,
    }
    rows: list[dict[str, Any]] = []
    cursor = page or "0.0"
    with connect(ctx, server, token) as corral:
        while True:
            out = corral.acct(after=cursor, limit=limit, **filters)
            rows.extend(out["rows"])
            cursor = out["next"]
            if cursor is None or not all_pages:
                break
    _print(rows, names, cursor, as_json, as_csv)


def _print(
    rows: list[dict[str, Any]], names: list[str] | None, cursor: str | None, as_json: bool, as_csv: bool
) -> None:
    if as_json:
        shown = rows if names is None else [{k: r.get(k) for k in names} for r in rows]
        print_json({"rows": shown, "next": cursor})
        return
    if as_csv:
        columns = names or list(FIELDS)
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([cell(r, c, True) for c in columns] for r in rows)
    else:
        columns = names or DEFAULT_TABLE.split(",")
        print_table(
            [c.upper() for c in columns],
            [[cell(r, c, False) for c in columns] for r in rows],
            empty="no rows (widen the filters, e.g. --since 30d)",
        )
    if cursor is not None:
        typer.echo(f"more rows: add --page {cursor} (or --all)", err=True)
