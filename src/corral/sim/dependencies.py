"""Dependencies in a replay: the trace's optional `dependency` column (DESIGN.md 4.5, Slurm syntax).

Checked when the trace is loaded: every target is a job of the trace, none waits for itself
through others (a cycle is a fatal error that names the jobs), and `singleton` (which needs
job names a trace does not have) is refused. During the replay the engine keeps a job whose
conditions do not hold out of the core; it is let in at the instant the last condition holds
(it keeps its submit time, so its queueing delay counts the wait), and a job with a condition
that can never hold (`afterok` on a job that failed or was rejected or cancelled) is logged
`cancel` with the reason at once, and so are, in turn, the jobs that waited for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.config.array_spec import MET, NEVER, Progress, judge, never_sentence, parse_dependency
from corral.core.errors import ConfigError, TraceError


class DependencyBook:
    """The conditions of a trace's jobs and where their targets stand."""

    def __init__(self, conditions: dict[str, list[tuple[str, str]]]) -> None:
        self.conditions = conditions  # job -> [(kind, target)]
        self.waiters: dict[str, list[str]] = {}  # target -> jobs with a condition on it
        for job, on in conditions.items():
            for _, target in on:
                self.waiters.setdefault(target, []).append(job)
        self.progress: dict[str, Progress] = {}
        self.parked: set[str] = set()

    @classmethod
    def of(cls, jobs: Sequence[tuple[str, str | None]]) -> DependencyBook | None:
        """From (job id, dependency text) pairs; None when no job has one (no cost in the replay)."""
        ids = {job for job, _ in jobs}
        conditions: dict[str, list[tuple[str, str]]] = {}
        for job, text in jobs:
            if not text:
                continue
            try:
                dep = parse_dependency(text, "dependency")
            except ConfigError as exc:
                raise TraceError(f"job {job!r}: dependency {exc.detail} (fix: {exc.fix})") from None
            if dep.singleton:
                raise TraceError(f"job {job!r}: singleton needs job names, which a trace does not have")
            for _, target in dep.on:
                if target not in ids:
                    what = f"dependency names {target!r}, which is not a job of the trace"
                    raise TraceError(f"job {job!r}: {what}")
            conditions[job] = list(dep.on)
        if not conditions:
            return None
        _refuse_cycles(conditions)
        return cls(conditions)

    def holds(self, job: str) -> tuple[str, str]:
        """(MET, "") or (NEVER, why) or (WAIT, "") for a job, from its targets' progress."""
        waiting = False
        for kind, target in self.conditions.get(job, ()):
            found = judge(kind, self.progress.get(target, Progress(1)))
            if found == NEVER:
                return NEVER, never_sentence(kind, target, False)
            waiting = waiting or found != MET
        return ("wait", "") if waiting else (MET, "")

    def settle(self, job: str, started: bool = False, ok: bool | None = None) -> list[str]:
        """A job started (`started`) or ended (`ok`): the parked jobs whose verdict may change."""
        p = self.progress.get(job, Progress(1))
        if ok is None:
            p = Progress(1, started=1)
        else:
            p = Progress(1, started=1, finished=1 if ok else 0, not_ok=0 if ok else 1)
        self.progress[job] = p
        return [w for w in self.waiters.get(job, ()) if w in self.parked]


def _refuse_cycles(conditions: dict[str, list[tuple[str, str]]]) -> None:
    """A TraceError naming the jobs of the first cycle found (depth-first, white/grey/black)."""
    colour: dict[str, int] = {}
    for root in conditions:
        if colour.get(root):
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = []
        while stack:
            job, i = stack.pop()
            if i == 0:
                colour[job] = 1
                path.append(job)
            targets = [t for _, t in conditions.get(job, ())]
            if i < len(targets):
                stack.append((job, i + 1))
                nxt = targets[i]
                if colour.get(nxt) == 1:
                    loop = " -> ".join([*path[path.index(nxt) :], nxt])
                    raise TraceError(f"dependency cycle: {loop} (fix: remove one of these conditions)")
                if not colour.get(nxt):
                    stack.append((nxt, 0))
            else:
                colour[job] = 2
                path.pop()
