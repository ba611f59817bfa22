"""What the scheduler writes of waiting jobs' reasons (server/reasons.py, issue 15): a new code,
or a sentence whose figures change, at once; a sentence whose only change is a moving time at
most every `REFRESH` seconds per job and `REFRESH_PER_LOOK` per look. The sentences are the
core's own (core/reasons.py), the state a real one."""

from __future__ import annotations

from corral.core import reasons as text
from corral.core.decisions import CycleResult, Reason, Reasons, Why
from corral.core.model import JobId
from corral.core.state import ClusterState
from corral.server.reasons import REFRESH, REFRESH_PER_LOOK, ReasonBook, only_times_moved
from tests.helpers import job, nodes, state_of

T0 = 1_800_000_000.0  # Unix time: sentences name clock times


def waiting(count: int) -> ClusterState:
    state = state_of(nodes(1, 8))
    for i in range(count):
        state.submit(job(f"j{i}", gpus=1))
    return state


def capacity(free: int) -> Reason:
    return Reason(Why.CAPACITY, f"needs 4 GPUs; {free} GPUs are free in the cluster")


def protected(until: float, free: int = 0) -> Reason:
    return text.with_protection(capacity(free), until, T0)


def cycle(now: float, reasons: dict[str, Reason]) -> CycleResult:
    return CycleResult(now, reasons=Reasons({JobId(j): r for j, r in reasons.items()}))


def written(book: ReasonBook, state: ClusterState, now: float, reasons: dict[str, Reason]) -> list[str]:
    return [c.message for c in book.changes(state, cycle(now, reasons))]


def test_only_times_moved_sees_clock_times_and_nothing_else() -> None:
    assert only_times_moved(protected(T0 + 60).message, protected(T0 + 95).message)
    assert only_times_moved(protected(T0 + 60).message, protected(T0 + 3 * 86400).message)  # with a date
    assert only_times_moved("reserved to start at t=1840s", "reserved to start at t=1900s")
    assert not only_times_moved(protected(T0 + 60, free=2).message, protected(T0 + 60, free=0).message)
    assert not only_times_moved(capacity(2).message, capacity(0).message)


def test_a_moving_time_is_rewritten_at_most_every_refresh_seconds() -> None:
    state, book = waiting(1), ReasonBook()
    first = protected(T0 + 60)
    assert written(book, state, T0, {"j0": first}) == [first.message]
    later = protected(T0 + 90)  # a protection ends later now: only its time moved
    assert written(book, state, T0 + 1, {"j0": later}) == []
    assert written(book, state, T0 + REFRESH - 1, {"j0": later}) == []
    assert written(book, state, T0 + REFRESH, {"j0": later}) == [later.message]
    assert book.known["j0"][:3] == ("capacity", later.message, T0 + 90)


def test_new_figures_or_a_new_code_are_written_at_once() -> None:
    state, book = waiting(1), ReasonBook()
    book.changes(state, cycle(T0, {"j0": protected(T0 + 60, free=2)}))
    fewer = protected(T0 + 60, free=0)  # the same code, other numbers (issue 14, defect 4)
    changes = book.changes(state, cycle(T0 + 1, {"j0": fewer}))
    assert [(c.message, c.new_code) for c in changes] == [(fewer.message, False)]
    reserved = text.with_reservation(capacity(0), T0 + 600, T0 + 2)
    changes = book.changes(state, cycle(T0 + 2, {"j0": reserved}))
    assert [(c.code, c.at, c.new_code) for c in changes] == [("reserved", T0 + 600, True)]
    moved = text.with_reservation(capacity(0), T0 + 660, T0 + 3)  # the reservation moves: a time only
    assert book.changes(state, cycle(T0 + 3, {"j0": moved})) == []


def test_refreshes_per_look_are_capped_and_the_rest_follow() -> None:
    count = REFRESH_PER_LOOK + 5
    state, book = waiting(count), ReasonBook()
    ids = [f"j{i}" for i in range(count)]
    assert len(written(book, state, T0, dict.fromkeys(ids, protected(T0 + 60)))) == count
    later = dict.fromkeys(ids, protected(T0 + 90))
    assert len(written(book, state, T0 + REFRESH, later)) == REFRESH_PER_LOOK
    assert len(written(book, state, T0 + REFRESH + 1, later)) == 5  # the rest, at the next look
    assert written(book, state, T0 + REFRESH + 2, later) == []
    new_code = {"j0": Reason(Why.HELD, "held by a user or an admin; `corral release` lets it run")}
    assert len(written(book, state, T0 + REFRESH + 3, later | new_code)) == 1  # never capped


def test_a_reason_read_back_after_a_restart_is_refreshed_once() -> None:
    state, book = waiting(1), ReasonBook()
    stale = protected(T0 - 600)  # as stored by the last process, of unknown age
    book.remember("j0", stale.code.value, stale.message, stale.at)
    book.look_at_all()
    now = protected(T0 + 60)
    assert written(book, state, T0, {"j0": now}) == [now.message]
    assert written(book, state, T0 + 1, {"j0": protected(T0 + 70)}) == []


def test_a_stored_time_that_has_passed_is_rewritten_at_once() -> None:
    state, book = waiting(1), ReasonBook()
    book.changes(state, cycle(T0, {"j0": protected(T0 + 5)}))
    later = protected(T0 + 300)  # the protection it named ended; another job's protects now
    assert written(book, state, T0 + 6, {"j0": later}) == [later.message]


def test_a_requeued_job_gets_its_reason_written_again_even_if_unchanged() -> None:
    """A start clears a job's stored reason (server/commit.py); when the job is requeued and waits
    for the same reason as before it started, the reason is written again, not taken as known."""
    state, book = waiting(1), ReasonBook()
    book.fresh.add("j0")
    assert written(book, state, T0, {"j0": capacity(0)}) == [capacity(0).message]
    assert written(book, state, T0 + 1, {"j0": capacity(0)}) == []  # unchanged: nothing to write
    book.fresh.add("j0")  # it started (its row's reason cleared) and was requeued
    assert written(book, state, T0 + 100, {"j0": capacity(0)}) == [capacity(0).message]
