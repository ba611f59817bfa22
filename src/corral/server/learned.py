"""The run-time history the scheduler learns estimates from, read from its own tables at start.

No table of its own: the attempts table already holds every finished job's run time. At start
the scheduler reads the newest `LIMIT` jobs that finished or failed (the time their attempts ran,
in all) into a `corral.core.estimates.Estimator`; from then on `ClusterState.end` adds each job
that ends. So estimates survive a restart without a migration.
"""

from __future__ import annotations

from sqlalchemy import Connection, func, select

from corral.core.estimates import Estimator
from corral.server.jobs import spec_from_json
from corral.store import schema

LIMIT = 20_000  # newest finished jobs read at start (the estimator keeps 256 per key anyway)


def learned(conn: Connection, limit: int = LIMIT) -> Estimator:
    """An estimator holding the run times of the newest `limit` jobs that finished or failed."""
    j, a = schema.jobs, schema.attempts
    ran = (
        select(
            a.c.job_id,
            func.sum(a.c.ended_at - a.c.started_at).label("seconds"),
            func.max(a.c.ended_at).label("ended"),
        )
        .where(a.c.ended_at.is_not(None))
        .group_by(a.c.job_id)
        .subquery()
    )
    rows = conn.execute(
        select(j.c.spec, ran.c.seconds)
        .join(ran, ran.c.job_id == j.c.id)
        .where(j.c.state.in_(("finished", "failed")))
        .order_by(ran.c.ended.desc())
        .limit(limit)
    ).all()
    estimator = Estimator()
    for row in reversed(rows):  # oldest first: the newest are kept
        estimator.observe(spec_from_json(row.spec), max(0.0, float(row.seconds)))
    return estimator
