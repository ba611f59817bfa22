"""What the API process holds: engines, the group-commit writer, tokens, the cluster view,
heartbeats (in memory, DESIGN.md 6.4), the notifier behind long polls, and the outbox cursor
behind the agents' long polls."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, func, insert, select
from sqlalchemy.exc import SQLAlchemyError

from corral.core.state import ClusterState
from corral.server.auth import TokenCache, changed_mark
from corral.server.cluster import ClusterModel, get_setting
from corral.server.doorbell import bell_for, doorbell_for
from corral.server.estimated import History
from corral.server.in_force import load_view
from corral.server.jobs import insert_jobs
from corral.server.node_status import NodeStatus
from corral.server.throttle import FailedAuthThrottle
from corral.store import schema
from corral.store.engine import Engines, append_events
from corral.store.writer import Many, Writer

T = TypeVar("T")
CONFIG_RECHECK = 1.0  # seconds between reads of the configuration settings (changes made elsewhere)
log = logging.getLogger("corral.server")


class Notifier:
    """Wakes every long poll when something was committed (by this process or, rung, by the scheduler)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.event: asyncio.Event | None = None
        self.listeners: list[Callable[[], None]] = []  # called on the loop at every wake

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()

    def _fire(self) -> None:
        if self.event is not None:
            self.event.set()
            self.event = asyncio.Event()
        for listener in self.listeners:
            listener()

    def notify(self) -> None:
        """Thread-safe."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._fire)

    def mark(self) -> asyncio.Event | None:
        """Take before reading: `wait(timeout, mark)` then returns at once if a commit came meanwhile."""
        return self.event

    async def wait(self, timeout: float, mark: asyncio.Event | None = None) -> None:
        event = mark or self.event
        if event is None or timeout <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)


class OutboxCursor:
    """The newest order of each node in the outbox, in memory. An agent's long poll reads the
    table only when its node has an order after the poll's cursor, and a commit costs one query
    (the newest order per node among the rows since the last read) instead of one per waiting
    poll: with 10,000 agents waiting, each commit used to wake 10,000 queries."""

    PERIOD = 1.0  # seconds between reads without a commit (a lost doorbell ring costs at most this)

    def __init__(self, reader: Engine, exact: bool) -> None:
        self.reader = reader
        # SQLite commits outbox rows in seq order, so a read past seq N never misses a smaller
        # seq committed later; PostgreSQL may (sequence values are taken before the commit
        # order is), so there a long poll also reads its rows once more at its deadline
        self.exact = exact
        self.newest: dict[str, int] = {}
        self.seen = -1  # the largest seq read so far; -1 before the first read
        self.waiters: dict[str, asyncio.Event] = {}  # node -> set when an order for it appears
        self._busy = False
        self._again = False
        self._tasks: set[asyncio.Task[None]] = set()

    def has_after(self, node: str, after: int) -> bool:
        """False only when the outbox holds no order for `node` after seq `after`, as last read."""
        return self.seen < 0 or self.newest.get(node, 0) > after

    def mark(self, node: str) -> asyncio.Event:
        """Take before reading: it is set when an order for `node` is seen after that."""
        if not self._tasks:  # the first poll starts the periodic read, on the server's loop
            self._spawn(self._tick())
            self.poke()
        event = self.waiters.get(node)
        if event is None:
            event = self.waiters[node] = asyncio.Event()
        return event

    def poke(self) -> None:
        """Something was committed: read the new rows (one read at a time; pokes meanwhile coalesce)."""
        if self._busy:
            self._again = True
        else:
            self._busy = True
            self._spawn(self._refresh())

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.PERIOD)
            if self.waiters:
                self.poke()

    async def _refresh(self) -> None:
        try:
            while True:
                self._again = False
                try:
                    rows = await asyncio.to_thread(self._read, self.seen)
                except Exception:  # the next poke or tick reads again; polls still end at their deadline
                    log.exception("reading the outbox")
                    return
                for node, seq in rows:
                    self.seen = max(self.seen, seq)
                    if seq > self.newest.get(node, 0):
                        self.newest[node] = seq
                        event = self.waiters.pop(node, None)
                        if event is not None:
                            event.set()
                self.seen = max(self.seen, 0)
                if not self._again:
                    return
        finally:
            self._busy = False

    def _read(self, after: int) -> list[tuple[str, int]]:
        o = schema.outbox
        with self.reader.connect() as conn:
            rows = conn.execute(select(o.c.node, func.max(o.c.seq)).where(o.c.seq > after).group_by(o.c.node))
            return [(str(node), int(seq)) for node, seq in rows]

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def _insert_audit(conn: Connection, rows: Sequence[dict[str, Any]]) -> list[None]:
    conn.execute(insert(schema.audit), list(rows))
    return [None] * len(rows)


class Context:
    def __init__(
        self,
        engines: Engines,
        *,
        allow_dynamic_nodes: bool = False,
        clock: Callable[[], float] = time.time,
        lost_after: float = 30.0,
        policy: str = "default",
    ) -> None:
        self.engines = engines
        self.clock = clock  # scheduling time: submit times, stop deadlines, events' `t`
        self.allow_dynamic_nodes = allow_dynamic_nodes
        self.notifier = Notifier()
        self.outbox = OutboxCursor(engines.reader, exact=engines.is_sqlite)
        self.notifier.listeners.append(self.outbox.poke)
        # the scheduler (the leader's, wherever it runs) and, on PostgreSQL, every replica's long polls
        self.scheduler_bell = bell_for(["scheduler", "api"], engines)
        self.writer = Writer(engines, after_commit=self._after_commit)
        self.tokens = TokenCache(engines.reader)
        self.history = History()  # run times of finished jobs, for the jobs' estimates (server/estimated.py)
        is_sqlite = engines.is_sqlite
        self.insert_jobs: Many = lambda conn, batch: insert_jobs(conn, batch, is_sqlite)
        self.insert_audit: Many = _insert_audit
        self.started = time.monotonic()
        self.node_status = NodeStatus(self.started)  # per-node liveness of this process
        self.lost_after = lost_after  # seconds of silence before a node is lost (0: never)
        self.policy = policy  # the server's --policy: in effect while no revision names one
        self.replica = ""  # this replica's name in the leader lease ("": it runs no scheduler)
        self.maintenance = 0.0  # Unix time planned maintenance ends (0: none)
        self._model_lock = threading.Lock()
        self._model: tuple[ClusterModel, ClusterState] | None = None
        self._config_mark: tuple[str | None, ...] = ()
        self._tokens_mark: str | None = None  # `auth.changed_mark` as last read
        self.auth_failures = FailedAuthThrottle()  # per client address (server/throttle.py)
        self.nodes_version = 0  # bumped by every invalidate_model(): a node changed here
        self.doorbell = doorbell_for("api", engines)
        self._stop = threading.Event()
        self._listener = threading.Thread(target=self._listen, name="corral-api-doorbell", daemon=True)

    def start(self) -> None:
        self.doorbell.publish(self.engines.writer)
        self._listener.start()
        # the cluster view (10,000 nodes: most of a second) is built now, in the background, not
        # by the first submission after a start
        threading.Thread(target=self.model, name="corral-cluster-view", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self.outbox.close()
        self.writer.close()
        self.doorbell.close()
        self.scheduler_bell.close()
        self.engines.dispose()

    def _listen(self) -> None:
        checked = time.monotonic()
        while not self._stop.is_set():
            try:
                if self.doorbell.wait(1.0):
                    self.notifier.notify()
                if time.monotonic() - checked >= CONFIG_RECHECK:
                    checked = time.monotonic()
                    self._recheck_config()
            except (OSError, ValueError):
                return
            except SQLAlchemyError as exc:  # the database is away for a moment: try again later
                log.warning("could not re-read the configuration settings: %s", exc)

    def _after_commit(self) -> None:
        self.scheduler_bell.ring()
        self.notifier.notify()

    # ---- the cluster view ----------------------------------------------------------------
    def model(self) -> tuple[ClusterModel, ClusterState]:
        """The active configuration and nodes, and an empty state built from them (for checks)."""
        with self._model_lock:
            if self._model is None:
                with self.engines.reader.connect() as conn:
                    model = load_view(conn)
                    self._config_mark = _config_mark(conn)
                self._model = (model, model.build_state())
            return self._model

    def _recheck_config(self) -> None:
        """Drop the cluster view when the configuration settings changed behind this process (the
        scheduler refused a revision and put the last good one back, or a script wrote one); drop
        the token cache when a token was revoked or bound through another replica."""
        with self.engines.reader.connect() as conn:
            mark = _config_mark(conn)
            tokens = changed_mark(conn)
        if tokens != self._tokens_mark:  # revoked or bound through another replica
            if self._tokens_mark is not None or tokens is not None:
                self.tokens.clear()
            self._tokens_mark = tokens
        if self._model is None:
            return
        if mark != self._config_mark:
            log.info("the configuration in force changed; reloading the cluster view")
            self.invalidate_model()

    def invalidate_model(self) -> None:
        with self._model_lock:
            self._model = None
            self.nodes_version += 1

    # ---- writes ----------------------------------------------------------------------------
    async def write_many(self, fn: Many, item: Any) -> Any:
        """Write `item` with the other items for `fn` in the next group commit (one statement per table)."""
        return await asyncio.wrap_future(self.writer.submit_many(fn, item))

    async def write(self, work: Callable[[Connection], T]) -> T:
        """Run `work` in the next group commit; returns once it is durable."""
        return await asyncio.wrap_future(self.writer.submit(work))

    def journal(self, conn: Connection, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        now = self.clock()
        return append_events(conn, [{"t": now, **e} for e in entries], self.engines.is_sqlite)


def _config_mark(conn: Connection) -> tuple[str | None, ...]:
    return (get_setting(conn, "config.active"), get_setting(conn, "config.refused"))
