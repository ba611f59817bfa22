"""`corral submit` (DESIGN.md 4.9): every job-spec field a flag, a spec file they override, and the
`--gpus N` shorthand checked against the largest node the server knows."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli.remote import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    connect,
    fail,
    print_json,
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
            spec.update(gpus_shorthand_of(corral, gpus))
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


def gang_text(job: dict[str, Any]) -> str:
    """`4 GPUs`, `1 GPU`, or `2 x 8 GPUs` for a gang of several replicas."""
    replicas, per = int(job.get("replicas", 1)), int(job.get("gpus_per_replica", 0))
    unit = "GPU" if replicas * per == 1 else "GPUs"
    return f"{replicas} x {per} {unit}" if replicas > 1 else f"{per} {unit}"


def gpus_shorthand_of(corral: Client, gpus: int) -> dict[str, int]:
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
