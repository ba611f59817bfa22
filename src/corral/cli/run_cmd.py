"""`corral run` (like `srun`), `corral alloc` (like `salloc`) and `corral attach` (a shell in a job).

`run` and `alloc` take every flag of `corral submit` (their signatures are built from its, so the
two never drift apart). `run` submits, waits (saying why the job waits), streams a rank's output
(`corral logs --follow`'s API), turns Ctrl-C into a cancel and exits with the job's exit status.
`alloc` submits a job whose only process holds its GPUs (`agent.terminal.HOLDER`), waits for it
to start, and opens a shell inside it (`cli/terminal_client.py`); exiting the shell ends the
allocation. `attach` opens a shell inside a running job and leaves the job running.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import time
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from corral.cli.remote import ServerOpt, TokenOpt, _inherited, connect, fail, report, say_error
from corral.cli.root import app

if TYPE_CHECKING:
    from corral.client import Client

PANEL = "Jobs"
WAITING = ("pending", "starting")
TERMINAL = ("finished", "failed", "cancelled", "rejected")
EVERY = 0.5  # seconds between looks at the job while waiting or following
F = TypeVar("F", bound=Callable[..., Any])


def with_submit_flags(drop: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Give a command `corral submit`'s flags (but `--json` and `drop`), before its own."""

    def decorate(fn: F) -> F:
        from corral.cli.submit_cmd import submit

        theirs = typing.get_type_hints(submit, include_extras=True)
        mine = typing.get_type_hints(fn, include_extras=True)
        own = [
            p.replace(annotation=mine[p.name])
            for p in inspect.signature(fn).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        taken = {p.name for p in own} | {"as_json", *drop}
        flags = [
            p.replace(annotation=theirs[p.name])
            for p in inspect.signature(submit).parameters.values()
            if p.name not in taken
        ]
        params = [own[0], *flags, *own[1:]]
        fn.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        fn.__annotations__ = {p.name: p.annotation for p in params}
        return fn

    return decorate


def spec_of(corral: Client, flags: dict[str, Any]) -> dict[str, Any]:
    """The job spec `corral submit` would send for these flags."""
    from corral.cli.submit_cmd import gpus_shorthand_of
    from corral.cli.submit_spec import SubmitFlags, apply_flags, load_spec_file
    from corral.core.errors import ConfigError

    gpus = flags.get("gpus")
    if gpus is not None and (flags.get("replicas") is not None or flags.get("gpus_per_replica") is not None):
        fail("--gpus is shorthand for --replicas 1 --gpus-per-replica N", "give either --gpus or those two")
    names = {f.name for f in dataclasses.fields(SubmitFlags)}
    given: dict[str, Any] = {}
    for key, value in flags.items():
        name = "mounts" if key == "mount" else key
        if name in names and value is not None:
            given[name] = tuple(value) if isinstance(value, list) else value
    file = flags.get("file")
    try:
        spec = apply_flags(load_spec_file(file) if file is not None else {}, SubmitFlags(**given))
    except ConfigError as exc:
        fail(str(exc))
    if gpus is not None:
        spec.update(gpus_shorthand_of(corral, gpus))
    return spec


def wait_started(corral: Client, job_id: str) -> dict[str, Any]:
    """Wait while the job is pending or starting, saying (on stderr) why each time it changes."""
    from corral.cli.jobs_cmds import why_text

    said = ""
    while True:
        job = corral.job(job_id)
        if job["state"] not in WAITING:
            return job
        why = f"{job_id}: {job['state']}" + (f": {why_text(job)}" if why_text(job) else "")
        if why != said:
            typer.echo(why, err=True)
            said = why
        time.sleep(EVERY)


class Follow:
    """Each followed rank's log: offset, attempt, and (with prefixes) the unfinished last line."""

    def __init__(self, job_id: str, ranks: list[int], prefix: bool) -> None:
        self.job_id, self.prefix = job_id, prefix
        self.offsets = dict.fromkeys(ranks, 0)
        self.attempts: dict[int, int | None] = dict.fromkeys(ranks)
        self.partial = dict.fromkeys(ranks, b"")

    def pump(self, corral: Client, latest: int = 0) -> bool:
        """Print what is new in each rank's log (a new attempt's from its start); True when anything was."""
        from corral.client import ClientError

        got = False
        for rank, offset in self.offsets.items():
            seen = self.attempts[rank]
            if seen is not None and latest > seen:  # restarted or requeued: follow the new attempt
                self.attempts[rank], offset = latest, 0
                self._write(rank, f"--- attempt {latest} ---\n".encode())
            try:
                chunk, _, number = corral.job_log(self.job_id, rank, self.attempts[rank], offset)
            except ClientError as err:
                if err.status in (404, 503):  # not launched yet, or its node not answering now
                    continue
                raise
            self.attempts[rank] = number
            self.offsets[rank] = offset + len(chunk)
            if chunk:
                got = True
                self._write(rank, chunk)
        return got

    def _write(self, rank: int, chunk: bytes) -> None:
        out = sys.stdout.buffer
        if not self.prefix:
            out.write(chunk)
        else:
            lines = (self.partial[rank] + chunk).split(b"\n")
            self.partial[rank] = lines.pop()
            out.write(b"".join(f"{rank}: ".encode() + line + b"\n" for line in lines))
        out.flush()

    def flush(self) -> None:
        for rank, rest in self.partial.items():
            if rest:
                self._write(rank, b"\n")


def exit_status(job: dict[str, Any]) -> int:
    """What `corral run` exits with: the job's exit status; 1 with the reason when it did not run
    to an exit (rejected, cancelled) or its status is unknown."""
    state, code = job["state"], job.get("exit_code")
    if state == "finished":
        return 0
    reason = job.get("reason") or state
    say_error(f"job {job['id']} {state}: {reason}")
    if state == "failed" and isinstance(code, int) and 0 < code < 256:
        return code
    return 1


def _follow_to_end(corral: Client, job_id: str, follow: Follow) -> dict[str, Any]:
    while True:
        job = corral.job(job_id)
        if job["state"] in WAITING:
            wait_started(corral, job_id)
            continue
        latest = int(job.get("attempt") or 0)
        if not follow.pump(corral, latest) and job["state"] in TERMINAL:
            follow.pump(corral, latest)  # what was written between the two looks
            follow.flush()
            return job
        time.sleep(EVERY)


def credentials(ctx: typer.Context, server: str | None, token: str | None) -> tuple[str, str]:
    from corral.cli.settings import resolve_connection

    url, secret = resolve_connection(server or _inherited(ctx, "server"), token or _inherited(ctx, "token"))
    if not secret:
        fail("no token", "set CORRAL_TOKEN or pass --token", code=3)
    return url, secret


@app.command(context_settings={"allow_interspersed_args": False}, rich_help_panel=PANEL)
@with_submit_flags()
def run(
    ctx: typer.Context,
    rank: Annotated[int, typer.Option("--rank", "-r", min=0, help="the rank whose output to print")] = 0,
    all_ranks: Annotated[
        bool, typer.Option("--all-ranks", help="every rank's output, each line prefixed by its rank")
    ] = False,
    **flags: Any,
) -> None:
    """Run a job and wait for it, like srun: `corral run --gpus 1 -- python eval.py`.

    Takes every flag of `corral submit`. Says why the job waits, prints rank 0's output (or
    --rank N's, or --all-ranks), cancels the job on Ctrl-C (twice: stop waiting), and exits with
    the job's exit status (1, with the reason, if it was rejected or cancelled)."""
    with connect(ctx, flags.get("server"), flags.get("token")) as corral:
        job = corral.submit(spec_of(corral, flags))
        job_id = str(job["id"])
        typer.echo(f"{job_id}: submitted to queue {job['queue']}", err=True)
        ranks = list(range(int(job.get("replicas") or 1))) if all_ranks else [rank]
        follow = Follow(job_id, ranks, prefix=all_ranks)
        cancelled = False
        while True:
            try:
                job = _follow_to_end(corral, job_id, follow)
                break
            except KeyboardInterrupt:
                if cancelled:
                    say_error(f"stopped waiting; job {job_id} is being cancelled")
                    raise typer.Exit(130) from None
                cancelled = True
                _cancel(corral, job_id)
                typer.echo(f"{job_id}: cancelling (Ctrl-C again to stop waiting)", err=True)
    raise typer.Exit(exit_status(job))


def _cancel(corral: Client, job_id: str) -> None:
    from corral.client import ClientError

    try:
        corral.cancel(job_id)
    except ClientError as err:
        if err.status != 409:  # 409: it had ended or was stopping already
            raise


@app.command(context_settings={"allow_interspersed_args": False}, rich_help_panel=PANEL)
@with_submit_flags(drop=("command",))
def alloc(ctx: typer.Context, **flags: Any) -> None:
    """Hold GPUs and get a shell inside them, like salloc: `corral alloc --gpus 2 --time-limit 1h`.

    Takes every flag of `corral submit` but the command. Waits for the GPUs like any job, then
    opens a shell on their node inside the job (its cgroup, GPUs, `CUDA_VISIBLE_DEVICES` and
    the rest of a worker's environment, as the job's user). `exit` ends the allocation."""
    from corral.agent.terminal import HOLDER
    from corral.cli.terminal_client import open_terminal
    from corral.client import ClientError

    url, secret = credentials(ctx, flags.get("server"), flags.get("token"))
    with connect(ctx, url, secret) as corral:
        spec = spec_of(corral, flags)
        spec.setdefault("name", "alloc")
        spec["command"] = HOLDER
        job_id = str(corral.submit(spec)["id"])
        typer.echo(f"{job_id}: allocation submitted; waiting for its GPUs (Ctrl-C cancels it)", err=True)
        try:
            job = wait_started(corral, job_id)
        except KeyboardInterrupt:
            _cancel(corral, job_id)
            fail(f"allocation {job_id} cancelled", code=1)
        if job["state"] != "running":
            raise typer.Exit(exit_status(job))
        typer.echo(
            f"{job_id}: running on {job['placement'][0]['node']}; `exit` ends the allocation", err=True
        )
        try:
            code = open_terminal(url, secret, job_id, 0, end=True)
        except ClientError as err:
            _cancel(corral, job_id)  # no shell: the GPUs are not held for nobody
            raise typer.Exit(report(err)) from None
        ended = _wait_end(corral, job_id)
        typer.echo(f"{job_id}: allocation ended ({ended})", err=True)
    raise typer.Exit(code)


def _wait_end(corral: Client, job_id: str, patience: float = 30.0) -> str:
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        state = str(corral.job(job_id)["state"])
        if state in TERMINAL:
            return state
        time.sleep(0.2)
    return "still ending: see `corral show " + job_id + "`"


@app.command(rich_help_panel=PANEL)
def attach(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(metavar="JOB", help="a running job's id")],
    rank: Annotated[int, typer.Option("--rank", "-r", min=0, help="open it on this rank's node")] = 0,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """A shell inside a running job (its cgroup, GPUs, environment and working directory, as
    the job's user), for debugging; exiting it leaves the job running."""
    from corral.cli.terminal_client import open_terminal
    from corral.client import ClientError

    url, secret = credentials(ctx, server, token)
    try:
        code = open_terminal(url, secret, job_id, rank)
    except ClientError as err:
        raise typer.Exit(report(err)) from None
    raise typer.Exit(code)
