"""Slurm's job-array and dependency syntax: `--array 0-99%8` and `--dependency afterok:j12,singleton`.

Both are parsed here, once, for the CLI (`#CORRAL` lines and flags), the API and the simulator's
trace; errors are `ConfigError`s that name the option and show a correct spelling.

- An array spec is a comma-separated list of indices (`3`), ranges (`0-15`) and stepped ranges
  (`0-15:4`), optionally followed by `%N`: at most N tasks of the array run at once. Indices
  are 0..MAX_ARRAY_INDEX, unique once expanded, and at most MAX_ARRAY_TASKS of them.
- A dependency is a comma-separated list, every item of which must hold (Slurm's `,`):
  `after:J[:J...]` (J started, or ended without starting), `afterany:J` (J ended),
  `afterok:J` (J finished), `afternotok:J` (J failed, was cancelled or rejected), and
  `singleton` (every earlier job of the same name and user has ended). J is a job id or an
  array id (`j12`: every task of the array); `j12_3` names one task.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from corral.core.errors import ConfigError

MAX_ARRAY_TASKS = 100_000
MAX_ARRAY_INDEX = 10_000_000
KINDS = ("after", "afterany", "afterok", "afternotok")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ARRAY_FIX = "write e.g. 0-99, 0-15:4, 1,3,5-7 or 0-999%8 (at most 8 tasks running at once)"
_DEP_FIX = "write e.g. afterok:j12, afterok:j12:j13,afterany:j9, afternotok:j12_3 or singleton"


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """An expanded array spec: the task indices in increasing order, and the `%N` cap (0: none)."""

    text: str
    indices: tuple[int, ...]
    max_running: int = 0


@dataclass(frozen=True, slots=True)
class Dependency:
    """Conditions that must all hold before a job may start: (kind, job or array id) pairs."""

    text: str
    on: tuple[tuple[str, str], ...]
    singleton: bool = False

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(target for _, target in self.on))


def parse_array(text: str, where: str = "--array") -> ArraySpec:
    """`0-99%8` -> indices 0..99, at most 8 running; ConfigError naming `where` on a bad spec."""
    raw = text.strip()
    body, pct, cap = raw.partition("%")
    max_running = 0
    if pct:
        if not cap.isdigit() or int(cap) < 1:
            raise ConfigError(f"{text!r}: %N needs a whole number of at least 1", where=where, fix=_ARRAY_FIX)
        max_running = int(cap)
    if not body:
        raise ConfigError(f"{text!r} names no task", where=where, fix=_ARRAY_FIX)
    seen: set[int] = set()
    for item in body.split(","):
        for index in _expand(item.strip(), text, where):
            if index in seen:
                raise ConfigError(f"{text!r}: task {index} is named twice", where=where, fix=_ARRAY_FIX)
            seen.add(index)
            if len(seen) > MAX_ARRAY_TASKS:
                raise ConfigError(
                    f"{text!r} makes more than {MAX_ARRAY_TASKS:,} tasks",
                    where=where,
                    fix="split the work into several arrays",
                )
    return ArraySpec(raw, tuple(sorted(seen)), max_running)


def _expand(item: str, text: str, where: str) -> range:
    match = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", item)
    if match is None:
        raise ConfigError(
            f"{text!r}: {item!r} is not an index, a range or a stepped range", where=where, fix=_ARRAY_FIX
        )
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    step = int(match.group(3)) if match.group(3) is not None else 1
    if last < first:
        raise ConfigError(f"{text!r}: the range {item} ends before it begins", where=where, fix=_ARRAY_FIX)
    if step < 1:
        raise ConfigError(f"{text!r}: the step of {item} must be at least 1", where=where, fix=_ARRAY_FIX)
    if last > MAX_ARRAY_INDEX:
        raise ConfigError(
            f"{text!r}: index {last} is above the largest, {MAX_ARRAY_INDEX:,}", where=where, fix=_ARRAY_FIX
        )
    return range(first, last + 1, step)


def parse_dependency(text: str, where: str = "--dependency") -> Dependency:
    """`afterok:j1:j2,singleton` -> its conditions; ConfigError naming `where` on a bad one."""
    raw = text.strip()
    if not raw:
        raise ConfigError("the dependency is empty", where=where, fix=_DEP_FIX)
    if "?" in raw:
        raise ConfigError(
            f"{text!r}: `?` (any one of) is not supported; every condition must hold",
            where=where,
            fix="separate conditions with `,` (all of them), or submit alternatives as separate jobs",
        )
    on: list[tuple[str, str]] = []
    singleton = False
    for item in raw.split(","):
        item = item.strip()
        if item == "singleton":
            singleton = True
            continue
        kind, _, rest = item.partition(":")
        if kind not in KINDS:
            raise ConfigError(
                f"{text!r}: {kind or item!r} is not a dependency type (after, afterany, afterok, "
                "afternotok, singleton)",
                where=where,
                fix=_DEP_FIX,
            )
        ids = [x.strip() for x in rest.split(":")] if rest else []
        if not ids or not all(ids):
            raise ConfigError(f"{text!r}: {kind} names no job", where=where, fix=_DEP_FIX)
        for job in ids:
            job = job.split("+")[0]  # Slurm's `after:J+minutes` delay is not supported: refuse below
            if not _ID.match(job) or "+" in item.split(":", 1)[1]:
                raise ConfigError(f"{text!r}: {job!r} is not a job id", where=where, fix=_DEP_FIX)
            if (kind, job) not in on:
                on.append((kind, job))
    return Dependency(raw, tuple(on), singleton)


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a dependency's target stands: its tasks (1 for a job), how many started or ended,
    how many finished (exit 0) and how many ended otherwise (failed, cancelled, rejected); and
    when its last task started and its last task ended (None: unknown, or none yet)."""

    tasks: int
    started: int = 0
    finished: int = 0
    not_ok: int = 0
    last_start: float | None = None
    last_end: float | None = None

    @property
    def ended(self) -> int:
        return self.finished + self.not_ok


MET, WAIT, NEVER = "met", "wait", "never"
_WAITS = {
    "after": "to start",
    "afterany": "to end",
    "afterok": "to finish successfully",
    "afternotok": "to fail",
}


def judge(kind: str, p: Progress) -> str:
    """MET, WAIT or NEVER for one condition on a target that stands at `p`."""
    if kind == "after":
        return MET if p.started >= p.tasks else WAIT
    if kind == "afterany":
        return MET if p.ended >= p.tasks else WAIT
    if kind == "afterok":
        return NEVER if p.not_ok else MET if p.finished >= p.tasks else WAIT
    if p.ended >= p.tasks:  # afternotok
        return MET if p.not_ok else NEVER
    return WAIT


def met_at(conditions: Sequence[tuple[str, str, bool]], known: dict[str, Progress]) -> float | None:
    """When conditions that all hold came to hold (the time the job became eligible, Slurm's
    EligibleTime): the latest start (`after`) or end of the targets they name; None when a
    target's time is unknown."""
    times: list[float] = []
    for kind, target, _ in conditions:
        p = known.get(target)
        t = None if p is None else p.last_start if kind == "after" else p.last_end
        if t is None:
            return None
        times.append(t)
    return max(times, default=None)


def waiting_sentence(kind: str, target: str, is_array: bool) -> str:
    """`waits for j12 to finish successfully` (every task of an array)."""
    what = f"every task of array {target}" if is_array else target
    if kind == "afternotok" and is_array:
        return f"waits for every task of array {target} to end, one of them unsuccessfully"
    return f"waits for {what} {_WAITS[kind]}"


def never_sentence(kind: str, target: str, is_array: bool) -> str:
    """Why a condition can never hold, for the reason of the job cancelled because of it."""
    what = f"array {target}" if is_array else target
    if kind == "afterok":
        return f"dependency never satisfied: {what} did not finish successfully (afterok:{target})"
    return f"dependency never satisfied: {what} finished successfully (afternotok:{target})"
