"""`corral jobs` and `corral show` (DESIGN.md 4.9), and how a job reads in a line: its gang, the
reason it waits, one event of its history."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from corral.cli.remote import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    age,
    connect,
    placement_text,
    print_fields,
    print_json,
    print_table,
    seconds_text,
    when,
)
from corral.cli.root import app
from corral.cli.submit_cmd import gang_text  # and `submit` registered before the commands here

PANEL = "Jobs"


@app.command(rich_help_panel=PANEL)
def jobs(
    ctx: typer.Context,
    state: Annotated[
        list[str] | None,
        typer.Option(
            help="pending, starting, running, stopping, finished, failed, cancelled, rejected, "
            "or active; repeat",
            show_default=False,
        ),
    ] = None,
    queue: Annotated[str | None, typer.Option(help="only this queue")] = None,
    user: Annotated[str | None, typer.Option(help="only this user's jobs")] = None,
    all_states: Annotated[bool, typer.Option("--all", "-a", help="every state, finished ones too")] = False,
    expand: Annotated[
        bool, typer.Option("--expand", "-r", help="one line per array task (else one per array)")
    ] = False,
    array: Annotated[str | None, typer.Option(help="only this job array's tasks")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List jobs you may see (default: active ones: pending, starting, running, stopping).

    A job array is one line, its tasks counted by state; `--expand` lists every task."""
    from corral.cli.array_view import array_row, group

    states = state or (None if all_states else ["active"])
    with connect(ctx, server, token) as corral:
        found = list(corral.iter_jobs(state=states, queue=queue, user=user, array=array))
    if as_json:
        print_json({"jobs": found})
        return
    now = time.time()
    rows = [
        _with_left(array_row(j, _shape(j[0]), age(j[0]["submit_time"], now)), array_left(j, now))
        if isinstance(j, list)
        else (
            j["id"],
            j["name"],
            j["state"] + (" (held)" if is_held(j) else ""),
            j["queue"],
            j["user"],
            _shape(j),
            age(j["submit_time"], now),
            left_text(j, now),
            placement_text(j["placement"]) if j["placement"] else why_text(j),
        )
        for j in (found if expand else group(found))
    ]
    print_table(
        ("ID", "NAME", "STATE", "QUEUE", "USER", "GPUS", "AGE", "EST. LEFT", "PLACEMENT OR REASON"),
        rows,
        empty="no jobs" + ("" if all_states or state else " active (all of them: corral jobs --all)"),
    )


def _with_left(row: tuple[str, ...], left: str) -> tuple[str, ...]:
    return (*row[:-1], left, row[-1])


ESTIMATED_STATES = ("pending", "starting", "running")  # server/estimated.py ESTIMATED


def left_text(job: dict[str, Any], now: float) -> str:
    """The `EST. LEFT` column: the run time history expects a job still to need, `~1h30m` (a
    running job's, to its estimated end; a pending job's, its whole run), like squeue's TIME_LEFT
    but estimated (server/estimated.py), never a limit; empty without an estimate."""
    left = left_seconds(job, now)
    return "" if left is None else "~" + span(left)


def left_seconds(job: dict[str, Any], now: float) -> float | None:
    """What `left_text` shows, in seconds (None: no estimate)."""
    seconds = job.get("estimate")
    if seconds is None:
        return None
    end = job.get("estimated_end")
    return float(max(0.0, end - now) if end is not None else seconds)


def array_left(tasks: list[dict[str, Any]], now: float) -> str:
    """An array's `EST. LEFT` (`corral jobs` without --expand): the longest of its listed tasks'
    (a running task's to its estimated end, a pending task's whole run), not the array's total."""
    lefts = [
        left for t in tasks if t["state"] in ESTIMATED_STATES and (left := left_seconds(t, now)) is not None
    ]
    return "~" + span(max(lefts)) if lefts else ""


def span(seconds: float) -> str:
    """A duration as `45s`, `12m`, `2h5m`, `3d`."""
    return age(0.0, seconds)


def estimate_text(job: dict[str, Any], now: float) -> str:
    """`corral show`'s estimate line: how long the job should run in all, or when it should end,
    and the finished jobs it is estimated from; empty without an estimate."""
    seconds = job.get("estimate")
    if seconds is None:
        return ""
    from corral.core.reasons import plural, relative

    drawn_on, basis = int(job.get("estimate_drawn_on") or 0), str(job.get("estimate_basis") or "")
    source = f"from {plural(drawn_on, 'finished job')} of {basis}" if drawn_on else basis
    end = job.get("estimated_end")
    if end is not None:
        return f"ends about {when(end)} ({relative(end, now)}): {span(seconds)} in all, {source}; not a limit"
    return f"runs about {span(seconds)} ({source}); not a limit"


def reserved_text(job: dict[str, Any], now: float) -> str:
    """`corral show`'s line for a pending job the scheduler reserved GPUs for: when it starts."""
    at = job.get("reserved_start")
    if at is None:
        return ""
    from corral.core.reasons import relative

    return f"to start at {when(at)} ({relative(at, now)})"


def is_held(job: dict[str, Any]) -> bool:
    return bool(job.get("held")) and job["state"] == "pending"


def why_text(job: dict[str, Any]) -> str:
    """The reason a job waits or ended badly (a time it names followed by how far it is from now,
    e.g. "at 10:45:00 UTC (in 3m)"); a finished or cancelled job's last reason is stale."""
    if job["state"] not in ("pending", "rejected", "failed"):
        return ""
    from corral.core.reasons import with_relative

    return with_relative(str(job.get("reason") or ""), job.get("reason_at"), time.time())


def _shape(job: dict[str, Any]) -> str:
    if job["replicas"] == 1:
        return str(job["gpus_per_replica"])
    return f"{job['replicas']}x{job['gpus_per_replica']}"


@app.command(rich_help_panel=PANEL)
def show(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="the job's id")],
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One job: its state, placement, the reason it waits, and the history of events and reasons.

    With --json: the job object, as `GET /v1/jobs/{id}` returns it."""
    from corral.cli.array_view import show_fields

    with connect(ctx, server, token) as corral:
        job = corral.job(job_id)
        history = None if as_json or job.get("array") else corral.job_events(job_id)
    if job.get("array") and not as_json:  # a job array as a whole
        now = time.time()
        each = estimate_text(dict(job, estimated_end=None), now).replace(
            "runs about", "each task runs about", 1
        )
        end = job.get("estimated_end")
        print_fields(
            [
                *show_fields(job),
                ("estimate", each or None),
                (
                    "running tasks end",
                    f"about {when(end)} (the last, estimated)" if end is not None else None,
                ),
            ]
        )
        return
    if as_json or history is None:
        print_json(job)
        return
    state = job["state"] + (" (held: `corral release` it)" if is_held(job) else "")
    now = time.time()
    print_fields(
        [
            ("job", f"{job['id']}  {job['name']}".strip()),
            ("state", state),
            ("reason", why_text(job)),
            ("reserved", reserved_text(job, now)),
            ("estimate", estimate_text(job, now)),
            ("queue", job["queue"]),
            ("user", job["user"]),
            ("priority", job["priority_class"]),
            ("gpus", f"{job['replicas']} x {job['gpus_per_replica']} ({job['launch']})"),
            ("gpu model", " or ".join(job["gpu_model"])),
            ("time limit", seconds_text(job["time_limit"])),
            ("preemptible", "yes" if job["preemptible"] else "no"),
            ("attempt", job["attempt"] or None),
            ("restarts", f"{job['restarts']} of {job['max_restarts']}"),
            ("placement", placement_text(job["placement"])),
            ("submitted", when(job["submit_time"])),
            *_attempt_times(job),
            ("command", " ".join(job["command"])),
        ]
    )
    lines = _history(history)
    if lines:
        typer.echo("history:")
        for t, what, detail in lines:
            typer.echo(f"  {when(t)}  {what:<10} {detail}".rstrip())
    failed = [e for e in history.get("events", []) if e.get("log_tail")]
    if failed:  # why the last failing rank died, without a trip to `corral logs`
        last = failed[-1]
        typer.echo(f"last lines of rank {last.get('rank')}'s log (attempt {last.get('attempt')}):")
        for line in str(last["log_tail"]).splitlines():
            typer.echo(f"  | {line}")


def _attempt_times(job: dict[str, Any]) -> list[tuple[str, Any]]:
    """Start, end and exit code; a pending job's are its previous attempt's, and say so."""
    if job["state"] != "pending" or not job["attempt"]:
        return [
            ("started", when(job["start_time"])),
            ("ended", when(job["end_time"])),
            ("exit code", job["exit_code"]),
        ]
    parts = [f"started {when(job['start_time'])}" if job["start_time"] else ""]
    parts += [f"ended {when(job['end_time'])}" if job["end_time"] else ""]
    parts += [f"exit code {job['exit_code']}" if job["exit_code"] is not None else ""]
    return [(f"attempt {job['attempt']}", ", ".join(p for p in parts if p) or None)]


def _history(history: dict[str, Any]) -> list[tuple[float, str, str]]:
    """The job's events and the reasons it waited, merged in time order."""
    lines = [(float(e.get("t", 0.0)), e["event"], event_detail(e)) for e in history.get("events", [])]
    lines += [
        (float(r["t"]), "waiting", f"{r['message']} [{r['code']}]" if r.get("code") else r["message"])
        for r in history.get("reasons", [])
    ]
    return sorted(lines, key=lambda line: line[0])


def event_detail(e: dict[str, Any]) -> str:
    """The readable part of one event (DESIGN.md 4.6) after its kind and job."""
    kind = e.get("event")
    if kind == "cluster":
        nodes = e.get("nodes", [])
        return f"{len(nodes)} nodes, {sum(n.get('gpus', 0) for n in nodes)} GPUs"
    if kind == "submit":
        return f"queue {e.get('queue')}, {gang_text(e)}, {e.get('priority_class')}"
    parts = [f"attempt {e['attempt']}"] if e.get("attempt") else []
    if kind == "start":
        parts.append("on " + placement_text(e.get("placement", [])))
    if e.get("by"):
        parts.append(f"by {e['by']}")
    if e.get("reason"):
        parts.append(str(e["reason"]))
    if e.get("exit_code") is not None:
        parts.append(
            f"exit code {e['exit_code']}" + (f" (rank {e['rank']})" if e.get("rank") is not None else "")
        )
    return ", ".join(parts)
