"""Why pending jobs wait, as the scheduler persists it (DESIGN.md 6.4: reasons live in the
scheduler's memory and are written on change).

A cycle gives a reason to every job it looked at, and one shared reason (`others`) to the jobs
it did not reach. Walking every pending job each cycle would cost O(backlog) per cycle, so the
book looks only at the jobs the cycle looked at, the jobs new to pending since the last cycle,
and every pending job only when the shared reason itself changed. A reason is written whenever
its code, its sentence or its time changes: sentences name absolute times (`Reason.at`), so one
changes only when what it says does (free GPUs, a reservation's start), and a job never keeps a
sentence whose numbers are out of date.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from corral.core.decisions import CycleResult
from corral.core.model import JobId
from corral.core.state import ClusterState


class ReasonChange(NamedTuple):
    """One reason to write: the job, its code, sentence and time, and whether the code is new
    (a new code also goes to the job's reason history)."""

    job: str
    code: str
    message: str
    at: float | None
    new_code: bool


class ReasonBook:
    def __init__(self) -> None:
        self.known: dict[str, tuple[str, str, float | None]] = {}  # job -> (code, message, at) as written
        self.fresh: set[str] = set()  # pending jobs whose reason was never computed
        self.others: tuple[str, str] | None = None

    def look_at_all(self) -> None:
        """The next cycle looks at every pending job (after the state was rebuilt)."""
        self.others = ("", "")  # never a real reason

    def changes(self, state: ClusterState, result: CycleResult) -> list[ReasonChange]:
        """Every reason to write after this cycle."""
        known = self.known
        if len(known) > 2 * len(state.jobs) + 1000:
            for job_id in [j for j in known if j not in state.jobs]:
                del known[job_id]
        others = (result.others.code.value, result.others.message) if result.others is not None else None
        if others != self.others:
            candidates: Iterable[str] = state.jobs
        else:
            candidates = {*result.reasons, *(j for j in self.fresh if j in state.jobs)}
        self.others = others
        self.fresh.clear()
        out: list[ReasonChange] = []
        for job_id in candidates:
            reason = result.reason_of(JobId(job_id))
            if reason is None:
                continue
            entry = (reason.code.value, reason.message, reason.at)
            seen = known.get(job_id)
            if seen == entry:
                continue
            known[job_id] = entry
            out.append(ReasonChange(job_id, *entry, seen is None or seen[0] != entry[0]))
        return out
