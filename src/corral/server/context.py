"""What the API process holds: engines, the group-commit writer, tokens, the cluster view,
heartbeats (in memory, DESIGN.md 6.4), and the notifier behind long polls."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, insert

from corral.core.state import ClusterState
from corral.server.auth import TokenCache
from corral.server.cluster import ClusterModel, load_cluster
from corral.server.doorbell import Bell, Doorbell
from corral.server.jobs import insert_jobs
from corral.store import schema
from corral.store.engine import Engines, append_events
from corral.store.writer import Many, Writer

T = TypeVar("T")


class Notifier:
    """Wakes every long poll when something was committed (by this process or, rung, by the scheduler)."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.event: asyncio.Event | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()

    def _fire(self) -> None:
        if self.event is not None:
            self.event.set()
            self.event = asyncio.Event()

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


def _insert_audit(conn: Connection, rows: Sequence[dict[str, Any]]) -> list[None]:
    conn.execute(insert(schema.audit), list(rows))
    return [None] * len(rows)


class Context:
    def __init__(
        self, engines: Engines, *, allow_dynamic_nodes: bool = False, clock: Callable[[], float] = time.time
    ) -> None:
        self.engines = engines
        self.clock = clock  # scheduling time: submit times, stop deadlines, events' `t`
        self.allow_dynamic_nodes = allow_dynamic_nodes
        self.notifier = Notifier()
        self.scheduler_bell = Bell("scheduler", engines.reader)
        self.writer = Writer(engines, after_commit=self._after_commit)
        self.tokens = TokenCache(engines.reader)
        is_sqlite = engines.is_sqlite
        self.insert_jobs: Many = lambda conn, batch: insert_jobs(conn, batch, is_sqlite)
        self.insert_audit: Many = _insert_audit
        self.heartbeats: dict[str, float] = {}  # node -> monotonic time of its last heartbeat
        self.incarnations: dict[str, int] = {}
        # node -> its GPUs' last utilisation and memory samples (NVML nodes only), from heartbeats
        self.gpu_samples: dict[str, list[dict[str, Any]]] = {}
        self.started = time.monotonic()
        self._model_lock = threading.Lock()
        self._model: tuple[ClusterModel, ClusterState] | None = None
        self.doorbell = Doorbell("api")
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
        self.writer.close()
        self.doorbell.close()
        self.engines.dispose()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                if self.doorbell.wait(1.0):
                    self.notifier.notify()
            except (OSError, ValueError):
                return

    def _after_commit(self) -> None:
        self.scheduler_bell.ring()
        self.notifier.notify()

    # ---- the cluster view ----------------------------------------------------------------
    def model(self) -> tuple[ClusterModel, ClusterState]:
        """The active configuration and nodes, and an empty state built from them (for checks)."""
        with self._model_lock:
            if self._model is None:
                with self.engines.reader.connect() as conn:
                    model = load_cluster(conn)
                self._model = (model, model.build_state())
            return self._model

    def invalidate_model(self) -> None:
        with self._model_lock:
            self._model = None

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
