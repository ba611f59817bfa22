"""How often the scheduler process works: a cycle at most every `MIN_CYCLE_INTERVAL`, and no
sooner than it took again (`CYCLE_DUTY`, capped at `MAX_CYCLE_PAUSE`), so a flood of rings is
gathered into one cycle; waiting jobs' reasons looked at and written at most every `REASON_FLUSH`
seconds, after the decisions (which never wait for them; a thread writes them, server/reason_writer.py),
so that under a flood of submissions or a long backlog SQLite's one write lock stays the API's
and the decisions'."""

from __future__ import annotations

import time

# Under a flood of changes, cycles are gathered: the next starts no sooner than MIN_CYCLE_INTERVAL
# after the last one began, nor sooner than CYCLE_DUTY times the last step (cycle and writes)
# took after it ended, but a change waits at most MAX_CYCLE_PAUSE for that: a backlog of short
# steps costs the scheduler at most half a core (the API keeps the rest and SQLite's write lock
# between steps), and an exit or a submission reaches a cycle within MAX_CYCLE_PAUSE plus the
# step under way. An idle cluster's cycle takes well under a millisecond.
MIN_CYCLE_INTERVAL = 0.02
CYCLE_DUTY = 1.0
MAX_CYCLE_PAUSE = 0.25
REASON_FLUSH = 1.0  # seconds between looks at waiting jobs' reasons (server/reasons.py)
# and no sooner than REASON_DUTY times the last look took: a look at 100,000 waiting jobs takes a
# fraction of a second (unfolding the cycle's reasons, comparing them), and holds up the next cycle
REASON_DUTY = 10.0
REASON_SPACING_MAX = 30.0  # seconds: the longest wait the duty may impose


def next_cycle_after(began: float, took: float) -> float:
    """When the next cycle may start, after a step that began at `began` and took `took` s."""
    return began + max(MIN_CYCLE_INTERVAL, took + min(took * CYCLE_DUTY, MAX_CYCLE_PAUSE))


class Pacing:
    """The scheduler's clock of work, on the monotonic clock."""

    def __init__(self, reason_flush: float = REASON_FLUSH) -> None:
        self.next_cycle = 0.0
        self.reasons_due = 0.0
        self.reason_flush = reason_flush
        self.reasons_waiting = False  # a cycle's reasons were not written yet

    def pause_left(self) -> float:
        """Seconds to wait before the next cycle (<= 0: none)."""
        return self.next_cycle - time.monotonic()

    def cycled(self, began: float, took: float) -> None:
        self.next_cycle = next_cycle_after(began, took)

    def wrote(self, began: float) -> None:
        """A step's writes count toward the cycle's duty too."""
        self.next_cycle = max(self.next_cycle, next_cycle_after(began, time.monotonic() - began))

    def write_reasons(self) -> bool:
        """Whether this cycle's reasons are looked at (and written) now: once REASON_FLUSH has
        passed since the last look; else they wait (`reasons_waiting`), decisions or not."""
        self.reasons_waiting = time.monotonic() < self.reasons_due
        return not self.reasons_waiting

    def reasons_written(self, took: float) -> None:
        """A look that took `took` s just ended (`reason_flush` 0: the next step looks again, as
        tests want)."""
        spacing = min(took * REASON_DUTY, REASON_SPACING_MAX) if self.reason_flush > 0 else 0.0
        self.reasons_due = time.monotonic() + max(self.reason_flush, spacing)

    def no_cycle(self) -> None:
        self.reasons_waiting = False

    def reasons_wait(self) -> float | None:
        """Seconds until waiting reasons are due (None: none wait)."""
        return self.reasons_due - time.monotonic() if self.reasons_waiting else None

    def reasons_overdue(self) -> bool:
        return self.reasons_waiting and time.monotonic() >= self.reasons_due
