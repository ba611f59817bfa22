"""Why pending jobs wait, as the scheduler persists it (DESIGN.md 6.4: reasons live in the
scheduler's memory and are written on change).

A cycle gives a reason to every job it looked at, and one shared reason (`others`) to the jobs
it did not reach. Walking every pending job each cycle would cost O(backlog) per cycle, so the
book looks only at the jobs the cycle looked at, the jobs new to pending since the last cycle,
and every pending job only when the shared reason itself changed. A reason whose code is
unchanged is rewritten at most every REASON_REFRESH seconds (its text carries times that move).
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.core.decisions import CycleResult
from corral.core.model import JobId
from corral.core.state import ClusterState

REASON_REFRESH = 10.0  # seconds


class ReasonBook:
    def __init__(self) -> None:
        self.known: dict[str, tuple[str, str, float]] = {}  # job -> (code, message, when written)
        self.fresh: set[str] = set()  # pending jobs whose reason was never computed
        self.others: tuple[str, str] | None = None

    def look_at_all(self) -> None:
        """The next cycle looks at every pending job (after the state was rebuilt)."""
        self.others = ("", "")  # never a real reason

    def changes(
        self, state: ClusterState, result: CycleResult, now: float
    ) -> list[tuple[str, str, str, bool]]:
        """(job, code, message, new code?) for every reason to write after this cycle."""
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
        out: list[tuple[str, str, str, bool]] = []
        for job_id in candidates:
            reason = result.reason_of(JobId(job_id))
            if reason is None:
                continue
            code, message = reason.code.value, reason.message
            seen = known.get(job_id)
            if (
                seen is not None
                and seen[0] == code
                and (seen[1] == message or now - seen[2] < REASON_REFRESH)
            ):
                continue
            known[job_id] = (code, message, now)
            out.append((job_id, code, message, seen is None or seen[0] != code))
        return out
