"""The reason writer's queue (server/reason_writer.py), without a database: a newer reason for a
job replaces its queued one (a new code stays new), so the queue holds one row per job however
far the writer falls behind; rows go out in chunks of `rows`, none while decisions are held, and
a job's newest row is written last."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from corral.server.reason_writer import Queued, ReasonWriter
from corral.server.reasons import ReasonChange


class Recording(ReasonWriter):
    def __init__(self, rows: int) -> None:
        super().__init__(engines=None, fence=lambda conn: None, rows=rows)  # type: ignore[arg-type]
        self.chunks: list[list[Queued]] = []

    def _write(self, chunk: Sequence[Queued]) -> None:
        self.chunks.append(list(chunk))


def change(job: str, code: str, new: bool, message: str = "") -> ReasonChange:
    return ReasonChange(job, code, message or f"{code} {job}", None, new)


def rows(writer: Recording) -> list[tuple[Any, ...]]:
    return [
        (r.change.job, r.change.code, r.change.new_code, r.attempt, r.t) for c in writer.chunks for r in c
    ]


def test_a_newer_reason_replaces_the_queued_one() -> None:
    writer = Recording(rows=2)
    try:
        with writer.held():  # decisions being committed: nothing is written meanwhile
            writer.put([(change("a", "capacity", True), 0), (change("b", "capacity", True), 1)], t=10.0)
            newer = [(change("a", "capacity", False, "needs 1"), 0), (change("c", "held", True), 0)]
            writer.put(newer, t=11.0)
            writer.put([(change("b", "reserved", True), 2)], t=12.0)
            assert writer.queued() == 3 and not writer.chunks
        assert writer.flush(timeout=10)
        assert [len(c) for c in writer.chunks] == [2, 1]
        assert rows(writer) == [
            ("a", "capacity", True, 0, 11.0),  # the newer sentence; the code still new to the store
            ("b", "reserved", True, 2, 12.0),  # the newer code, at the attempt seen last
            ("c", "held", True, 0, 11.0),
        ]
        writer.put([(change("a", "held", True), 0)], t=13.0)  # after its row was written: a row of its own
        assert writer.flush(timeout=10)
        assert rows(writer)[-1] == ("a", "held", True, 0, 13.0)
    finally:
        writer.close()


def test_retain_and_close_drop_what_is_queued() -> None:
    writer = Recording(rows=10)
    try:
        with writer.held():
            writer.put([(change(j, "capacity", True), 0) for j in "abcd"], t=1.0)
            writer.retain({"b", "d"})  # the state was rebuilt: a, c are no longer pending in memory
        assert writer.flush(timeout=10)
        assert [r[0] for r in rows(writer)] == ["b", "d"]
        with writer.held():
            writer.put([(change("e", "capacity", True), 0)], t=2.0)
            writer.close()
        writer.put([(change("f", "capacity", True), 0)], t=3.0)  # closed: ignored
        assert writer.queued() == 0 and [r[0] for r in rows(writer)] == ["b", "d"]
    finally:
        writer.close()


def test_the_time_spent_writing_is_counted_for_the_pacing_of_looks() -> None:
    class Slow(Recording):
        def _write(self, chunk: Sequence[Queued]) -> None:
            time.sleep(0.05)
            super()._write(chunk)

    writer = Slow(rows=1)
    try:
        writer.put([(change(j, "capacity", True), 0) for j in "ab"], t=1.0)
        assert writer.flush(timeout=10)
        assert writer.take_spent() >= 0.1  # two chunks of at least 50 ms each
        assert writer.take_spent() == 0.0  # taken
    finally:
        writer.close()
