"""`tiresias`' answers about a group's candidates, remembered while nothing they read changed.

A walk asks, for every waiting job of a queue and class, whether a candidate of that group has
a worse level and little work to lose (`Tiresias._worse_fresh`), which of them it may take
(`Tiresias.narrow`) and when the first protected one becomes such a candidate
(`Tiresias.protection_end`). The answers read only the group, a service floor (the preemptor's
level), `now` and the group's attempts in `Occupancy`: jobs of one queue, class and level get
the same ones. `FreshMemo` keeps them for one `Occupancy` at one `now` while its `changes`
counter (bumped by every attempt that arrives, settles, stops or checkpoints) is unchanged.
"""

from __future__ import annotations

from corral.core.jobs import RunningAttempt
from corral.core.occupancy import Group, Occupancy

REMEMBER = True  # False: every answer computed anew (tests compare: `test_tiresias_memo`)


class FreshMemo:
    """Answers per (group, floor) for one occupancy at one `now` and `changes`."""

    __slots__ = ("changes", "ends", "fresh", "now", "occupancy", "worse")

    def __init__(self) -> None:
        self.occupancy: Occupancy | None = None
        self.now = 0.0
        self.changes = -1
        self.worse: dict[tuple[Group, float], bool] = {}
        self.fresh: dict[tuple[Group, float], list[RunningAttempt]] = {}
        self.ends: dict[Group, float | None] = {}

    def current(self, occupancy: Occupancy, now: float) -> FreshMemo:
        """Itself, emptied first unless it holds answers for this occupancy, `now` and changes."""
        if self.occupancy is not occupancy or self.now != now or self.changes != occupancy.changes:
            self.occupancy = occupancy
            self.now = now
            self.changes = occupancy.changes
            self.worse = {}
            self.fresh = {}
            self.ends = {}
        return self
