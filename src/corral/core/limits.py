"""A queue's pending jobs per family in blocks of their order, each block with its smallest time
limit: the first job from a position on whose time limit a backfill window can hold is found by
passing over whole blocks whose smallest limit ends too late (`FamilyLimits.first`), instead of
visiting each job (`repeats.Walk._scan`: on 5,000 nodes a family of one-GPU jobs that differ by
their time limits holds thousands, and a walk asks several times a cycle).

Kept up to date as jobs enter and leave their queue (`QueueState.enter`, `leave_family`), like
`jobs.FamilyParts`: a family is cut into blocks when its first job enters, and every family
again when the order changes (`cut`; not in the first cycle that scans it: on a long backlog, a
cycle that starts jobs after quiet ones). A block holds `BLOCK` to `2 * BLOCK` keys (split when
larger; an emptied block goes): a lookup costs O(blocks passed + the jobs of the blocks looked
into), an entry or a leave O(BLOCK).

What `first` answers is what visiting each job from the position on answers: a job whose limit
`now + limit <= end` holds and that `fits` accepts. A block is passed over only when `now + its
smallest limit > end`: IEEE addition is monotonic, so then no job of the block fits either (a job
without a time limit counts as an infinite limit here, and `fits` turns it down where the window
is infinite too).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable

from corral.core.model import INFINITY, JobId

Key = tuple[object, ...]
BLOCK = 64  # the fewest keys a block holds after a split (a family's last block may hold fewer)


def limit_of(limit: float | None) -> float:
    """A time limit as the index keeps it (none: infinite)."""
    return INFINITY if limit is None else limit


class Blocks:
    """One family's keys, in order, cut into blocks; each block's keys, their limits and the
    smallest of them."""

    __slots__ = ("firsts", "keys", "limits", "mins", "size")

    def __init__(self, keys: list[Key], limits: list[float], size: int) -> None:
        self.size = size
        self.firsts: list[Key] = []  # each block's first key (bisected to find a key's block)
        self.keys: list[list[Key]] = []
        self.limits: list[list[float]] = []
        self.mins: list[float] = []
        for lo in range(0, len(keys), size):
            self._append(keys[lo : lo + size], limits[lo : lo + size])

    def _append(self, keys: list[Key], limits: list[float]) -> None:
        self.firsts.append(keys[0])
        self.keys.append(keys)
        self.limits.append(limits)
        self.mins.append(min(limits))

    def add(self, key: Key, limit: float) -> None:
        if not self.keys:
            self._append([key], [limit])
            return
        b = max(0, bisect_right(self.firsts, key) - 1)
        keys, limits = self.keys[b], self.limits[b]
        i = bisect_left(keys, key)
        keys.insert(i, key)
        limits.insert(i, limit)
        if i == 0:
            self.firsts[b] = key
        if limit < self.mins[b]:
            self.mins[b] = limit
        if len(keys) > 2 * self.size:  # split in two halves
            half = len(keys) // 2
            self.keys[b], self.limits[b] = keys[:half], limits[:half]
            self.mins[b] = min(self.limits[b])
            self.firsts.insert(b + 1, keys[half])
            self.keys.insert(b + 1, keys[half:])
            self.limits.insert(b + 1, limits[half:])
            self.mins.insert(b + 1, min(limits[half:]))

    def remove(self, key: Key) -> None:
        b = bisect_right(self.firsts, key) - 1
        keys, limits = self.keys[b], self.limits[b]
        i = bisect_left(keys, key)
        del keys[i]
        limit = limits.pop(i)
        if not keys:
            del self.firsts[b], self.keys[b], self.limits[b], self.mins[b]
            return
        if i == 0:
            self.firsts[b] = keys[0]
        if limit == self.mins[b]:
            self.mins[b] = min(limits)

    def first(
        self, at: Key, now: float, end: float, down: set[float], fits: Callable[[Key], bool]
    ) -> Key | None:
        """The first key from `at` on (`at` included) whose limit ends by `end`, is not in `down`
        and that `fits` accepts (None: none)."""
        firsts = self.firsts
        b = max(0, bisect_right(firsts, at) - 1)
        if b >= len(firsts):
            return None
        i = bisect_left(self.keys[b], at)
        mins = self.mins
        while b < len(firsts):
            if now + mins[b] <= end:
                keys, limits = self.keys[b], self.limits[b]
                for j in range(i, len(keys)):
                    limit = limits[j]
                    if now + limit <= end and limit not in down and fits(keys[j]):
                        return keys[j]
            b += 1
            i = 0
        return None


class FamilyLimits:
    """A queue's families' keys in blocks (`Blocks`), built when first asked about (see the
    module)."""

    __slots__ = ("families",)

    def __init__(self) -> None:
        self.families: dict[int, Blocks] = {}

    def cut(self, by_family: dict[int, list[Key]], limit: Callable[[JobId], float | None]) -> None:
        """The order keys changed: cut every family again (`by_family`: each family's sorted keys),
        now rather than in the first cycle that scans it."""
        self.families = {}
        for family, keys in by_family.items():
            self.of(family, keys, limit)

    def add(self, family: int, key: Key, limit: float | None, new: bool) -> None:
        """`key` entered `family` (`new`: as its only job; a family that has no blocks otherwise
        is cut when first asked about)."""
        blocks = self.families.get(family)
        if blocks is not None:
            blocks.add(key, limit_of(limit))
        elif new:
            self.families[family] = Blocks([key], [limit_of(limit)], BLOCK)

    def remove(self, family: int, key: Key) -> None:
        blocks = self.families.get(family)
        if blocks is not None:
            blocks.remove(key)
            if not blocks.keys:
                del self.families[family]

    def of(self, family: int, keys: list[Key], limit: Callable[[JobId], float | None]) -> Blocks:
        """The family's blocks (`keys`: its whole order, sorted; `limit`: a job's time limit)."""
        blocks = self.families.get(family)
        if blocks is None:
            limits = [limit_of(limit(key[-1])) for key in keys]  # type: ignore[arg-type]
            blocks = self.families[family] = Blocks(keys, limits, BLOCK)
        return blocks

    def first(
        self,
        family: int,
        keys: list[Key],
        limit: Callable[[JobId], float | None],
        pos: int,
        now: float,
        end: float,
        down: set[float],
        fits: Callable[[Key], bool],
    ) -> int:
        """The index in `keys` of the first job from `pos` on whose time limit ends by `end`
        (`now + limit <= end`), is not in `down` and that `fits` accepts (`len(keys)`: none).
        `down`: limits that `fits` is known to turn down (it may add to them, as the walk adds
        the limits found blocked in its cycle: a job is then passed by a set lookup)."""
        if pos >= len(keys):
            return len(keys)
        found = self.of(family, keys, limit).first(keys[pos], now, end, down, fits)
        return len(keys) if found is None else bisect_left(keys, found, pos)
