"""`corral submit script.sh`: a batch script whose `#CORRAL` lines carry flags, like `#SBATCH`.

A command whose first word is a local file starting with `#!` is a batch script: its `#CORRAL`
lines (in the comment block at its top: up to the first line that is neither blank nor a
comment) are parsed as `corral submit` flags; flags on the command line win (a repeatable flag,
`--env` or `--mount`, adds to the script's). The script's text travels with the job, as
`sbatch` copies it: the job runs `INTERPRETER -c TEXT SCRIPT ARGS...` with the interpreter of
its `#!` line, so the node needs no copy of the file.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from corral.core.errors import ConfigError

PREFIX = "#CORRAL"
MAX_SCRIPT_BYTES = 64 * 1024
REPEATED = ("env", "mount", "gpu_model")
NOT_IN_SCRIPTS = ("command", "file", "server", "token", "as_json")


def find(word: str) -> Path | None:
    """The batch script `word` names, or None when it is not one (a plain argv)."""
    path = Path(word)
    try:
        if not path.is_file():
            return None
        with path.open("rb") as f:
            return path if f.read(2) == b"#!" else None
    except OSError:
        return None


def directives(text: str, source: str = "script") -> list[str]:
    """The flags of the `#CORRAL` lines at the top of a script, as command-line words."""
    words: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if number == 1 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            break  # the first command ends the directives, as with #SBATCH
        if not stripped.startswith(PREFIX):
            continue
        rest = stripped[len(PREFIX) :]
        if rest and not rest[0].isspace():
            continue  # e.g. `#CORRALX`: not a directive
        try:
            words += shlex.split(rest, comments=True)
        except ValueError as exc:
            fix = "quote values as in a shell"
            raise ConfigError(f"line {number}: {exc}", where=source, fix=fix) from None
    return words


def command(path: Path, text: str, args: list[str]) -> list[str]:
    """The argv that runs the script's text with the interpreter of its `#!` line."""
    shebang = text.splitlines()[0][2:].strip().split() if text.startswith("#!") else []
    return [*(shebang or ["/bin/sh"]), "-c", text, path.name, *args]


def merged(ctx: Any, path: Path, args: list[str]) -> dict[str, Any]:
    """`ctx`'s parameters with the script's `#CORRAL` flags under them, and the script as command."""
    data = path.read_bytes()
    if len(data) > MAX_SCRIPT_BYTES:
        raise ConfigError(
            f"{path} is {len(data):,} bytes; a batch script may have {MAX_SCRIPT_BYTES:,}",
            fix="put the work in a file the nodes can read and run it with `corral submit -- CMD`",
        )
    text = data.decode("utf-8", errors="replace")
    words = directives(text, str(path))
    params = dict(ctx.params)
    if words:
        try:
            sub = ctx.command.make_context(ctx.info_name, [*words], parent=ctx.parent)
        except Exception as exc:  # typer's own click: a usage error names the bad flag
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            raise ConfigError(
                f"#CORRAL line: {message}", where=str(path), fix="use `corral submit` flags"
            ) from None
        for key, value in sub.params.items():
            if key in NOT_IN_SCRIPTS or value is None:
                continue
            if key in REPEATED:
                params[key] = [*(value or []), *(params.get(key) or [])]
            elif params.get(key) is None:
                params[key] = value
    params["command"] = command(path, text, args)
    return params
