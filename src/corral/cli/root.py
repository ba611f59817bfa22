"""The Typer root of the `corral` command: every command module registers itself on `app`, and
`main.py` imports them all. A module of its own so that no command module imports `main.py`."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="corral",
    help=(
        "Corral: a GPU cluster scheduler.\n\n"
        "Exit codes: 0 ok; 1 refused by the server (a state conflict, a job that can never run: "
        "rejected); 2 bad input; 3 not authorised, or not found; 4 the server is unreachable."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
