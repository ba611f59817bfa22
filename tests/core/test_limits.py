"""`limits.FamilyLimits` finds what visiting each job of a family in order finds: the first job
from a position on whose time limit ends by a backfill window (`now + limit <= end`) and that is
not turned down (its (shape, time limit) already blocked, in `repeats.Walk._scan`).

Blocks kept up to date through random entries and leaves are compared with blocks cut from
scratch, and every lookup (each position, windows at, between and around the limits, random sets
of turned-down jobs and of limits known to be turned down) with the linear scan
`repeats.Walk._scan` did before the index. Small blocks, so that families span many and blocks
split and empty.
"""

from __future__ import annotations

import random
from bisect import bisect_left

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core import limits
from corral.core.jobs import PendingJob
from corral.core.limits import Blocks, FamilyLimits, limit_of
from corral.core.model import JobId, JobSpec, NodeName, NodeSpec, QueueName, QueueSpec
from corral.core.state import ClusterState

Key = tuple[object, ...]


def linear(
    keys: list[Key],
    limit: dict[object, float | None],
    pos: int,
    now: float,
    end: float,
    down: set[object],
    down_limits: set[float],
) -> int:
    """The scan before the index: each job from `pos` on, in order."""
    i = pos
    while i < len(keys):
        lim = limit[keys[i][-1]]
        if lim is not None and now + lim <= end and keys[i][-1] not in down and lim not in down_limits:
            break
        i += 1
    return i


def check_blocks(blocks: Blocks, keys: list[Key], limit: dict[object, float | None]) -> None:
    """The blocks hold `keys` in order, with the right firsts and smallest limits, none empty."""
    assert [k for block in blocks.keys for k in block] == keys
    assert all(block for block in blocks.keys)
    assert blocks.firsts == [block[0] for block in blocks.keys]
    for block, lims, least in zip(blocks.keys, blocks.limits, blocks.mins, strict=True):
        assert lims == [limit_of(limit[k[-1]]) for k in block]
        assert least == min(lims)
    assert all(len(block) <= 2 * blocks.size for block in blocks.keys)


def check_lookups(
    rng: random.Random, index: FamilyLimits, family: int, keys: list[Key], limit: dict[object, float | None]
) -> None:
    values = sorted({lim for lim in limit.values() if lim is not None} | {0.0})
    now = rng.choice([0.0, 0.1, 1234.5678, 1e9 / 7])
    ends = [now + v + d for v in values for d in (-0.5, 0.0, 0.5)] + [now - 1.0, float("inf")]
    for end in rng.sample(ends, min(len(ends), 6)):
        for down in (set(), {k[-1] for k in keys if rng.random() < 0.5}, {k[-1] for k in keys}):
            down_limits = {v for v in values if rng.random() < 0.3}
            for pos in range(len(keys) + 1):
                expected = linear(keys, limit, pos, now, end, down, down_limits)
                got = index.first(
                    family, keys, limit.__getitem__, pos, now, end, set(down_limits),
                    lambda key, down=down: limit[key[-1]] is not None and key[-1] not in down,  # type: ignore[misc]
                )  # fmt: skip
                assert got == expected, (pos, end, down)


LIMITS = st.one_of(st.none(), st.sampled_from([60.0, 0.1, 0.2, 0.30000000000000004]), st.floats(0.0, 5e4))


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.integers(1, 4),
    first=st.lists(LIMITS, max_size=40),
    changes=st.lists(st.tuples(st.booleans(), LIMITS, st.integers(0, 10**6)), max_size=40),
)
def test_blocks_kept_up_to_date_find_what_a_linear_scan_finds(
    seed: int, size: int, first: list[float | None], changes: list[tuple[bool, float | None, int]]
) -> None:
    rng = random.Random(seed)
    family = 3
    limit: dict[object, float | None] = {}
    keys: list[Key] = []
    for n, lim in enumerate(first):
        key = (rng.randrange(1000), f"j{n}")
        limit[key[-1]] = lim
        keys.append(key)
    keys.sort()
    index = FamilyLimits()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(limits, "BLOCK", size)
        if keys:
            index.of(family, keys, limit.__getitem__)
    for step, (enter, lim, where) in enumerate(changes):
        if enter or not keys:
            key = (where % 1000, f"k{step}")
            limit[key[-1]] = lim
            keys.insert(bisect_left(keys, key), key)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(limits, "BLOCK", size)
                index.add(family, key, lim, len(keys) == 1)  # (a family's first job cuts its blocks)
        else:
            key = keys.pop(where % len(keys))
            index.remove(family, key)
        if keys:
            if family not in index.families:
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(limits, "BLOCK", size)
                    index.of(family, keys, limit.__getitem__)
            check_blocks(index.families[family], keys, limit)
            check_lookups(rng, index, family, keys, limit)
        else:
            assert family not in index.families


def test_a_block_whose_smallest_limit_ends_too_late_is_passed_without_visiting_its_jobs() -> None:
    """The point of the index: only the block that can hold a job is looked into."""
    keys: list[Key] = [(i, f"j{i}") for i in range(1000)]
    limit: dict[object, float | None] = {k[-1]: 7200.0 for k in keys}
    limit["j900"] = 600.0
    seen: list[Key] = []

    def fits(key: Key) -> bool:
        seen.append(key)
        return True

    index = FamilyLimits()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(limits, "BLOCK", 10)
        assert index.first(0, keys, limit.__getitem__, 5, 100.0, 100.0 + 3600.0, set(), fits) == 900
    assert seen == [(900, "j900")]


def _by_seq_mod_3(job: PendingJob) -> tuple[object, ...]:
    return (job.spec.seq % 3, job.spec.seq, job.spec.id)


def _state() -> ClusterState:
    nodes = [NodeSpec(NodeName(f"n{i}"), 8, "H100-80GB", labels={"leaf": "l0"}) for i in range(2)]
    queues = [QueueSpec(QueueName("a"), quota=8), QueueSpec(QueueName("b"), quota=8)]
    return ClusterState.build(("leaf",), nodes, queues)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_the_queues_blocks_follow_submissions_starts_and_removals(seed: int) -> None:
    """Through a real `ClusterState`: after each submission, start, removal, requeue or change of
    order, every family's blocks hold its order, and lookups match the linear scan."""
    rng = random.Random(seed)
    state = _state()
    seq, now = 0, 0.0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(limits, "BLOCK", rng.randint(1, 3))
        for _ in range(rng.randint(5, 80)):
            now += 1.0
            action = rng.random()
            pending = sorted(state.jobs)
            if action < 0.55 or not pending:
                seq += 1
                spec = JobSpec(
                    JobId(f"j{seq}"), QueueName(rng.choice("ab")), gpus_per_replica=rng.choice((1, 2)),
                    submit_time=float(rng.randint(0, 5)), seq=seq,
                    time_limit=rng.choice((None, 60.0, 600.0, 3600.0, float(rng.randint(1, 9999)))),
                )  # fmt: skip
                state.submit(spec)
            elif action < 0.6:  # another order: every family cut again
                state.set_order(None if state.key_fn is not None else _by_seq_mod_3)
            elif action < 0.8:
                state.remove_pending(JobId(rng.choice(pending)))
            elif state.running and action < 0.9:
                state.end(rng.choice(sorted(state.running)), True, now)  # requeued: enters again
            else:
                job = state.jobs[JobId(rng.choice(pending))]
                queue = state.queues[job.spec.queue]
                free = [n for n in range(len(state.alloc)) if state.index.avail[n] >= job.spec.gpus]
                if free:
                    bits = [g for g in range(8) if not state.alloc[free[0]] >> g & 1][: job.spec.gpus]
                    state.start(job, [(free[0], sum(1 << g for g in bits))], now)
                    del queue.pending[job.spec.id]
                    del state.jobs[job.spec.id]
                    state.unqueue(queue, job)
                    del queue.pending_keys[bisect_left(queue.pending_keys, job.key)]
            for queue in state.queues.values():
                assert set(queue.limits.families) <= set(queue.by_family)
                for family, keys in queue.by_family.items():
                    assert family in queue.limits.families  # cut when its first job entered
                    limit = {k[-1]: state.jobs[k[-1]].spec.time_limit for k in keys}  # type: ignore[index]
                    queue.limits.of(family, keys, limit.__getitem__)
                    check_blocks(queue.limits.families[family], keys, limit)
                    check_lookups(rng, queue.limits, family, keys, limit)
