"""Why pending jobs wait, as the scheduler persists it (DESIGN.md 6.4: reasons live in the
scheduler's memory and are written on change).

A cycle gives a reason to every job it looked at, and one shared reason (`others`) to the jobs
it did not reach. The book looks only at the jobs the cycle looked at and the jobs new to
pending since the last look, and at every pending job only when the shared reason itself
changed. The cycle's reasons come as the core's runs of jobs that share one reason
(`Reasons.runs`, never unfolded into a dict), and the jobs a look writes with one reason share one
tuple, so the book compares what was written with a reason once per run of jobs that share both
(`_Look`): a look at 100,000 waiting jobs costs a dict lookup per job, about 10 ms, whatever
changed. The scheduler takes one at most every `pacing.REASON_FLUSH` seconds, after the cycle's
decisions are committed, and queues what changed to its writer's thread (server/reason_writer.py).

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
from collections.abc import Iterable
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
        # job -> its reason as written (`Written`; the sentence without its clock times is None
        # until needed). The jobs written with one reason in one look share one tuple.
        self.known: dict[str, Written] = {}
        self.fresh: set[str] = set()  # pending jobs whose reason was never computed
        self.others: tuple[str, str] | None = None

    def look_at_all(self) -> None:
        """The next look is at every pending job (after the state was rebuilt)."""
        self.others = ("", "")  # never a real reason

    def remember(self, job: str, code: str, message: str, at: float | None) -> None:
        """A reason as read from the database (its age unknown: any change to it is written)."""
        self.known.setdefault(job, (code, message, at, -math.inf, None))

    def changes(self, state: ClusterState, result: CycleResult) -> list[ReasonChange]:
        """Every reason to write after this cycle, in the order of the cycle's reasons."""
        known = self.known
        fresh = self.fresh
        for job_id in fresh:  # new, requeued or released: its stored reason is "" (a start
            known.pop(job_id, None)  # clears it), whatever the book remembers from before
        if len(known) > 2 * len(state.jobs) + 1000:
            for job_id in [j for j in known if j not in state.jobs]:
                del known[job_id]
        others = (result.others.code.value, result.others.message) if result.others is not None else None
        look = _Look(known, result.now)
        if others != self.others:  # rare (pause, resume, a strict FIFO head's change): every job
            look.compare([(j, r) for j in state.jobs if (r := result.reason_of(JobId(j))) is not None])
        else:
            runs, own = result.reasons.runs()  # the order of the mapping, not unfolded
            for keys, reason in runs:
                look.compare(zip(map(_job_of, keys), repeat(reason)))
            look.compare(own.items())
            if result.others is not None:
                reasons = result.reasons
                look.compare([(j, result.others) for j in fresh if j in state.jobs and j not in reasons])
        self.others = others
        fresh.clear()
        return look.out


_job_of = itemgetter(-1)
_SKIP, _REFRESH, _WRITE = 0, 1, 2  # what a look does with a job, by what was written and its reason


class _Look:
    """One look's comparisons: what it writes, and its budget of time-only rewrites.

    What to do with a job depends only on what was written for it and its reason now, and the
    jobs of a run share both: one reason, and (when written by one look) one `Written` tuple. So
    the look compares a written tuple with a reason once per run of jobs that share them, and
    each job costs a dict lookup and two identity checks: a look at 100,000 waiting jobs whose
    reasons did not change, or changed in their times only, costs about 10 ms, not a comparison
    of sentences per job (issue 15)."""

    __slots__ = ("entries", "known", "now", "out", "refreshes", "stale")

    def __init__(self, known: dict[str, Written], now: float) -> None:
        self.known = known
        self.now = now
        self.stale = now - REFRESH
        self.refreshes = REFRESH_PER_LOOK
        self.entries: dict[tuple[str, str, float | None], Written] = {}  # what this look writes
        self.out: list[ReasonChange] = []

    def compare(self, pairs: Iterable[tuple[str, Reason]]) -> None:
        """Write what changed of these jobs' reasons."""
        known, out = self.known, self.out
        refreshes = self.refreshes
        last_reason: object = _job_of  # neither a reason nor None
        last_seen: object = _job_of
        entry: Written = ("", "", None, 0.0, None)
        act = _WRITE
        for job_id, reason in pairs:
            seen = known.get(job_id)
            if reason is not last_reason:
                last_reason, last_seen = reason, _job_of
                entry = self._entry(reason)
            if seen is not last_seen:
                last_seen = seen
                act = self._act(seen, entry)
            if act == _SKIP:
                continue
            if act == _REFRESH:  # only a time moved: at most `REFRESH_PER_LOOK` such rewrites
                if refreshes <= 0:
                    continue
                refreshes -= 1
            known[job_id] = entry
            out.append(
                ReasonChange(job_id, entry[0], entry[1], entry[2], seen is None or seen[0] != entry[0])
            )
        self.refreshes = refreshes

    def _entry(self, reason: Reason) -> Written:
        """What this look writes for `reason` (one tuple for every job it writes it for)."""
        key = (reason.code.value, reason.message, reason.at)
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = (*key, self.now, _TIMES.sub("", reason.message))
        return entry

    def _act(self, seen: Written | None, entry: Written) -> int:
        """What to do with a job that has `seen` written and `entry` to write."""
        if seen is None:
            return _WRITE
        code, message, at, _, fig = entry
        if seen[1] == message and seen[2] == at and seen[0] == code:
            return _SKIP
        old = seen[4] if seen[4] is not None else _TIMES.sub("", seen[1])
        current = seen[2] is None or seen[2] >= self.now  # the stored time has not passed
        if seen[0] == code and current and old == fig:  # only a time moved
            return _SKIP if seen[3] > self.stale else _REFRESH  # written less than REFRESH s ago
        return _WRITE
