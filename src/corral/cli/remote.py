"""What every command that talks to a server shares: connection options, exit codes, errors, output.

Exit codes a script can trust (`corral --help`, docs/cli.md):
0 ok; 1 refused by the server for a domain reason (a state conflict, a job that can never run);
2 bad input (a usage error, an invalid value or spec); 3 not authorised, or not found (401, 403,
404: the server does not tell a job that does not exist from one you may not see); 4 the server
is unreachable. Errors go to stderr as `error: <message> (fix: <fix>)`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from corral.cli.settings import resolve_connection

if TYPE_CHECKING:
    from corral.client import Client, ClientError

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_BAD_INPUT = 2
EXIT_UNAUTHORISED = 3
EXIT_UNREACHABLE = 4

ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        metavar="URL",
        show_default=False,
        help="server URL, or several replicas' as URL1,URL2 (default: $CORRAL_SERVER, then your config, "
        "then http://127.0.0.1:8400)",
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", show_default=False, help="API token (default: $CORRAL_TOKEN, then your config)"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the API's JSON instead of a table")]


def exit_code_of(err: ClientError) -> int:
    """The exit code for a refusal (see the module docstring)."""
    if err.is_unreachable or err.status in (502, 503, 504):
        return EXIT_UNREACHABLE
    if err.status in (401, 403, 404):
        return EXIT_UNAUTHORISED
    if err.status == 422 and err.code == "never_fits":
        return EXIT_REFUSED
    if err.status in (400, 413, 422):
        return EXIT_BAD_INPUT
    return EXIT_REFUSED


def say_error(message: str, fix: str = "") -> None:
    typer.echo(f"error: {message} (fix: {fix})" if fix else f"error: {message}", err=True)


def fail(message: str, fix: str = "", code: int = EXIT_BAD_INPUT) -> NoReturn:
    say_error(message, fix)
    raise typer.Exit(code)


def report(err: ClientError) -> int:
    """Print a refusal on stderr; its exit code."""
    say_error(err.message, err.fix)
    return exit_code_of(err)


def _inherited(ctx: typer.Context | None, name: str) -> str | None:
    """A connection flag given to the command group (`corral nodes --server URL drain N`)."""
    level: Any = ctx
    while level is not None:
        value = level.params.get(name)
        if isinstance(value, str) and value:
            return value
        level = level.parent
    return None


@contextmanager
def connect(ctx: typer.Context | None, server: str | None, token: str | None) -> Iterator[Client]:
    """A client for the resolved server; a refusal inside the block exits with its code."""
    from corral.client import Client, ClientError

    url, secret = resolve_connection(server or _inherited(ctx, "server"), token or _inherited(ctx, "token"))
    try:
        client = Client(url, secret)
    except ValueError as exc:
        fail(str(exc), "give a URL such as http://127.0.0.1:8400")
    try:
        with client:
            yield client
    except ClientError as err:
        raise typer.Exit(report(err)) from None


# ---- output ----------------------------------------------------------------------------------
def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2))


def print_json_line(value: Any) -> None:
    typer.echo(json.dumps(value, separators=(",", ":")))


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, empty: str = "") -> None:
    """A table for people (rich); `empty` is printed instead when there are no rows.

    Into a pipe or a file: plain columns, whole lines (never wrapped at 80), no trailing blanks."""
    if not rows and empty:
        typer.echo(empty)
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(
        *columns, box=box.SIMPLE_HEAD if console.is_terminal else None, show_edge=False, pad_edge=False,
        header_style="bold",
    )  # fmt: skip
    for row in rows:
        table.add_row(*("-" if v is None or v == "" else str(v) for v in row))
    if console.is_terminal:
        console.print(table)
        return
    natural = Console(width=100_000).measure(table).maximum
    plain = Console(width=max(console.width, natural), no_color=True, highlight=False)
    with plain.capture() as captured:
        plain.print(table)
    typer.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def print_fields(pairs: Sequence[tuple[str, Any]]) -> None:
    """`key: value` lines, keys aligned; empty values are skipped."""
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        if value is None or value == "" or value == []:
            continue
        typer.echo(f"{key + ':':<{width + 1}} {value}")


def when(t: float | None) -> str:
    """A Unix time as local `YYYY-MM-DD HH:MM:SS`."""
    if t is None:
        return ""
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def age(t: float | None, now: float | None = None) -> str:
    """How long ago `t` was, e.g. `3m`, `2h5m`, `4d`."""
    if t is None:
        return ""
    seconds = max(0, int((now if now is not None else time.time()) - t))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        hours, minutes = divmod(seconds // 60, 60)
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    return f"{seconds // 86400}d"


def seconds_text(seconds: float | None) -> str:
    """A duration in the job spec's unit form (`4h`, `1h30m`); empty for none."""
    if seconds is None:
        return ""
    from corral.config.durations import format_duration

    return format_duration(seconds)


def placement_text(placement: Sequence[dict[str, Any]]) -> str:
    """`dgx01:0-3 dgx02:0-7`: the GPUs of each node, in rank order; consecutive replicas on one
    node are one entry (a gang of 8 x 1 GPU on a node is `dgx01:0-7`, not eight entries)."""
    merged: list[tuple[str, list[int]]] = []
    for p in placement:
        if merged and merged[-1][0] == p["node"]:
            merged[-1][1].extend(p.get("gpus", []))
        else:
            merged.append((p["node"], list(p.get("gpus", []))))
    return " ".join(f"{node}:{gpu_ranges(sorted(gpus))}" for node, gpus in merged)


def gpu_ranges(gpus: Sequence[int]) -> str:
    """`[0, 1, 2, 3, 6]` as `0-3,6`; no GPUs as `-`."""
    if not gpus:
        return "-"
    parts: list[str] = []
    start = prev = gpus[0]
    for g in [*gpus[1:], None]:
        if g is not None and g == prev + 1:
            prev = g
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if g is not None:
            start = prev = g
    return ",".join(parts)
