"""Notifications made from the journal: each event a job subscribed to becomes one delivery per
sink of its queue, written in the transaction that moves the notifier's cursor.

Load, process, apply (STYLE.md): the events after the cursor are read from a reader connection,
turned into delivery rows, and written with a guard on the cursor (compare and set), so a pass
that raced another changes nothing, and a crash before the commit leaves the cursor where it
was: the next pass makes the same rows (with the same ids) again. `events.seq` order is commit
order on both databases (store/engine.py), so a cursor on `seq` never skips a late commit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select, update

from corral.config.notify_config import NotifyConfig
from corral.store import schema
from corral.store.engine import dumps

CURSOR_KEY = "notify.cursor"
INSTANCE_KEY = "notify.instance"
BATCH = 1000  # journal lines read per pass

# journal event -> the subscriptions it answers, most specific first (the delivery's kind)
ANSWERS: dict[str, tuple[str, ...]] = {
    "start": ("start",),
    "finish": ("end",),
    "fail": ("fail", "end"),
    "cancel": ("end",),
    "reject": ("end",),
    "preempt": ("preempt",),
    "lost": ("preempt",),
    "restart": ("restart",),
}
# the job's state the line leaves it in
JOB_STATE = {
    "start": "starting",
    "finish": "finished",
    "fail": "failed",
    "cancel": "cancelled",
    "reject": "rejected",
    "preempt": "pending",
    "lost": "pending",
    "restart": "pending",
}


@dataclass(frozen=True)
class Pass:
    """What one pass read: the cursor it started from, where it ends, the rows to insert."""

    seen: int
    until: int
    rows: list[dict[str, Any]]


def read_pass(reader: Engine, notify: NotifyConfig, cluster: str, now: float) -> Pass | None:
    """The deliveries for the journal lines after the cursor (at most BATCH lines); None when
    there are no new lines."""
    e, j, s = schema.events, schema.jobs, schema.settings
    with reader.connect() as conn:
        settings = dict(
            conn.execute(select(s.c.key, s.c.value).where(s.c.key.in_((CURSOR_KEY, INSTANCE_KEY)))).all()
        )
        seen = int(settings.get(CURSOR_KEY) or 0)
        instance = settings.get(INSTANCE_KEY, "")
        last = conn.execute(select(func.max(e.c.seq))).scalar() or 0
        if last <= seen:
            return None
        until = min(last, seen + BATCH)
        lines = conn.execute(
            select(e.c.seq, e.c.kind, e.c.job, e.c.body)
            .where(e.c.seq > seen, e.c.seq <= until, e.c.kind.in_(tuple(ANSWERS)))
            .order_by(e.c.seq)
        ).all()
        ids = sorted({str(line.job) for line in lines if line.job})
        jobs = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            found = conn.execute(
                select(j.c.id, j.c.name, j.c.queue, j.c.user, j.c.team, j.c.request).where(j.c.id.in_(chunk))
            ).all()
            jobs.update({row.id: row for row in found})
    rows: list[dict[str, Any]] = []
    for line in lines:
        job = jobs.get(line.job)
        if job is not None:
            rows.extend(deliveries(line, job, notify, cluster, instance, now))
    return Pass(seen, until, rows)


def deliveries(
    line: Any, job: Any, notify: NotifyConfig, cluster: str, instance: str, now: float
) -> list[dict[str, Any]]:
    """The delivery rows of one journal line for one job: none unless the job subscribed to
    what the line answers and its queue has sinks."""
    subscribed = _subscriptions(job.request)
    answered = [kind for kind in ANSWERS[line.kind] if kind in subscribed]
    if not answered:
        return []
    event = json.loads(line.body)
    out = []
    for sink in notify.sinks_for(job.queue):
        delivery = f"{instance}-{line.seq}-{sink.name}" if instance else f"{line.seq}-{sink.name}"
        body = {
            "id": delivery,
            "kind": answered[0],
            "subscribed": answered,
            "sink": sink.name,
            "cluster": cluster,
            "job": {
                "id": job.id,
                "name": job.name,
                "queue": job.queue,
                "user": job.user,
                "team": job.team,
                "state": JOB_STATE[line.kind],
            },
            "event": event,
            "created_at": now,
        }
        out.append(
            {
                "id": delivery,
                "sink": sink.name,
                "event_seq": int(line.seq),
                "job": job.id,
                "kind": answered[0],
                "body": dumps(body),
                "state": "pending",
                "attempts": 0,
                "next_at": now,
                "created_at": now,
                "last_error": "",
            }
        )
    return out


def _subscriptions(request: str) -> Sequence[str]:
    if '"notify"' not in request:  # a job from before the field, or one without it: skip parsing
        return ()
    try:
        value = json.loads(request).get("notify") or ()
    except ValueError:
        return ()
    return value if isinstance(value, list) else ()


def apply_pass(conn: Connection, done: Pass) -> int:
    """Write a pass's deliveries and move the cursor, if the cursor is still where the pass read
    it (else nothing: another pass got there first). Returns the deliveries written."""
    s = schema.settings
    moved = conn.execute(
        update(s).where(s.c.key == CURSOR_KEY, s.c.value == str(done.seen)).values(value=str(done.until))
    ).rowcount
    if moved != 1:
        if done.seen != 0 or conn.execute(select(s.c.value).where(s.c.key == CURSOR_KEY)).first() is not None:
            return 0
        conn.execute(insert(s).values(key=CURSOR_KEY, value=str(done.until)))
    if done.rows:
        conn.execute(insert(schema.notify_deliveries), done.rows)
    return len(done.rows)
