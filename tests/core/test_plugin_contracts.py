"""The contracts of the cycle's plugins (`core/plugins.py`): the victims plugin's
(`VictimFilter`) and the admission plugins' (`Admit`), checked for every policy that preempts,
on random clusters of three queues and three classes where queues borrow, attempts checkpoint
or not, some are protected by their class's minimum run time, and preemptors differ by queue,
class, size, attained service and age. Victim selection trusts these promises to skip work
(groups it need not read, narrowed candidates, rankings and searches shared by preemptors of
one key), so a plugin that breaks one makes the cycle miss victims it may take:

- `group_eligible` is an upper bound of `eligible` for every attempt of the group;
- `narrow` (where a plugin has it) keeps every attempt of the group that `eligible` allows;
- `rank` is the eligible attempts in `order_key`'s order (where a plugin has `order_key`);
- `service_floor`: every eligible victim has at least that much attained service;
- preemptors with equal `preemptor_key`s get the same answers; where `groups_by_family`,
  `group_eligible` reads only what a family shares, else also `family_part`;
- `fresh_groups` names every group where a checkpoint can turn an attempt into a victim (the
  cycle is due after a checkpoint only there);
- no admission plugin reads the time limit (a family's jobs are told one admission answer).
Each check fails on a deliberate break of the plugins (e.g. `tiresias.narrow` keeping only fresh
candidates of a lower class of its own queue, a bug this caught; `las`' inline `rank` skipping the
minimum run time; a limit reading the time limit; `fresh_groups` without the reclaim groups).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core.jobs import PendingJob
from corral.core.model import JobId, NodeName, QueueName, QueueSpec
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from tests.helpers import job, nodes, queues, state_of

POLICIES: dict[str, Any] = {
    "default": None,
    "las": None,
    "tiresias": None,
    "tiresias_impatient": {"tiresias": {"patience": 0.0, "thresholds": [1500.0, 15_000.0]}},
    "tiresias_levels": {"tiresias": {"thresholds": [1500.0, 15_000.0], "patience": 1000.0}},
    "estimated": None,
}
CLASSES = ["low", "normal", "high"]


def start(
    state: ClusterState,
    job_id: str,
    node: int,
    gpus: range,
    *,
    queue: str,
    priority: str,
    now: float,
    attained: float,
) -> None:
    """A running attempt on exactly these GPUs whose job had `attained` service before it
    (`tests.helpers.occupy`, with earlier attempts' service)."""
    spec = job(job_id, queue, gpus=len(gpus), priority=priority, submit=now)
    pending = state.submit(spec, attained=attained)
    state.unchecked.remove(pending)
    state.remove_pending(spec.id)
    mask = sum(1 << g for g in gpus)
    state.start(pending, [(state.node_ids[NodeName(f"n{node:02d}")], mask)], now)
    state.plan.commit()


def random_cluster(seed: int) -> tuple[ClusterState, list[PendingJob], float]:
    rng = random.Random(seed)
    state = state_of(nodes(3, 8), queues(("a", 8), QueueSpec(QueueName("b"), quota=8, limit=12), ("c", 0)))
    for n in range(3):
        gpu = 0
        while gpu < 8:
            size = min(rng.choice([1, 1, 2, 4]), 8 - gpu)
            if rng.random() < 0.75:
                name = f"r{n}-{gpu}"
                start(
                    state, name, n, range(gpu, gpu + size), queue=rng.choice("abc"),
                    priority=rng.choice(CLASSES), now=rng.choice([0.0, 500.0, 1500.0, 1950.0]),
                    attained=rng.choice([0.0, 0.0, 4000.0, 50_000.0]),
                )  # fmt: skip
                if rng.random() < 0.4:
                    state.record_checkpoint(JobId(name), rng.choice([1600.0, 1900.0, 1990.0]))
            gpu += size
    pending = [
        state.submit(
            job(
                f"p{i}",
                rng.choice("abc"),
                gpus=rng.choice([1, 2, 4]),
                priority=rng.choice(CLASSES),
                submit=rng.choice([0.0, 1000.0, 1500.0]),
            ),
            attained=rng.choice([0.0, 2000.0, 5000.0, 20_000.0, 100_000.0]),
        )
        for i in range(16)
    ]
    now = 2000.0
    state.occupancy.settle(now)
    return state, pending, now


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), name=st.sampled_from(sorted(POLICIES)))
def test_every_victims_plugin_keeps_its_contract(seed: int, name: str) -> None:
    base = "tiresias" if name.startswith("tiresias") else name
    plugin: Any = load_policy(base, POLICIES[name]).victims
    assert plugin is not None, name
    state, pending, now = random_cluster(seed)
    attempts = list(state.running.values())
    groups = sorted({(a.spec.queue, a.spec.priority) for a in attempts})
    answers: dict[Any, Any] = {}
    by_family: dict[Any, list[bool]] = {}
    for p in pending:
        eligible = {a.spec.id for a in attempts if plugin.eligible(p, a, state, now)}
        group_ok = {g: plugin.group_eligible(p, g[0], g[1], state, now) for g in groups}
        for a in attempts:
            if a.spec.id in eligible:
                assert group_ok[(a.spec.queue, a.spec.priority)], (p.spec.id, a.spec.id)
        narrow = getattr(plugin, "narrow", None)
        narrowed: list[Any] = []
        if narrow is not None:
            for g in groups:
                kept = narrow(p, g, state, now)
                ids = None if kept is None else sorted(a.spec.id for a in kept)
                narrowed.append(ids)
                if ids is not None:
                    in_group = {a.spec.id for a in attempts if (a.spec.queue, a.spec.priority) == g}
                    assert eligible & in_group <= set(ids), (p.spec.id, g)
        ranked = [a.spec.id for a in plugin.rank(p, attempts, state, now)]
        assert sorted(ranked) == sorted(eligible), p.spec.id
        order_key = getattr(plugin, "order_key", None)
        if order_key is not None:
            chosen = [a for a in attempts if a.spec.id in eligible]
            expected = [a.spec.id for a in sorted(chosen, key=lambda a: order_key(a, state, now))]
            assert ranked == expected, p.spec.id
        floor = plugin.service_floor(p)
        if floor is not None:
            for a in attempts:
                if a.spec.id in eligible:
                    assert a.job.attained + a.spec.gpus * (now - a.start) >= floor
        key = plugin.preemptor_key(p, now)
        if key is not None:
            chosen = [a for a in attempts if a.spec.id in eligible]
            sets = [chosen[:k] for k in range(1, len(chosen) + 1)] + [chosen[1::2]]
            permits = [plugin.permit(p, victims, state, now) for victims in sets]
            seen = (sorted(eligible), group_ok, narrowed, ranked, permits)
            assert answers.setdefault(key, seen) == seen, (name, key)
        spec = p.spec
        family: tuple[Any, ...] = (spec.queue, spec.priority, p.shape, spec.preemptible)
        if not plugin.groups_by_family:
            family += (plugin.family_part(p),)
        told = [group_ok[g] for g in groups]
        assert by_family.setdefault(family, told) == told, (name, family)


def test_the_random_clusters_reach_every_promise() -> None:
    """The histories above are not vacuous: across seeds, each plugin finds eligible victims,
    groups it refuses, and (`tiresias`) groups it narrows."""
    found: dict[str, set[str]] = {}
    for seed in range(40):
        state, pending, now = random_cluster(seed)
        attempts = list(state.running.values())
        for name in ("default", "las", "tiresias_levels"):
            base = "tiresias" if name.startswith("tiresias") else name
            plugin: Any = load_policy(base, POLICIES[name]).victims
            seen = found.setdefault(name, set())
            for p in pending:
                if any(plugin.eligible(p, a, state, now) for a in attempts):
                    seen.add("eligible")
                for a in attempts:
                    if not plugin.group_eligible(p, a.spec.queue, a.spec.priority, state, now):
                        seen.add("refused")
                    narrow = getattr(plugin, "narrow", None)
                    if (
                        narrow is not None
                        and narrow(p, (a.spec.queue, a.spec.priority), state, now) is not None
                    ):
                        seen.add("narrowed")
    assert found["default"] >= {"eligible", "refused"}
    assert found["las"] >= {"eligible", "refused"}
    assert found["tiresias_levels"] >= {"eligible", "refused", "narrowed"}


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), name=st.sampled_from(sorted(POLICIES)))
def test_a_checkpoint_makes_victims_only_in_the_groups_fresh_groups_names(seed: int, name: str) -> None:
    """`fresh_groups`: the cycle is due after a checkpoint only in the groups it names, so an
    attempt that a checkpoint turns into a victim of a waiting job must be in one of them."""
    base = "tiresias" if name.startswith("tiresias") else name
    plugin: Any = load_policy(base, POLICIES[name]).victims
    before, pending, now = random_cluster(seed)
    after, pending_after, _ = random_cluster(seed)
    for a in list(after.running.values()):
        after.record_checkpoint(a.spec.id, now)
    after.occupancy.settle(now)
    for p, twin in zip(pending, pending_after, strict=True):
        named = set(plugin.fresh_groups(p, before, now))
        was = {a.spec.id for a in before.running.values() if plugin.eligible(p, a, before, now)}
        for a in after.running.values():
            if a.spec.id not in was and plugin.eligible(twin, a, after, now):
                assert (a.spec.queue, a.spec.priority) in named, (name, p.spec.id, a.spec.id)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), name=st.sampled_from(sorted(POLICIES)))
def test_admission_reads_no_time_limit(seed: int, name: str) -> None:
    """`Admit`: a cycle tells the jobs of a family (equal but for their time limits) one
    admission answer, so no admission plugin may read the time limit."""
    base = "tiresias" if name.startswith("tiresias") else name
    profile = load_policy(base, POLICIES[name])
    state, pending, _ = random_cluster(seed)
    for p in pending:
        spec = p.spec
        twins = [
            state.submit(
                job(
                    f"{spec.id}-{limit}",
                    spec.queue,
                    gpus=spec.gpus,
                    priority=spec.priority_class,
                    submit=spec.submit_time,
                    time_limit=limit,
                ),
            )
            for limit in (None, 60.0, 86_400.0)
        ]
        for admit in profile.admits:
            queue = state.queues[spec.queue]
            told = [admit.admit(j, queue, state) for j in [p, *twins]]
            assert all(t == told[0] for t in told), (name, spec.id, told)
