"""Webhook deliveries: a thread of the API process that turns journal events into deliveries
(`notify_ingest.py`) and sends them to the configured sinks, signed, with retries.

- Never in the scheduler's way: the scheduler process does not know about notifications; this
  thread reads the journal after the fact and writes through the API's group commit.
- At least once, deduplicable, nothing lost: a delivery row exists before its first request and
  is marked `delivered` only after a 2xx answer; a crash in between sends it again after the
  restart with the same id (`Corral-Delivery`), which the receiver deduplicates by.
- Retries back off exponentially (`notify.backoff` doubling to `notify.backoff_max`, with
  jitter) up to `notify.max_attempts`; then the delivery is `failed` (kept, and counted).
- No request to an address a user chose: the URL is the sink's, re-checked against
  `notify.allow` before every request; redirects are not followed; proxies from the
  environment are not used.
- Signature: `Corral-Signature-256: sha256=<hex HMAC-SHA256 of the body with the sink's secret>`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine, delete, func, select, update

from corral.config.notify_config import NotifyConfig, Sink, is_allowed
from corral.server.context import Context
from corral.server.notify_ingest import BATCH, apply_pass, read_pass
from corral.store import schema

log = logging.getLogger("corral.server.notify")

SIGNATURE_HEADER = "Corral-Signature-256"
DELIVERY_HEADER = "Corral-Delivery"
EVENT_HEADER = "Corral-Event"
WORKERS = 4  # requests in flight at once
IDLE = 1.0  # seconds between passes when nothing wakes the thread
KEEP = 7 * 86400.0  # seconds a settled delivery (delivered, failed, dropped) is kept
PRUNE_EVERY = 3600.0
PACE = 0.1  # seconds between passes at least (a busy cluster commits many times a second)

DELIVERIES = Counter(
    "corral_notify_deliveries_total",
    "Webhook deliveries settled, by sink and outcome (delivered, failed: gave up, dropped: sink gone)",
    ["sink", "outcome"],
)
FAILURES = Counter(
    "corral_notify_failures_total", "Webhook requests that failed (each attempt), by sink", ["sink"]
)
RETRIES = Counter("corral_notify_retries_total", "Webhook deliveries scheduled for another attempt", ["sink"])


def sign(secret: bytes, body: bytes) -> str:
    """The `Corral-Signature-256` header's value for `body`."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def read_secret(sink: Sink) -> bytes:
    """The sink's signing secret (surrounding whitespace removed); OSError/KeyError when missing."""
    if sink.secret_file is not None:
        with open(sink.secret_file, "rb") as f:
            secret = f.read().strip()
    else:
        secret = os.environ[str(sink.secret_env)].strip().encode()
    if not secret:
        raise ValueError(f"the secret of sink {sink.name} is empty")
    return secret


def backoff(notify: NotifyConfig, attempts: int) -> float:
    """Seconds before attempt `attempts + 1`: the base doubling per attempt, capped, with jitter."""
    delay = min(notify.backoff_max, notify.backoff * 2.0 ** max(0, attempts - 1))
    return delay * random.uniform(0.8, 1.0)


@dataclass(frozen=True)
class Outcome:
    """One attempt's result: delivered, or the error; `final` when the sink is gone or refused."""

    ok: bool
    error: str = ""
    final: bool = False


def send(http: httpx.Client, notify: NotifyConfig, row: Any) -> Outcome:
    """One attempt at one delivery (no database work here)."""
    sink = notify.sink(row.sink)
    if sink is None:
        return Outcome(False, f"sink {row.sink} is no longer configured", final=True)
    if not is_allowed(sink.url, notify.allow):
        return Outcome(False, f"{sink.url} is no longer under notify.allow", final=True)
    try:
        secret = read_secret(sink)
    except (OSError, KeyError, ValueError) as exc:
        return Outcome(False, f"cannot read the secret of sink {sink.name}: {exc}")
    body = row.body.encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "corral-notify/1",
        DELIVERY_HEADER: row.id,
        EVENT_HEADER: row.kind,
        SIGNATURE_HEADER: sign(secret, body),
    }
    try:
        response = http.post(sink.url, content=body, headers=headers, timeout=notify.timeout)
    except httpx.HTTPError as exc:
        return Outcome(False, f"{type(exc).__name__}: {exc}"[:500])
    if response.is_success:
        return Outcome(True)
    return Outcome(
        False,
        f"HTTP {response.status_code}" + (" (redirects are not followed)" if response.is_redirect else ""),
    )


class Notifications:
    """The notifier thread: ingest passes, then due deliveries sent by a small pool."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.wakeup = threading.Event()
        self.stopping = threading.Event()
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="corral-notify-send")
        self.in_flight: dict[str, Future[None]] = {}
        # no proxies from the environment, no redirects: the request goes to the sink's URL only
        self.http = httpx.Client(follow_redirects=False, trust_env=False)
        self.thread = threading.Thread(target=self._run, name="corral-notify", daemon=True)
        self.next_prune = 0.0  # monotonic time of the next removal of old settled deliveries

    def start(self) -> None:
        self.ctx.notifier.listeners.append(self.wakeup.set)
        self.thread.start()

    def close(self) -> None:
        self.stopping.set()
        self.wakeup.set()
        self.thread.join(timeout=5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()

    def _run(self) -> None:
        while not self.stopping.is_set():
            self.wakeup.clear()
            wait = IDLE
            try:
                model, _ = self.ctx.model()
                notify = model.config.notify
                while self._ingest(notify, model.config.name):
                    pass
                wait = self._deliver(notify)
                if time.monotonic() >= self.next_prune:
                    self.next_prune = time.monotonic() + PRUNE_EVERY
                    self.ctx.writer.call(lambda conn: prune(conn, time.time() - KEEP))
            except Exception:  # the database is away for a moment, or a bug: log it, keep going
                log.exception("notifications")
            if self.stopping.wait(PACE):
                return
            self.wakeup.wait(min(max(wait - PACE, 0.0), IDLE))

    def _ingest(self, notify: NotifyConfig, cluster: str) -> bool:
        """One pass over new journal lines; True when there may be more."""
        done = read_pass(self.ctx.engines.reader, notify, cluster, time.time())
        if done is None:
            return False
        self.ctx.writer.call(lambda conn: apply_pass(conn, done))
        return done.until - done.seen >= BATCH

    def _deliver(self, notify: NotifyConfig) -> float:
        """Send the due deliveries not already in flight; seconds until the next one is due."""
        now = time.time()
        d = schema.notify_deliveries
        with self.ctx.engines.reader.connect() as conn:
            due = conn.execute(
                select(d).where(d.c.state == "pending", d.c.next_at <= now).order_by(d.c.next_at).limit(100)
            ).all()
            later = conn.execute(
                select(func.min(d.c.next_at)).where(d.c.state == "pending", d.c.next_at > now)
            ).scalar()
        for row in due:
            if row.id not in self.in_flight:
                self.in_flight[row.id] = self.pool.submit(self._attempt, notify, row)
        return (later - now) if later is not None else IDLE

    def _attempt(self, notify: NotifyConfig, row: Any) -> None:
        try:
            if self.stopping.is_set() or not self._still_due(row):
                return
            outcome = send(self.http, notify, row)
            if self.stopping.is_set():  # the writer may be gone: the attempt is not counted
                return
            self.ctx.writer.call(lambda conn: record(conn, notify, row, outcome, time.time()))
        except Exception:
            log.exception("delivery %s", row.id)
        finally:
            self.in_flight.pop(row.id, None)
            self.wakeup.set()

    def _still_due(self, row: Any) -> bool:
        """False when the row changed since it was read (an attempt that ended meanwhile settled
        it): a stale read must not send it again."""
        d = schema.notify_deliveries
        with self.ctx.engines.reader.connect() as conn:
            now = conn.execute(select(d.c.state, d.c.attempts).where(d.c.id == row.id)).first()
        return now is not None and now.state == "pending" and now.attempts == row.attempts


def prune(conn: Connection, before: float) -> int:
    """Remove settled deliveries made before `before` (pending ones are never removed)."""
    d = schema.notify_deliveries
    return int(conn.execute(delete(d).where(d.c.state != "pending", d.c.created_at < before)).rowcount)


def record(conn: Connection, notify: NotifyConfig, row: Any, outcome: Outcome, now: float) -> None:
    """Write an attempt's outcome, guarded by the attempts seen (a stale outcome changes nothing)."""
    d = schema.notify_deliveries
    attempts = row.attempts + 1
    values: dict[str, Any] = {"attempts": attempts, "last_error": outcome.error}
    if outcome.ok:
        values.update(state="delivered", delivered_at=now)
    elif outcome.final:
        values.update(state="dropped")
    elif attempts >= notify.max_attempts:
        values.update(state="failed")
    else:
        values.update(next_at=now + backoff(notify, attempts))
    changed = conn.execute(
        update(d)
        .where(d.c.id == row.id, d.c.state == "pending", d.c.attempts == row.attempts)
        .values(**values)
    ).rowcount
    if changed != 1:
        return
    if not outcome.ok:
        FAILURES.labels(row.sink).inc()
        log.warning(
            "webhook %s to sink %s failed (attempt %d): %s", row.id, row.sink, attempts, outcome.error
        )
    state = values.get("state")
    if state is None:
        RETRIES.labels(row.sink).inc()
    else:
        DELIVERIES.labels(row.sink, state).inc()


class NotifyCollector(Collector):
    """Deliveries waiting, by sink, and the age of the oldest one (from the database at scrape time)."""

    def __init__(self, reader: Engine) -> None:
        self.reader = reader

    def collect(self) -> Iterator[Metric]:
        d = schema.notify_deliveries
        with self.reader.connect() as conn:
            rows = conn.execute(
                select(d.c.sink, func.count(), func.min(d.c.created_at))
                .where(d.c.state == "pending")
                .group_by(d.c.sink)
            ).all()
        depth = GaugeMetricFamily(
            "corral_notify_queue_depth", "Webhook deliveries waiting, by sink", labels=["sink"]
        )
        oldest = GaugeMetricFamily(
            "corral_notify_oldest_pending_seconds",
            "Age of the oldest waiting delivery, by sink",
            labels=["sink"],
        )
        now = time.time()
        for sink, count, created in rows:
            depth.add_metric([sink], count)
            oldest.add_metric([sink], max(0.0, now - created))
        yield from (depth, oldest)
