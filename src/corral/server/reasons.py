"""Why pending jobs wait, as the scheduler persists it (DESIGN.md 6.4: reasons live in the
scheduler's memory and are written on change).

A cycle gives a reason to every job it looked at, and one shared reason (`others`) to the jobs
it did not reach. The book looks only at the jobs the cycle looked at and the jobs new to
pending since the last look, and at every pending job only when the shared reason itself
changed. The cycle's reasons come as the core's runs of jobs that share one reason
(`Reasons.runs`): the book remembers, per reason, the jobs of runs that its last look left with
exactly that reason written (`settled`), and compares one by one only the other jobs of a run
(new to it, made fresh, or left with an older time): a look at 100,000 waiting jobs whose runs
did not change costs a set lookup per job (about 20 ms), not a comparison per job. The
scheduler takes one at most every `pacing.REASON_FLUSH` seconds, after the cycle's decisions
are committed.

What is written: a reason whose code changes, or whose sentence changes in anything but the
clock times it names (free GPUs, what holds them, a reservation's owner), at once. A reason
whose only change is a moving time ("protected by min_runtime until 18:04:22 UTC", "it would
run until 00:18:55 UTC": the time moves as jobs start and as the clock goes) is rewritten
the first time the book looks `REFRESH` seconds or more after its last write (at once when the
time it stored has passed), and at most `REFRESH_PER_LOOK` such rewrites per look, so
that a long backlog whose sentences all name moving times is not rewritten every cycle
(issue 15: 19,000 rows a cycle at 100,000 waiting jobs). docs/concepts.md ("Why a job waits")
says what this means for a reader.
"""

from __future__ import annotations

import math
import re
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

from corral.core.decisions import CycleResult, Reason
from corral.core.model import JobId
from corral.core.state import ClusterState

REFRESH = 15.0  # seconds: a job's sentence whose only change is a time is rewritten at most this often
REFRESH_PER_LOOK = 2000  # at most this many such rewrites per look; the rest wait for the next
# the clock times of core/reasons.py `clock`: `18:04:22 UTC`, `2026-12-04 18:04:22 UTC`, `t=1840s`
_TIMES = re.compile(r"(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d UTC|t=-?\d+s")


# (code, message, at, when written: the cycle's clock, the message without its clock times)
Written = tuple[str, str, float | None, float, str | None]


class ReasonChange(NamedTuple):
    """One reason to write: the job, its code, sentence and time, and whether the code is new
    (a new code also goes to the job's reason history)."""

    job: str
    code: str
    message: str
    at: float | None
    new_code: bool


def only_times_moved(old: str, new: str) -> bool:
    """Whether two sentences differ only in the clock times they name."""
    return _TIMES.sub("", old) == _TIMES.sub("", new)


class ReasonBook:
    def __init__(self) -> None:
        # job -> its reason as written (`Written`: the sentence without its clock times is None
        # until needed)
        self.known: dict[str, Written] = {}
        self.fresh: set[str] = set()  # pending jobs whose reason was never computed
        self.others: tuple[str, str] | None = None
        # (code, message, at) -> the jobs of the core's runs that the last look left with exactly
        # this reason written (`known`): a run's job found here again needs no look
        self.settled: dict[tuple[str, str, float | None], set[str]] = {}

    def look_at_all(self) -> None:
        """The next look is at every pending job (after the state was rebuilt)."""
        self.others = ("", "")  # never a real reason

    def remember(self, job: str, code: str, message: str, at: float | None) -> None:
        """A reason as read from the database (its age unknown: any change to it is written)."""
        self.known.setdefault(job, (code, message, at, -math.inf, None))

    def changes(self, state: ClusterState, result: CycleResult) -> list[ReasonChange]:
        """Every reason to write after this cycle.

        The cycle's reasons come as the core's runs of jobs sharing one reason
        (`Reasons.runs`): a job of a run whose reason the last look left written for it, and
        that nothing made fresh since, is passed over without a look; the other jobs are
        compared one by one, as are the jobs given a reason of their own. What is written is
        what a look at every job writes, in the same order (tests/server/test_reason_runs.py)."""
        known = self.known
        fresh = self.fresh
        for job_id in fresh:  # new, requeued or released: its stored reason is "" (a start
            known.pop(job_id, None)  # clears it), whatever the book remembers from before
        settled, self.settled = self.settled, {}
        if len(known) > 2 * len(state.jobs) + 1000:
            for job_id in [j for j in known if j not in state.jobs]:
                del known[job_id]
            settled = {}
        others = (result.others.code.value, result.others.message) if result.others is not None else None
        look = _Look(known, result.now)
        if others != self.others:  # rare (pause, resume, a strict FIFO head's change): every job
            look.compare([(j, r) for j in state.jobs if (r := result.reason_of(JobId(j))) is not None])
        else:
            runs, own = result.reasons.runs()
            for keys, reason in runs:
                self._run(look, settled, keys, reason)
            look.compare(list(own.items()))
            if result.others is not None:
                reasons = result.reasons
                look.compare([(j, result.others) for j in fresh if j in state.jobs and j not in reasons])
        self.others = others
        fresh.clear()
        return look.out

    def _run(
        self,
        look: _Look,
        settled: dict[tuple[str, str, float | None], set[str]],
        keys: list[tuple[object, ...]],
        reason: Reason,
    ) -> None:
        """The jobs of one run (`keys`, whose last items are the job ids) waiting for `reason`."""
        ids: list[str] = list(map(_job_of, keys))
        key = (reason.code.value, reason.message, reason.at)
        before = settled.get(key)
        if before is None:
            todo = ids
        elif self.fresh:
            fresh = self.fresh
            todo = [j for j in ids if j not in before or j in fresh]
        else:
            todo = [j for j in ids if j not in before]
        deferred = look.compare(list(zip(todo, repeat(reason)))) if todo else []
        now_settled = self.settled.get(key)
        if now_settled is None:
            now_settled = self.settled[key] = set()
        now_settled.update(ids)
        if deferred:
            now_settled.difference_update(deferred)


_job_of = itemgetter(-1)


class _Look:
    """One look's comparisons: what it writes, and its budget of time-only rewrites."""

    __slots__ = ("figures", "known", "now", "out", "refreshes", "stale")

    def __init__(self, known: dict[str, Written], now: float) -> None:
        self.known = known
        self.now = now
        self.stale = now - REFRESH
        self.refreshes = REFRESH_PER_LOOK
        self.figures: dict[str, str] = {}  # message -> without its clock times (a few dozen distinct)
        self.out: list[ReasonChange] = []

    def compare(self, pairs: list[tuple[str, Reason]]) -> list[str]:
        """Write what changed of these jobs' reasons; the jobs left unwritten although their
        reason differs from the one written (only a time moved, rewritten later)."""
        known, now, stale, figures, out = self.known, self.now, self.stale, self.figures, self.out
        refreshes = self.refreshes
        deferred: list[str] = []
        for job_id, reason in pairs:
            message, at = reason.message, reason.at
            code = reason.code.value
            seen = known.get(job_id)
            if seen is not None and seen[1] == message and seen[2] == at and seen[0] == code:
                continue
            if (fig := figures.get(message)) is None:
                fig = figures[message] = _TIMES.sub("", message)
            if seen is not None:
                old = seen[4] if seen[4] is not None else _TIMES.sub("", seen[1])
                current = seen[2] is None or seen[2] >= now  # the stored time has not passed
                if seen[0] == code and current and old == fig:  # only a time moved
                    if seen[3] > stale or refreshes <= 0:
                        deferred.append(job_id)
                        continue  # written less than REFRESH s ago, or enough rewrites this look
                    refreshes -= 1
            known[job_id] = (code, message, at, now, fig)
            out.append(ReasonChange(job_id, code, message, at, seen is None or seen[0] != code))
        self.refreshes = refreshes
        return deferred
