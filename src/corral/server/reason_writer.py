"""Waiting jobs' reasons written by a thread of their own, in short transactions that never hold
up a cycle's decisions (issue 15).

The reason book (server/reasons.py) says, after a cycle, which pending jobs' reasons changed; the
scheduler hands them to this writer (`put`) and goes on. A look at a long backlog can change
tens of thousands of rows (about 33,000 in one look at 100,000 pending, 1.3 s in one
transaction on PostgreSQL): written in the scheduler's own thread, the next cycle's starts waited
behind them. Here:

- **A queue of one entry per job.** A newer reason for a job replaces the one still queued (a
  new code stays new: the history line is not lost), so the queue holds at most one row per
  pending job, however far the writer falls behind, and a job's rows are written in the order
  the looks made them (one writer, the newest queued last).
- **Short transactions.** The writer takes `ROWS` rows at a time, each in a transaction of its
  own on the writer engine: fenced by the leader lease first, like every decision (a deposed
  scheduler writes nothing, and the writer stops), then, on PostgreSQL, after the journal's
  advisory lock that every writer transaction takes first (store/engine.py), so it is
  serialised with the decisions' transaction as on SQLite and holds no row lock while another
  writer waits for one: the two can never deadlock, and a decision waits at most for the one
  chunk under way.
- **Decisions first.** While the scheduler commits decisions (`held`), the writer starts no new
  chunk, and after each chunk it leaves the lock to others as long as the chunk took (at most
  `PAUSE_MAX`): a long write of reasons holds at most about half of the database's writer. The
  time it spends writing counts toward the scheduler's pacing of looks (`take_spent`,
  server/pacing.py: a look no sooner than 10 times what the last look and its writes took), so
  the reasons take about a tenth of the database's writer over time, as when they were written
  in the scheduler's own thread, and leave the rest to the API (submissions) and the decisions.
- **Fenced per row.** A row is written only to a job still pending at the attempt the scheduler
  saw when it looked (`jobs.state`, `jobs.attempt`), and its history line only with it: a job
  that started (or ended, or started and came back) since is never given the stale reason.

Reasons are soft state (DESIGN.md 6.4): what is queued when the process stops or is deposed is
dropped, and the next scheduler's first look (`ReasonBook.look_at_all`) writes whatever differs
from what is stored. Metrics: `corral_reason_write_seconds` (one chunk's transaction),
`corral_reason_rows_total` (rows written).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

from sqlalchemy import Connection, bindparam, insert, select, update

from corral.server import metrics
from corral.server.leader import Deposed
from corral.server.reasons import ReasonChange
from corral.store import schema
from corral.store.engine import Engines

log = logging.getLogger("corral.scheduler")

ROWS = 500  # rows a transaction: tens of ms on PostgreSQL, what a decision may wait for
RETRY = 1.0  # seconds before a chunk that failed (the database away) is tried again
# after a chunk, the writer leaves the database's writer lock to others (the API's submissions,
# the decisions) at least as long as the chunk took, at most PAUSE_MAX: half of it at most
PAUSE_MAX = 0.25


class Queued(NamedTuple):
    """One row to write: the change, the job's attempts when it was looked at, the look's clock."""

    change: ReasonChange
    attempt: int
    t: float


class ReasonWriter:
    """The queue of reasons to write, and the thread that writes them (started by the first `put`)."""

    def __init__(
        self,
        engines: Engines,
        fence: Callable[[Connection], None],
        ring: Callable[[], None] = lambda: None,
        rows: int = ROWS,
    ) -> None:
        self.engines = engines
        self.fence = fence  # the scheduler's: `Deposed` unless still the leader
        self.ring = ring  # after the queue is drained (the API's long polls)
        self.rows = rows
        self.deposed: Deposed | None = None
        self._cond = threading.Condition()
        self._queue: OrderedDict[str, Queued] = OrderedDict()
        self._busy = False  # a chunk is taken and not yet written
        self._held = 0  # decisions being committed: no new chunk until they are
        self._closed = False
        self._thread: threading.Thread | None = None
        self._spent = 0.0  # seconds spent writing since `take_spent`

    def put(self, changes: Iterable[tuple[ReasonChange, int]], t: float) -> None:
        """Queue these rows (change, the job's attempts), each replacing the job's queued one."""
        with self._cond:
            if self._closed or self.deposed is not None:
                return
            queue = self._queue
            for change, attempt in changes:
                old = queue.get(change.job)
                if old is not None and old.change.new_code and not change.new_code:
                    change = change._replace(new_code=True)  # the older code was never written
                queue[change.job] = Queued(change, attempt, t)
            if queue and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="corral-reasons", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def retain(self, jobs: Container[str]) -> None:
        """Drop the queued rows of jobs not in `jobs` (after the state was rebuilt)."""
        with self._cond:
            for job in [j for j in self._queue if j not in jobs]:
                del self._queue[job]

    def queued(self) -> int:
        with self._cond:
            return len(self._queue)

    def take_spent(self) -> float:
        """Seconds spent writing since the last call (the scheduler's pacing of looks counts them)."""
        with self._cond:
            spent, self._spent = self._spent, 0.0
            return spent

    def check(self) -> None:
        """Raise `Deposed` when a write found the lease gone."""
        if self.deposed is not None:
            raise self.deposed

    @contextmanager
    def held(self) -> Iterator[None]:
        """While decisions are committed: no chunk starts (one under way finishes)."""
        with self._cond:
            self._held += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify_all()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued row is written (tests); False on timeout. `Deposed` if deposed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._queue or self._busy) and self.deposed is None and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        self.check()
        return not self._queue

    def close(self, timeout: float = 10.0) -> None:
        """Stop writing: what is queued is dropped (soft state); a chunk under way may finish."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    # ---- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._queue or self._held):
                    self._cond.wait()
                if self._closed:
                    return
                queue = self._queue
                chunk = [queue.popitem(last=False)[1] for _ in range(min(self.rows, len(queue)))]
                self._busy = True
            began = time.monotonic()
            try:
                self._write(chunk)
            except Deposed as exc:
                log.error("reasons not written, no longer the leader: %s", exc)
                with self._cond:
                    self.deposed = exc
                    self._queue.clear()
                    self._busy = False
                    self._cond.notify_all()
                return
            except Exception as exc:  # the database is away: the rows wait (a newer one replaces them)
                log.warning("could not write %d reasons (%s); trying again", len(chunk), exc)
                with self._cond:
                    for row in chunk:
                        self._queue.setdefault(row.change.job, row)
                    self._spent += time.monotonic() - began
                    self._busy = False
                    self._cond.notify_all()
                    self._cond.wait(RETRY)
                continue
            with self._cond:
                took = time.monotonic() - began
                self._spent += took
                self._busy = False
                drained = not self._queue
                self._cond.notify_all()
                resume = time.monotonic() + min(took, PAUSE_MAX)
                while not drained and not self._closed and (left := resume - time.monotonic()) > 0:
                    self._cond.wait(left)
            if drained:
                try:
                    self.ring()
                except Exception as exc:  # a hint only
                    log.debug("could not ring the API after reasons: %s", exc)

    def _write(self, chunk: Sequence[Queued]) -> None:
        """One chunk in one fenced transaction: only jobs still pending at the attempt seen."""
        began = time.monotonic()
        j = schema.jobs
        with self.engines.writer.begin() as conn:
            self.fence(conn)
            ids = [row.change.job for row in chunk]
            pending = dict(
                conn.execute(select(j.c.id, j.c.attempt).where(j.c.id.in_(ids), j.c.state == "pending")).all()
            )
            rows = [row for row in chunk if pending.get(row.change.job) == row.attempt]
            if rows:
                write(conn, rows)
        metrics.REASON_WRITE_SECONDS.observe(time.monotonic() - began)
        metrics.REASON_ROWS.inc(len(rows))


def write(conn: Connection, rows: Sequence[Queued]) -> None:
    """Persist reasons of pending jobs (each guarded: still pending, at the attempt seen); a new
    code also goes to the job's reason history."""
    j = schema.jobs
    conn.execute(
        update(j)
        .where(j.c.id == bindparam("b_job"), j.c.state == "pending", j.c.attempt == bindparam("b_attempt"))
        .values(reason_code=bindparam("b_code"), reason=bindparam("b_message"), reason_at=bindparam("b_at")),
        [
            {"b_job": c.job, "b_attempt": r.attempt, "b_code": c.code, "b_message": c.message, "b_at": c.at}
            for r in rows
            for c in (r.change,)
        ],
    )
    history = [
        {"job_id": c.job, "t": r.t, "code": c.code, "message": c.message, "at": c.at}
        for r in rows
        for c in (r.change,)
        if c.new_code
    ]
    if history:
        conn.execute(insert(schema.reasons), history)
