"""The group-commit writer (`corral.store.writer.Writer`) on SQLite and PostgreSQL, directly:
no caller hears of its write before the commit (DESIGN.md 6.2: an acknowledged write is
durable), a failed commit fails every caller of its batch, and one bad item fails alone.

Every test first parks the writer thread on a gate, so that what it queues next lands in one
batch; the tables are the test's own (a child row's foreign key is checked only at the commit).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import pytest
from sqlalchemy import Column, Connection, ForeignKey, Integer, MetaData, Table, insert, select

from corral.store.engine import Engines, make_engines
from corral.store.writer import Writer

META = MetaData()
PARENT = Table("w_parent", META, Column("id", Integer, primary_key=True))
CHILD = Table(
    "w_child",
    META,
    Column("id", Integer, primary_key=True),
    Column("parent", Integer, ForeignKey("w_parent.id", deferrable=True, initially="DEFERRED")),
)
WAIT = 30.0


@pytest.fixture
def engines(database_url: str) -> Iterator[Engines]:
    engines = make_engines(database_url)
    META.create_all(engines.writer)
    yield engines
    engines.dispose()


@pytest.fixture
def writer(engines: Engines) -> Iterator[Writer]:
    w = Writer(engines)
    yield w
    w.close()


class Gate:
    """A write that holds the writer thread until `open()`: what is queued meanwhile is one batch."""

    def __init__(self, writer: Writer) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.future = writer.submit(self._hold)
        assert self.entered.wait(WAIT), "the writer never ran the gate"

    def _hold(self, conn: Connection) -> None:
        self.entered.set()
        assert self.release.wait(WAIT)

    def open(self) -> None:
        self.release.set()
        self.future.result(WAIT)


def add_parent(pid: int) -> Any:
    def work(conn: Connection) -> int:
        conn.execute(insert(PARENT).values(id=pid))
        return pid

    return work


def add_parents(conn: Connection, ids: Sequence[int]) -> list[int]:
    conn.execute(insert(PARENT), [{"id": i} for i in ids])
    return list(ids)


def parents(engines: Engines) -> list[int]:
    with engines.reader.connect() as conn:
        return sorted(conn.execute(select(PARENT.c.id)).scalars())


def test_no_caller_hears_of_its_write_before_the_commit(engines: Engines, writer: Writer) -> None:
    gate = Gate(writer)
    futures: dict[int, Future[Any]] = {}
    for pid in (1, 2, 3):
        futures[pid] = writer.submit(add_parent(pid))
    for pid in (4, 5, 6):
        futures[pid] = writer.submit_many(add_parents, pid)
    seen: dict[int, list[int]] = {}
    told = {pid: threading.Event() for pid in futures}

    def on_reply(pid: int) -> Any:
        # runs in the writer thread the moment the caller's result is set: another connection
        # must already see the row, so the reply cannot come before the commit
        def look(_future: Future[Any]) -> None:
            seen[pid] = parents(engines)
            told[pid].set()

        return look

    for pid, future in futures.items():
        future.add_done_callback(on_reply(pid))
    gate.open()
    assert {pid: f.result(WAIT) for pid, f in futures.items()} == {p: p for p in futures}
    for pid in futures:
        assert told[pid].wait(WAIT)
        assert pid in seen[pid], f"the caller of {pid} heard back before the commit: rows then {seen[pid]}"
    assert parents(engines) == [1, 2, 3, 4, 5, 6]


def test_a_failed_commit_fails_every_caller_of_its_batch(engines: Engines, writer: Writer) -> None:
    gate = Gate(writer)
    good = [writer.submit(add_parent(1)), *(writer.submit_many(add_parents, pid) for pid in (2, 3))]

    def orphan(conn: Connection) -> None:  # fine as a statement; its foreign key fails the commit
        conn.execute(insert(CHILD).values(id=1, parent=99))

    bad = writer.submit(orphan)
    gate.open()
    for future in [*good, bad]:
        with pytest.raises(Exception, match=r"(?i)foreign key"):
            future.result(WAIT)
    assert parents(engines) == []  # nobody's write is there
    assert writer.submit(add_parent(7)).result(WAIT) == 7  # and the writer goes on
    assert parents(engines) == [7]


def test_one_bad_item_fails_alone(engines: Engines, writer: Writer) -> None:
    assert writer.submit(add_parent(1)).result(WAIT) == 1
    gate = Gate(writer)
    work = {pid: writer.submit(add_parent(pid)) for pid in (10, 1, 11)}  # 1 is taken
    many = {pid: writer.submit_many(add_parents, pid) for pid in (20, 21, 1, 22)}  # so is this 1
    gate.open()
    for futures in (work, many):
        with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
            futures[1].result(WAIT)
        others = [pid for pid in futures if pid != 1]
        assert [futures[pid].result(WAIT) for pid in others] == others
    assert parents(engines) == [1, 10, 11, 20, 21, 22]
