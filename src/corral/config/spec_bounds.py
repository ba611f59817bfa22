"""Bounds of a job spec that can launch (docs/job-spec.md, "Bounds"): what exec and a sandbox
accept, checked at submit so that a spec that could never start is refused with the field and
the fix instead of failing at every attempt on the node."""

from __future__ import annotations

import os

from corral.config.durations import format_duration
from corral.config.invalid import InvalidValue

__all__ = [
    "MAX_ARG_BYTES",
    "MAX_COMMAND_BYTES",
    "MAX_CPUS",
    "MAX_ENV_BYTES",
    "MAX_MEMORY_GIB",
    "MAX_NAME",
    "MAX_RESTARTS",
    "MAX_TIME_LIMIT",
    "SYSTEM_DIRS",
    "bounded_time_limit",
    "launchable_argv",
    "launchable_env",
    "mount_target",
    "no_nul_path",
]

# Bounds of a spec that can launch (docs/job-spec.md, "Bounds"). Linux refuses one argument or
# environment string over MAX_ARG_STRLEN (128 KiB) and an argv plus environment over ARG_MAX
# (2 MiB with the usual 8 MiB stack): the command and the env each stay well inside.
MAX_ARG_BYTES = 128 * 1024 - 1  # one argument, or one NAME=value of env, in UTF-8 bytes
MAX_COMMAND_BYTES = 256 * 1024  # the whole argv
MAX_ENV_BYTES = 256 * 1024  # the whole env (NAME=value strings)
MAX_RESTARTS = 100
MAX_NAME = 256  # characters of a job's name
MAX_CPUS = 1 << 20  # CPU cores of one replica
MAX_MEMORY_GIB = float(1 << 30)  # host memory of one replica
MAX_TIME_LIMIT = 365 * 86400.0
# a mount may not cover the root nor these (nor anything under them): the job's own system
SYSTEM_DIRS = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
    "/sys", "/usr", "/var",
)  # fmt: skip


def _no_nul(text: str, what: str) -> None:
    if "\x00" in text:
        raise InvalidValue(f"{what} contains a NUL byte, which no process can be given", "remove it")


def launchable_argv(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The argv can be passed to exec: no NUL byte, each argument and the whole within bounds."""
    total = 0
    for i, arg in enumerate(argv):
        _no_nul(arg, f"argument {i}")
        size = len(arg.encode("utf-8", "surrogatepass"))
        if size > MAX_ARG_BYTES:
            raise InvalidValue(
                f"argument {i} is {size} bytes, over the {MAX_ARG_BYTES} a process may be given",
                "put large data in a file the job reads (under a mount), not on the command line",
            )
        total += size + 1
    if total > MAX_COMMAND_BYTES:
        raise InvalidValue(
            f"the command is {total} bytes, over the {MAX_COMMAND_BYTES} allowed",
            "put large data in a file the job reads, not on the command line",
        )
    return argv


def launchable_env(env: dict[str, str]) -> dict[str, str]:
    """The env can be given to exec: no NUL byte, each NAME=value and the whole within bounds."""
    total = 0
    for key, value in env.items():
        _no_nul(f"{key}={value}", f"env {key}")
        size = len(f"{key}={value}".encode("utf-8", "surrogatepass"))
        if size > MAX_ARG_BYTES:
            raise InvalidValue(
                f"env {key} is {size} bytes, over the {MAX_ARG_BYTES} a process may be given",
                "put large values in a file the job reads, and its path in the variable",
            )
        total += size + 1
    if total > MAX_ENV_BYTES:
        raise InvalidValue(
            f"env is {total} bytes, over the {MAX_ENV_BYTES} allowed",
            "put large values in files the job reads, and their paths in variables",
        )
    return env


def bounded_time_limit(seconds: float | None) -> float | None:
    if seconds is not None and seconds > MAX_TIME_LIMIT:
        raise InvalidValue(
            f"a time limit of {format_duration(seconds)} is above the "
            f"{format_duration(MAX_TIME_LIMIT)} maximum",
            "ask for at most 365d (a longer job checkpoints and is resubmitted)",
        )
    return seconds


def mount_target(target: str) -> str:
    """A mount target is absolute, normalised, and neither the root nor a system directory."""
    _no_nul(target, "the target")
    if os.path.normpath(target) != target or target.startswith("//"):
        raise InvalidValue(
            f"the target {target!r} is not a normalised path",
            f"write it without '.', '..', '//' or a trailing '/', e.g. {os.path.normpath(target)!r}",
        )
    covered = [d for d in SYSTEM_DIRS if target == d or target.startswith(d + "/")]
    if target == "/" or covered:
        raise InvalidValue(
            f"the target {target} would cover {'the root' if target == '/' else covered[0]} "
            "of the job's own system",
            "mount somewhere of the job's own, e.g. /data, /scratch or /mnt/NAME "
            f"(not /, nor under {', '.join(SYSTEM_DIRS)})",
        )
    return target


def no_nul_path(path: str) -> str:
    _no_nul(path, "the path")
    return path
