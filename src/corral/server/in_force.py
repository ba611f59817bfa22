"""Which configuration revision is in force (DESIGN.md 6.6): the active one when the scheduler
can apply it to the live work, else the last good one. A revision it cannot apply (not a valid
cluster file, an unknown policy, a queue that live jobs use missing: the API refuses those, but
a revision may reach the database another way) is refused and reported, never crash-looped on:
`config.active` goes back to the revision in force (only if nobody changed it meanwhile), the
setting `config.refused` says which and why (`GET /v1/config`, `/metrics`), and an audit record
and an `x.config_refused` journal entry are written.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import NoResultFound

from corral.core.errors import ConfigError
from corral.core.estimates import Estimator
from corral.core.jobs import PendingJob
from corral.core.model import JobSpec
from corral.core.plugins import Profile
from corral.core.state import ClusterState
from corral.policies.registry import load_policy
from corral.server import metrics
from corral.server.cluster import ClusterModel, get_setting, load_cluster, put_setting
from corral.server.restore import restore_attempt
from corral.store import schema
from corral.store.engine import append_events, dumps

log = logging.getLogger("corral.scheduler")
MAX_WALK = 50  # older revisions tried, newest first, when neither the active nor the last good applies
# what a bad stored document raises (NoResultFound: `config.active` names a revision that is gone)
BROKEN = (ConfigError, KeyError, ValueError, TypeError, IndexError, NoResultFound)


class NoRevisionApplies(Exception):
    """No stored revision can hold the live work (the scheduler waits for a new one)."""


@dataclass
class InForce:
    """The revision the scheduler applies, its policy and state, and what was refused on the way."""

    model: ClusterModel
    profile: Profile
    state: ClusterState
    submitted: list[tuple[PendingJob, Any]]  # pending jobs put in the state, with their rows
    refused: tuple[int, str] | None = None  # the active revision, when it is not the one in force
    left_out: list[str] = field(default_factory=list)  # pending jobs of queues the revision lacks


def candidates(conn: Connection, last_good: int) -> list[int]:
    """Revisions to try, in order: the active one, the last one applied, then older ones."""
    text = get_setting(conn, "config.active") or "0"
    active = int(text) if text.isdigit() else 0
    c = schema.config_revisions
    older = conn.execute(
        select(c.c.id).where(c.c.id < active).order_by(c.c.id.desc()).limit(MAX_WALK)
    ).scalars()
    order = [active, *([last_good] if last_good >= 0 else []), *older]
    return list(dict.fromkeys(order))


def _reason(exc: BaseException) -> str:
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


def _missing_queues(model: ClusterModel, live: Sequence[Any], pending: list[tuple[JobSpec, Any]]) -> str:
    queues = {q.name for q in model.config.queues}
    missing: dict[str, list[str]] = {}
    for row in live:
        queue = str(json.loads(row.spec)["queue"])
        if queue not in queues:
            missing.setdefault(queue, []).append(f"{row.job_id} ({row.state})")
    for spec, _ in pending:
        if spec.queue not in queues:
            missing.setdefault(spec.queue, []).append(f"{spec.id} (pending)")
    return "; ".join(
        f"queue {q} is not in it, but live jobs use it: {', '.join(jobs[:10])}" for q, jobs in missing.items()
    )


def build(
    conn: Connection,
    revision: int,
    live: Sequence[Any],
    pending: list[tuple[JobSpec, Any]],
    default_policy: str,
    strict: bool,
    estimator: Estimator | None = None,
) -> InForce:
    """The scheduling state under `revision`; raises one of BROKEN when it cannot hold the live
    work (`strict`: pending jobs too; otherwise pending jobs of missing queues are left out)."""
    model = load_cluster(conn, revision)
    profile = load_policy(str(model.body.get("policy", default_policy)), model.body.get("policy_args"))
    queues = {q.name for q in model.config.queues}
    missing = _missing_queues(model, live, pending if strict else [])
    if missing:
        raise ConfigError(missing)
    state = model.build_state()
    state.estimator = estimator  # before the jobs: each is estimated as it is queued or restored
    for attempt in live:
        restore_attempt(state, attempt)
    submitted, left_out = [], []
    for spec, row in pending:
        if spec.queue not in queues:
            left_out.append(str(spec.id))
            continue
        submitted.append((queue_pending(state, spec, row), row))
    return InForce(model, profile, state, submitted, left_out=left_out)


def queue_pending(state: ClusterState, spec: JobSpec, row: Any) -> PendingJob:
    """Put a pending job read back from the database in the state (`scheduler_db.pending_jobs`).

    A job that ran before waits again from its last attempt's end, as it did in memory before the
    restart (`ClusterState.end`: aging counts from there, as Slurm's age factor counts from the
    time a job became eligible, not its submission), and keeps its attained service."""
    ran, requeued_at = getattr(row, "ran", None), getattr(row, "requeued_at", None)
    attained = spec.gpus * max(0.0, float(ran)) if ran is not None else 0.0
    queued_at = float(requeued_at) if requeued_at is not None else None
    return state.submit(spec, attempts=row.attempt, attained=attained, queued_at=queued_at)


def choose(
    conn: Connection,
    live: Sequence[Any],
    pending: list[tuple[JobSpec, Any]],
    default_policy: str,
    last_good: int,
    estimator: Estimator | None = None,
) -> InForce:
    """The newest applicable revision among `candidates`; NoRevisionApplies when none is."""
    order = candidates(conn, last_good)
    why: dict[int, str] = {}
    for strict in (True, False):  # leave pending jobs out only when no revision holds them all
        for revision in order:
            try:
                found = build(conn, revision, live, pending, default_policy, strict, estimator)
            except BROKEN as exc:
                why.setdefault(revision, _reason(exc))
                continue
            if revision != order[0]:
                found.refused = (order[0], why.get(order[0], "it cannot be applied"))
            return found
    raise NoRevisionApplies(
        "no stored configuration revision can hold the live jobs: "
        + "; ".join(f"revision {r}: {w}" for r, w in why.items())
    )


def report_refusal(conn: Connection, refused: tuple[int, str], in_force: int, is_sqlite: bool) -> list[int]:
    """Record that the scheduler refused revision `refused[0]`; returns the journal seqs written."""
    revision, reason = refused
    now = time.time()
    s = schema.settings
    conn.execute(
        update(s).where(s.c.key == "config.active", s.c.value == str(revision)).values(value=str(in_force))
    )
    body = {"revision": revision, "reason": reason, "at": now, "in_force": in_force}
    put_setting(conn, "config.refused", dumps(body))
    conn.execute(
        insert(schema.audit).values(
            t=now,
            principal="scheduler",
            action=f"refuse configuration revision {revision}",
            target="config",
            result="refused",
            detail=f"{reason}; revision {in_force} stays in force",
        )
    )
    rows = append_events(conn, [{"event": "x.config_refused", **body}], is_sqlite)
    metrics.CONFIG_REFUSED.inc()
    log.error(
        "configuration revision %d refused: %s; revision %d stays in force (fix it and apply a new one)",
        revision,
        reason,
        in_force,
    )
    return [int(r["seq"]) for r in rows]


def load_view(conn: Connection) -> ClusterModel:
    """The API's view: the active revision, or (a stored document that is not a valid cluster
    file, before the scheduler refused it) the newest one that is."""
    try:
        return load_cluster(conn)
    except BROKEN:
        pass
    for revision in candidates(conn, -1)[1:]:
        try:
            return load_cluster(conn, revision)
        except BROKEN:
            continue
    return load_cluster(conn, 0)
