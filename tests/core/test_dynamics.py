"""Multi-cycle behaviour: fair share by weight, priority preemption, backfill, reclaim without ping-pong."""

from __future__ import annotations

from corral.core.decisions import Why
from corral.core.model import JobId, QueueName, QueueSpec
from corral.policies.registry import load_policy
from tests.driver import Driver
from tests.helpers import check_no_double_allocation, job, nodes, occupy, run, started_on, state_of


def test_a_flooding_team_yields_to_another_in_proportion_to_weights() -> None:
    qs = [QueueSpec(QueueName("a"), weight=1.0), QueueSpec(QueueName("b"), weight=3.0)]
    state = state_of(nodes(2, 8), qs)
    d = Driver(state, load_policy("default", {"fair_share": {"half_life": None}}))
    for i in range(200):
        d.submit(job(f"a{i}", "a", gpus=1, submit=0.0), duration=100.0 + i % 7)
    d.run(until=0.0)
    assert sum(1 for _, j, _ in d.starts if j.startswith("a")) == 16  # a took the whole idle cluster
    for i in range(200):
        d.submit(job(f"b{i}", "b", gpus=1, submit=1.0), duration=100.0 + i % 5, at=1.0)
    samples = []
    for t in range(300, 1500, 50):
        d.run(until=float(t))
        samples.append((state.queues[QueueName("a")].alloc_gpus, state.queues[QueueName("b")].alloc_gpus))
    a_avg = sum(a for a, _ in samples) / len(samples)
    b_avg = sum(b for _, b in samples) / len(samples)
    assert a_avg + b_avg == 16
    assert abs(b_avg / a_avg - 3.0) < 0.35, samples  # weights 1:3 -> 4 and 12 GPUs
    assert not d.preemptions  # neither is above a quota it could reclaim: no preemption, only freed GPUs


def test_urgent_preempts_the_low_priority_job_not_the_higher_one() -> None:
    state = state_of(nodes(2, 8))
    occupy(state, "low", "n00", range(8), priority="low", now=0.0)
    occupy(state, "high", "n01", range(8), priority="high", now=0.0)
    state.submit(job("urgent", gpus=8, priority="urgent", submit=1000.0))
    result = run(state, 1000.0)
    assert [(p.job, p.by) for p in result.preemptions] == [("low", "urgent")]
    assert result.nominations[0].victims == ("low",)
    assert {r.node for r in result.nominations[0].placement} == {"n00"}
    assert result.reasons["urgent"].code is Why.NOMINATED
    # nobody else gets the nominated GPUs while they are being freed
    state.submit(job("sneaky", gpus=8, priority="normal", submit=1001.0))
    state.end("low", requeue=True, now=1010.0)  # type: ignore[arg-type]
    result = run(state, 1010.0)
    assert started_on(result) == {"urgent": ["n00"]}
    assert "sneaky" not in started_on(result)


def test_no_preemption_inside_min_runtime_or_of_non_preemptible_or_equal_class() -> None:
    state = state_of(nodes(3, 8))
    occupy(state, "young", "n00", range(8), priority="low", now=900.0)  # min_runtime of low is 10 minutes
    pending = state.submit(job("fixed", gpus=8, priority="low", preemptible=False))
    state.unchecked.remove(pending)
    state.remove_pending(pending.spec.id)
    state.start(pending, [(1, 0xFF)], 0.0)
    state.plan.commit()
    occupy(state, "peer", "n02", range(8), priority="high", now=0.0)
    state.submit(job("wants", gpus=8, priority="high", submit=1000.0))
    result = run(state, 1000.0)
    assert not result.preemptions
    assert result.reasons["wants"].code in (Why.CAPACITY, Why.RESERVED)


def test_backfill_starts_a_short_job_in_the_gap_and_never_delays_the_reserved_gang() -> None:
    state = state_of(nodes(2, 8))
    d = Driver(state, load_policy("default"))
    d.submit(job("running", gpus=8, time_limit=1000.0), duration=1000.0)
    d.run(until=0.0)
    d.submit(job("gang", gpus=8, replicas=2, time_limit=5000.0, submit=10.0), duration=500.0, at=10.0)
    d.submit(job("short", gpus=4, time_limit=400.0, submit=11.0), duration=300.0, at=11.0)
    d.submit(job("long", gpus=4, time_limit=2000.0, submit=12.0), duration=300.0, at=12.0)
    d.submit(job("unlimited", gpus=1, submit=13.0), duration=10.0, at=13.0)
    d.run(until=20.0)
    started = {j: t for t, j, _ in d.starts}
    assert started["short"] == 11.0  # ends (by its limit) before the gang's reservation
    assert "long" not in started and "unlimited" not in started
    last = d.results[-1]
    # held back so as not to delay the gang: the reason says so, with the reservation's time
    long, unlimited = last.reasons["long"], last.reasons["unlimited"]
    assert (long.code, long.at) == (Why.BEHIND_RESERVATION, 1000.0)
    assert long.message == (
        "needs 4 GPUs; 4 free GPUs are held for gang's reservation at t=1000s, and it would run until "
        "t=2013s: starting it would delay that reservation"
    )
    assert unlimited.code is Why.BEHIND_RESERVATION and "and it has no time limit" in unlimited.message
    d.run(until=5000.0)
    started = {j: t for t, j, _ in d.starts}
    assert started["gang"] == 1000.0  # exactly when the running job's time limit frees its GPUs
    assert started["long"] >= 1500.0 and started["unlimited"] >= 1500.0


def test_reservation_reason_names_the_time() -> None:
    state = state_of(nodes(2, 8))
    occupy(state, "busy", "n00", range(8), time_limit=1840.0)
    state.submit(job("pair", gpus=8, replicas=2, submit=0.0))
    result = run(state, 0.0)
    assert result.reservations[0].start == 1840.0
    # absolute times (seconds from a trace's start here), carried as `at` too, never "t+1840s"
    assert "reserved to start at t=1840s" in result.reasons["pair"].message
    assert result.reasons["pair"].at == 1840.0
    assert result.next_wake == 1840.0  # the cycle is due again when the reservation begins


def test_reasons_name_clock_times_in_the_control_plane() -> None:
    now = 1_790_000_000.0  # Unix time: 2026-09-21 14:13:20 UTC
    state = state_of(nodes(2, 8))
    occupy(state, "busy", "n00", range(8), time_limit=1840.0, now=now)
    state.submit(job("pair", gpus=8, replicas=2, submit=now))
    result = run(state, now)
    assert result.reasons["pair"].message.endswith("reserved to start at 14:44:00 UTC")
    assert result.reasons["pair"].at == now + 1840.0


def test_two_queues_borrow_and_reclaim_without_ping_pong() -> None:
    qs = [QueueSpec(QueueName("a"), quota=8), QueueSpec(QueueName("b"), quota=8)]
    state = state_of(nodes(2, 8), qs)
    d = Driver(state, load_policy("default"))
    for i in range(40):
        d.submit(job(f"a{i}", "a", gpus=1, priority="low"), duration=3000.0)
    d.run(until=0.0)
    assert state.queues[QueueName("a")].alloc_gpus == 16  # a borrows b's idle quota
    for i in range(40):
        d.submit(job(f"b{i}", "b", gpus=1, priority="low", submit=700.0), duration=3000.0, at=700.0)
    d.run(until=20000.0)
    reclaimed = [p for p in d.preemptions if p[2].startswith("b")]
    assert len(reclaimed) == 8  # b takes back exactly its quota, once
    assert all(by.startswith("b") and victim.startswith("a") for _, victim, by in d.preemptions)
    assert len(d.finished) == 80


def _borrowers(surplus: bool) -> Driver:
    """Two queues with small quotas on 16 GPUs; a borrows 14, then b's demand arrives above its quota."""
    qs = [QueueSpec(QueueName("a"), quota=2), QueueSpec(QueueName("b"), quota=2)]
    state = state_of(nodes(2, 8), qs)
    args = {"priority_reclaim": {"surplus": True}} if surplus else None
    d = Driver(state, load_policy("default", args))
    for i in range(14):
        d.submit(job(f"a{i}", "a", gpus=1, priority="low"), duration=3000.0)
    d.run(until=0.0)
    for i in range(10):
        d.submit(job(f"b{i}", "b", gpus=1, priority="low", submit=700.0), duration=3000.0, at=700.0)
    d.run(until=700.0)
    return d


def test_by_default_reclaim_restores_quotas_and_borrowers_above_them_do_not_preempt_each_other() -> None:
    d = _borrowers(surplus=False)
    assert d.state.queues[QueueName("b")].alloc_gpus == 2  # its quota: the 2 idle GPUs
    assert not d.preemptions  # b above its quota waits for a's jobs to end
    d.run(until=3600.0)  # a's jobs end at 3000 s: freed GPUs go to b, the queue with demand
    assert d.state.queues[QueueName("b")].alloc_gpus == 10 and not d.preemptions


def test_surplus_reclaim_rebalances_borrowers_by_preemption_when_enabled() -> None:
    d = _borrowers(surplus=True)
    assert d.preemptions and all(v.startswith("a") and by.startswith("b") for _, v, by in d.preemptions)
    d.run(until=1000.0)
    a, b = (d.state.queues[QueueName(q)].alloc_gpus for q in "ab")
    assert a == b == 8, (a, b)  # equal shares above equal quotas; no further moves


def test_strict_fifo_blocks_everything_behind_the_head_with_a_reason() -> None:
    state = state_of(nodes(1, 8))
    occupy(state, "busy", "n00", range(6))
    state.submit(job("head", gpus=4, submit=1.0))
    state.submit(job("small", gpus=1, submit=2.0))
    result = run(state, 10.0, policy="fifo")
    assert not result.starts  # "small" would fit, but nothing skips the head
    assert result.reason_of("head").code in (Why.CAPACITY, Why.RESERVED)  # type: ignore[union-attr, arg-type]
    assert "waiting behind job head" in result.reason_of("small").message  # type: ignore[union-attr, arg-type]


def test_attempts_that_end_inside_their_minimum_run_time_are_not_kept_alive() -> None:
    """Nothing asks for victims here, so the minimum-run-time heap is never drained by `settle`:
    the attempts that ended must still be let go (a million-job replay once kept every one)."""
    state = state_of(nodes(2, 8))
    d = Driver(state, load_policy("default"))
    for i in range(3000):
        d.submit(job(f"j{i}", gpus=1, submit=float(i)), duration=5.0, at=float(i))
    d.run(until=3100.0)
    assert len(d.starts) == 3000 and not state.running
    assert state.occupancy.waiting() <= 64 + 2 * len(state.running)


def test_a_job_its_queue_limit_keeps_out_preempts_a_lower_class_of_that_queue_only() -> None:
    """Kueue's withinClusterQueue: a high-class job blocked by its own queue's limit preempts a
    lower-class job of that queue (never another queue's, never an equal class), and starts only
    once its victim has stopped, so the queue never holds more than its limit."""
    qs = [QueueSpec(QueueName("a"), quota=8, limit=8), QueueSpec(QueueName("b"), quota=8)]
    state = state_of(nodes(3, 8), qs)
    occupy(state, "a-low", "n00", range(4), queue="a", priority="low", now=0.0)
    occupy(state, "a-normal", "n00", range(4, 8), queue="a", priority="normal", now=0.0)
    occupy(state, "b-low", "n01", range(8), queue="b", priority="low", now=0.0)
    state.submit(job("a-peer", "a", gpus=4, priority="low", submit=1000.0))
    result = run(state, 1000.0)
    assert not result.preemptions and result.reasons["a-peer"].code is Why.LIMIT  # an equal class

    state.submit(job("a-high", "a", gpus=4, priority="high", submit=1001.0))
    result = run(state, 1001.0)
    assert [(p.job, p.by) for p in result.preemptions] == [("a-low", "a-high")]
    assert result.reasons["a-high"].code is Why.NOMINATED and not result.starts
    assert result.reasons["a-peer"].code is Why.LIMIT  # the freed room is a-high's
    result = run(state, 1005.0)  # the victim is still stopping: the free n02 is not enough
    assert not result.starts and result.reasons["a-high"].code is Why.NOMINATED
    state.end(JobId("a-low"), requeue=True, now=1010.0)
    result = run(state, 1010.0)
    assert [s.job for s in result.starts] == ["a-high"]
    assert state.queues[QueueName("a")].alloc_gpus == 8
    check_no_double_allocation(state)


def test_queue_room_and_gpus_may_come_from_different_victims() -> None:
    """The job fits on free GPUs, but its queue is at its limit: the victim frees room, not GPUs;
    the job is nominated to the free GPUs and waits for the victim to stop."""
    qs = [QueueSpec(QueueName("a"), quota=4, limit=4)]
    state = state_of(nodes(2, 8), qs)
    occupy(state, "low", "n00", range(4), queue="a", priority="low", now=0.0)
    state.submit(job("high", "a", gpus=4, priority="high", submit=1000.0))
    result = run(state, 1000.0)
    assert [p.job for p in result.preemptions] == ["low"] and not result.starts
    state.end(JobId("low"), requeue=True, now=1030.0)
    result = run(state, 1030.0)
    assert [s.job for s in result.starts] == ["high"]
    assert state.queues[QueueName("a")].alloc_gpus == 4


def test_no_preemption_for_a_limit_when_the_queue_has_no_lower_class() -> None:
    qs = [QueueSpec(QueueName("a"), quota=8, limit=8)]
    state = state_of(nodes(2, 8), qs)
    occupy(state, "high", "n00", range(8), queue="a", priority="high", now=0.0)
    state.submit(job("urgent", "a", gpus=8, priority="normal", submit=1000.0))
    result = run(state, 1000.0)
    assert not result.preemptions and result.reasons["urgent"].code is Why.LIMIT
