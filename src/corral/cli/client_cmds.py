"""The commands users run against a server: `submit`, `jobs`, `show`, `cancel`, `hold`, `release`,
`requeue`, `events` and `usage` (DESIGN.md 4.9). Tables for people, `--json` for programs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli.remote import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    age,
    connect,
    fail,
    placement_text,
    print_fields,
    print_json,
    print_json_line,
    print_table,
    report,
    seconds_text,
    when,
)
from corral.cli.root import app
from corral.cli.submit_spec import SubmitFlags, apply_flags, largest_node_gpus, load_spec_file

PANEL = "Jobs"

if TYPE_CHECKING:
    from corral.client import Client

# ---- submit ------------------------------------------------------------------------------------
Many = Annotated[list[str] | None, typer.Option(show_default=False)]


@app.command(context_settings={"allow_interspersed_args": False}, rich_help_panel=PANEL)
def submit(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None, typer.Argument(help="the job's argv, after `--` (never run by a shell)")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="a job spec (YAML) that the flags override")
    ] = None,
    name: Annotated[str | None, typer.Option(help="the job's name")] = None,
    queue: Annotated[str | None, typer.Option(help="queue (default: your team's first)")] = None,
    priority: Annotated[str | None, typer.Option(help="priority class, e.g. normal or high")] = None,
    replicas: Annotated[int | None, typer.Option(help="replicas in the gang (default 1)")] = None,
    gpus_per_replica: Annotated[int | None, typer.Option(help="GPUs per replica (default 1)")] = None,
    gpus: Annotated[
        int | None, typer.Option(help="shorthand: one replica of N GPUs, when N fits a node")
    ] = None,
    launch: Annotated[str | None, typer.Option(help="per_gpu (default) or per_node")] = None,
    gpu_model: Many = None,
    pack: Annotated[
        str | None, typer.Option(help="pack the gang in: nvlink, node, or a topology level")
    ] = None,
    pack_required: Annotated[
        bool | None, typer.Option("--pack-required/--pack-preferred", help="wait rather than spread wider")
    ] = None,
    time_limit: Annotated[
        str | None, typer.Option(help="per attempt, with units: 90m, 4h, 1-00:00:00")
    ] = None,
    preemptible: Annotated[
        bool | None, typer.Option("--preemptible/--no-preemptible", help="may be preempted (default yes)")
    ] = None,
    checkpoint_signal: Annotated[str | None, typer.Option(help="signal sent before a kill")] = None,
    checkpoint_grace: Annotated[str | None, typer.Option(help="wait after the signal, e.g. 60s")] = None,
    max_restarts: Annotated[int | None, typer.Option(help="restarts after worker failures")] = None,
    cpus_per_replica: Annotated[int | None, typer.Option(help="CPUs per replica")] = None,
    memory_gib_per_replica: Annotated[float | None, typer.Option(help="memory (GiB) per replica")] = None,
    working_dir: Annotated[
        str | None,
        typer.Option(help="absolute folder the workers start in (default: the attempt's run folder)"),
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="K=V; repeat", show_default=False)] = None,
    notify: Annotated[
        str | None,
        typer.Option(
            help="events sent to the queue's webhooks: start,end,fail,preempt,restart", show_default=False
        ),
    ] = None,
    mount: Annotated[
        list[str] | None, typer.Option("--mount", help="SRC:DST[:ro]; repeat", show_default=False)
    ] = None,
    array: Annotated[
        str | None, typer.Option(help="a job array: 0-99, 0-15:4, 1,3,5-7; %N: at most N at once")
    ] = None,
    dependency: Annotated[
        str | None, typer.Option(help="afterok:J[:J...], afterany:J, afternotok:J, after:J, singleton")
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a job: `corral submit --gpus 4 -- python train.py`. Every job-spec field is a flag.

    `--gpu-model` repeats (acceptable models, or a glob such as H100*). `corral submit
    script.sh` sends a batch script, its `#CORRAL` lines read as flags (like `#SBATCH`; the
    command line wins). Prints the job's id; with --json the job object, as `GET /v1/jobs/{id}`
    returns it (an array: the array object).
    """
    from corral.core.errors import ConfigError

    if command and not ctx.meta.get("corral.script"):
        from corral.cli import batch_script

        script = batch_script.find(command[0])
        if script is not None:  # its #CORRAL lines under the command line's flags
            ctx.meta["corral.script"] = True
            try:
                params = batch_script.merged(ctx, script, list(command[1:]))
            except ConfigError as exc:
                fail(str(exc), exc.fix)
            return submit(ctx, **params)

    if gpus is not None and (replicas is not None or gpus_per_replica is not None):
        fail("--gpus is shorthand for --replicas 1 --gpus-per-replica N", "give either --gpus or those two")
    flags = SubmitFlags(
        name=name,
        queue=queue,
        priority=priority,
        replicas=replicas,
        gpus_per_replica=gpus_per_replica,
        launch=launch,
        gpu_model=tuple(gpu_model or ()),
        pack=pack,
        pack_required=pack_required,
        time_limit=time_limit,
        preemptible=preemptible,
        checkpoint_signal=checkpoint_signal,
        checkpoint_grace=checkpoint_grace,
        max_restarts=max_restarts,
        cpus_per_replica=cpus_per_replica,
        memory_gib_per_replica=memory_gib_per_replica,
        working_dir=working_dir,
        notify=notify,
        array=array,
        dependency=dependency,
        env=tuple(env or ()),
        mounts=tuple(mount or ()),
        command=tuple(command or ()),
    )
    try:
        spec = apply_flags(load_spec_file(file) if file is not None else {}, flags)
    except ConfigError as exc:
        fail(str(exc))
    with connect(ctx, server, token) as corral:
        if gpus is not None:
            spec.update(_gpus_shorthand(corral, gpus))
        job = corral.submit(spec)
    if as_json:
        print_json(job)
        return
    if job.get("array"):
        cap = f", at most {job['max_running']} at once" if job.get("max_running") else ""
        typer.echo(
            f"{job['id']}  array of {job['tasks']} tasks ({job['spec']}{cap}) submitted to queue "
            f"{job['queue']} ({gang_text(job)} each): tasks {job['id']}_N"
        )
        return
    after = f"; {job['reason']}" if job.get("reason") else ""
    typer.echo(f"{job['id']}  submitted to queue {job['queue']} ({gang_text(job)}): {job['state']}{after}")


def _gpus_shorthand(corral: Client, gpus: int) -> dict[str, int]:
    """`--gpus N` against the largest node the server knows (an error suggests the split)."""
    from corral.config.job_spec import gpus_shorthand
    from corral.core.errors import ConfigError

    nodes = corral.nodes()
    if not nodes:  # nothing known yet: let the server judge one replica of N
        return {"replicas": 1, "gpus_per_replica": gpus}
    try:
        replicas, per_replica = gpus_shorthand(gpus, largest_node_gpus(nodes))
    except ConfigError as exc:
        fail(f"--gpus {gpus}: {exc.detail}", exc.fix)
    return {"replicas": replicas, "gpus_per_replica": per_replica}


# ---- jobs and show -----------------------------------------------------------------------------
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
        array_row(j, _shape(j[0]), age(j[0]["submit_time"], now))
        if isinstance(j, list)
        else (
            j["id"],
            j["name"],
            j["state"] + (" (held)" if _is_held(j) else ""),
            j["queue"],
            j["user"],
            _shape(j),
            age(j["submit_time"], now),
            placement_text(j["placement"]) if j["placement"] else _why(j),
        )
        for j in (found if expand else group(found))
    ]
    print_table(
        ("ID", "NAME", "STATE", "QUEUE", "USER", "GPUS", "AGE", "PLACEMENT OR REASON"),
        rows,
        empty="no jobs" + ("" if all_states or state else " active (all of them: corral jobs --all)"),
    )


def gang_text(job: dict[str, Any]) -> str:
    """`4 GPUs`, `1 GPU`, or `2 x 8 GPUs` for a gang of several replicas."""
    replicas, per = int(job.get("replicas", 1)), int(job.get("gpus_per_replica", 0))
    unit = "GPU" if replicas * per == 1 else "GPUs"
    return f"{replicas} x {per} {unit}" if replicas > 1 else f"{per} {unit}"


def _is_held(job: dict[str, Any]) -> bool:
    return bool(job.get("held")) and job["state"] == "pending"


def _why(job: dict[str, Any]) -> str:
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
        print_fields(show_fields(job))
        return
    if as_json or history is None:
        print_json(job)
        return
    state = job["state"] + (" (held: `corral release` it)" if _is_held(job) else "")
    print_fields(
        [
            ("job", f"{job['id']}  {job['name']}".strip()),
            ("state", state),
            ("reason", _why(job)),
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
                held = " (held)" if _is_held(job) else ""
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
