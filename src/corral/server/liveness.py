"""Which nodes are alive (DESIGN.md 5, 6.1): silence measured on the API's monotonic clock from
heartbeat receive times, a fresh 30 s for every node after a server start, planned maintenance.

A node silent for half of `LOST_AFTER` (15 s of 30; its lease is 20 s) is marked not responding:
the scheduler gives it no new work, since its agent may be past its lease and would refuse to
launch. After a server start no node has been heard yet: `mark_unheard` marks them all not
responding until each one's first heartbeat (placement waits for it), while being declared lost
still counts from the start.

A registered node that is `up`, `cordoned` or `draining` and silent for `LOST_AFTER` seconds is
marked `lost` (an `x.node` journal entry); the scheduler then ends its attempts as `lost` and
requeues them (they resume from their newest checkpoint). The node's agent, when it comes back,
is refused until it registers again, and is readmitted only clean (see `registration.py`).

`corral admin maintenance --for 10m` stores when maintenance ends; until then heartbeats grant
leases that last past it (so fences keep workers alive through a planned control-plane outage),
and no node is declared lost until `LOST_AFTER` after it ends.

GPU health: the agent's heartbeat says which GPUs are unhealthy; a change is written to the node
row (the scheduler allocates none of them), the node is drained with the reason, and each
attempt on a newly unhealthy GPU is stopped by the checkpoint contract and requeued (a
disruption, which does not count against `max_restarts`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.exc import OperationalError

from corral.protocol import StopWhy
from corral.server.allocations import attempts_on
from corral.server.attempts import requeue_attempt
from corral.server.cluster import get_setting, put_setting
from corral.server.context import Context
from corral.server.heard import SharedHeard, heard_recently
from corral.store import schema
from corral.store.engine import append_events, dumps

log = logging.getLogger("corral.server")

LOST_AFTER = 30.0
LEASE = 20.0
CHECK_EVERY = 1.0
NOT_RESPONDING = 0.5  # of lost-after: silent this long, a node takes no new work (15 s of 30 s)
WATCHED = ("up", "cordoned", "draining")
WATCHED_MAX_AGE = 5.0  # seconds the watched node names are reused for (also after a change elsewhere)
MAINTENANCE_KEY = "maintenance.until"


def maintenance_until(ctx: Context) -> float:
    """Unix time planned maintenance ends (0: none), cached in the context."""
    return ctx.maintenance


def lease_for(ctx: Context) -> float:
    """Seconds of lease a heartbeat grants now: two thirds of the time before a node is lost (20 of
    30 s), so a cut-off node's workers are dead before their work runs elsewhere; through the end
    of planned maintenance when there is one."""
    lease = ctx.lost_after * 2 / 3 if ctx.lost_after else LEASE
    return max(lease, maintenance_until(ctx) - time.time() + lease)


def set_maintenance(ctx: Context, conn: Connection, seconds: float) -> float:
    until = time.time() + seconds if seconds > 0 else 0.0
    put_setting(conn, MAINTENANCE_KEY, repr(until))
    ctx.maintenance = until
    return until


def load_maintenance(ctx: Context) -> None:
    with ctx.engines.reader.connect() as conn:
        ctx.maintenance = float(get_setting(conn, MAINTENANCE_KEY, "0") or 0.0)


def set_responding(ctx: Context, conn: Connection, names: list[str], responding: bool) -> list[str]:
    """Mark registered nodes (not) responding; the scheduler gives a node that is not responding no
    new work (Slurm's NOT_RESPONDING). Returns the nodes that changed."""
    n = schema.nodes
    changed = []
    for name in names:
        if conn.execute(
            update(n)
            .where(n.c.name == name, n.c.registered.is_(True), n.c.responding.is_(not responding))
            .values(responding=responding)
        ).rowcount:
            changed.append(name)
    if changed:
        ctx.journal(conn, [{"event": "x.node", "node": x, "responding": responding} for x in changed])
    return changed


def mark_unheard(conn: Connection, now: float) -> list[str]:
    """At a server start: every registered node that is up, cordoned or draining is marked not
    responding until its first heartbeat to this process (which sets it back, `api_agents.heartbeat`).
    The heartbeat receive times died with the last process: a node that has not been heard since
    may be past its lease (its fence has killed its work, and it would refuse to launch), so the
    scheduler places nothing there meanwhile. Being declared lost still waits `LOST_AFTER` from the
    start (`Liveness.check`), so no node is lost sooner for it. Journalled as one entry without a
    `node` (a scheduler that runs on in another process reloads its state on it). With several
    replicas on PostgreSQL, nodes another replica heard within `heard.RECENT` seconds are left
    alone: their agents hold live leases, and a replica's restart must not stop the cluster's
    placements."""
    n = schema.nodes
    heard = (n.c.registered.is_(True), n.c.responding.is_(True), n.c.state.in_(WATCHED))
    names = list(conn.execute(select(n.c.name).where(*heard)).scalars())
    recent = heard_recently(conn)  # another replica heard them: they are in their leases
    names = [x for x in names if x not in recent]
    if names:
        conn.execute(update(n).where(*heard, n.c.name.in_(names)).values(responding=False))
        entry = {"t": now, "event": "x.node", "unheard": len(names), "responding": False}
        append_events(conn, [entry], conn.dialect.name == "sqlite")
    return names


def _mark_lost(ctx: Context, conn: Connection, names: list[str], silence: dict[str, float]) -> list[str]:
    n = schema.nodes
    lost = []
    for name in names:
        reason = f"no heartbeat for {silence[name]:.0f} s (lost after {ctx.lost_after:.0f} s)"
        changed = conn.execute(
            update(n)
            .where(n.c.name == name, n.c.registered.is_(True), n.c.state.in_(WATCHED))
            .values(state="lost", reason=reason, responding=False, updated_at=time.time())
        ).rowcount
        if changed:
            lost.append(name)
            entry = {"event": "x.node", "node": name, "state": "lost", "reason": reason}
            ctx.journal(conn, [{**entry, "ends_attempts": True}])
    return lost


class Liveness:
    """A thread of the API process that declares silent nodes lost."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="corral-liveness", daemon=True)
        # the watched node names, re-read when a node changed in this process (`nodes_version`) or
        # after WATCHED_MAX_AGE (a change made by another process): 10,000 names a second cost
        # 9 % of the API's CPU at 10,000 agents
        self._watched: list[str] = []
        self._watched_key: tuple[int, float] | None = None
        self.shared = SharedHeard(ctx)  # receive times shared with the other replicas (`heard.py`)

    def start(self) -> None:
        load_maintenance(self.ctx)
        n = schema.nodes
        with self.ctx.engines.reader.connect() as conn:  # drained for survivors before a restart
            self.ctx.node_status.unclean.update(
                conn.execute(
                    select(n.c.name).where(n.c.state == "draining", n.c.reason.startswith(UNCLEAN))
                ).scalars()
            )
            self.ctx.node_status.went_silent(
                conn.execute(
                    select(n.c.name).where(n.c.registered.is_(True), n.c.responding.is_(False))
                ).scalars()
            )
        self.thread.start()

    def close(self) -> None:
        self.stop.set()

    def _run(self) -> None:
        while not self.stop.wait(CHECK_EVERY):
            try:
                self.shared.tick()
            except Exception as exc:  # the database is away: judged on this replica's times meanwhile
                log.warning("could not share heartbeat times: %s", exc)
            try:
                self.check()
            except OperationalError as exc:  # the database is away (failing over): said, not a traceback
                log.warning("liveness check: the database did not answer (%s)", exc.__class__.__name__)
            except Exception:  # the next round tries again; a dead thread would lose nodes silently
                log.exception("liveness check")

    def watched(self, now: float) -> list[str]:
        """Registered nodes that are up, cordoned or draining (cached, see `__init__`)."""
        key = self._watched_key
        if key is None or key[0] != self.ctx.nodes_version or now - key[1] > WATCHED_MAX_AGE:
            version = self.ctx.nodes_version  # read first: a change during the query re-reads next time
            n = schema.nodes
            with self.ctx.engines.reader.connect() as conn:
                rows = conn.execute(
                    select(n.c.name, n.c.state, n.c.responding).where(n.c.registered.is_(True))
                ).all()
            self._watched = [r.name for r in rows if r.state in WATCHED]
            self._watched_key = (version, now)
            if not self.ctx.engines.is_sqlite:  # another replica may have marked a node: follow it
                silent = {r.name for r in rows if r.state in WATCHED and not r.responding}
                self.ctx.node_status.sync(silent, {r.name for r in rows if r.state == "lost"})
        return self._watched

    def check(self) -> list[str]:
        """Mark silent nodes not responding, then lost; returns the names of the lost ones."""
        ctx = self.ctx
        now = time.monotonic()
        quiet_until = maintenance_until(ctx)
        after = ctx.lost_after
        if quiet_until and time.time() < quiet_until + after:
            return []
        status = ctx.node_status
        silence = {name: status.silence(name, now) for name in self.watched(now)}
        # never lost (`--lost-after 0`): still no new work once the lease (LEASE) may have passed
        threshold = after * NOT_RESPONDING if after else LEASE * 3 / 4
        quiet = [x for x, s in silence.items() if s > threshold and x not in status.silent]
        if quiet:  # no new work: an agent this silent may be past its lease and could not launch it
            marked = ctx.writer.submit(lambda conn: set_responding(ctx, conn, quiet, False)).result()
            status.went_silent(quiet)
            for name in marked:
                log.warning("node %s not responding: no heartbeat for %.0f s", name, silence[name])
            if marked:
                ctx.invalidate_model()
        if not after:
            return []
        silent = [name for name, quiet in silence.items() if quiet > after]
        if not silent:
            return []
        lost = ctx.writer.submit(lambda conn: _mark_lost(ctx, conn, silent, silence)).result()
        for name in lost:
            status.declared_lost(name)
            log.warning("node %s lost: no heartbeat for %.0f s", name, silence[name])
        if lost:
            ctx.invalidate_model()
        return list(lost)


def apply_gpu_health(
    ctx: Context, conn: Connection, node: str, unhealthy: dict[str, str]
) -> dict[str, Any] | None:
    """Write a node's changed GPU health: drain it with the reason, and stop each attempt on a newly
    unhealthy GPU so that it is requeued. None when nothing changed."""
    n = schema.nodes
    row = conn.execute(select(n.c.unhealthy, n.c.state, n.c.reason).where(n.c.name == node)).first()
    if row is None:
        return None
    before: dict[str, str] = json.loads(row.unhealthy or "{}")
    if before == unhealthy:
        return None
    values: dict[str, Any] = {"unhealthy": dumps(unhealthy), "updated_at": time.time()}
    new = sorted(set(unhealthy) - set(before), key=int)
    if new and row.state == "up":
        first = new[0]
        values.update(state="draining", reason=f"GPU {first} unhealthy: {unhealthy[first]}")
    conn.execute(update(n).where(n.c.name == node).values(**values))
    stopped = []
    if new:
        by = f"unhealthy GPU {node}:{','.join(new)}"
        for x in attempts_on(conn, node, [int(g) for g in new]):
            if requeue_attempt(ctx, conn, x.job, x.attempt, x.placement, x.grace, 0.0, by, StopWhy.GPU):
                stopped.append(x.job)
    state = values.get("state", row.state)
    ctx.journal(conn, [{"event": "x.node", "node": node, "state": state, "unhealthy": unhealthy}])
    return {"unhealthy": unhealthy, "stopped": stopped, "state": state}


UNCLEAN = "unclean: "


def apply_unclean(ctx: Context, conn: Connection, node: str, stuck: list[str]) -> None:
    """Processes the agent could not kill: the node drains (no new work) until they are gone,
    then takes work again, unless someone changed its state meanwhile."""
    n = schema.nodes
    row = conn.execute(select(n.c.state, n.c.reason).where(n.c.name == node)).first()
    if row is None:
        return
    if stuck and row.state == "up":
        reason = UNCLEAN + "processes of " + ", ".join(stuck[:5]) + " survived their kill"
        conn.execute(update(n).where(n.c.name == node).values(state="draining", reason=reason))
        ctx.journal(conn, [{"event": "x.node", "node": node, "state": "draining", "reason": reason}])
    elif not stuck and row.state == "draining" and row.reason.startswith(UNCLEAN):
        conn.execute(update(n).where(n.c.name == node).values(state="up", reason=""))
        ctx.journal(conn, [{"event": "x.node", "node": node, "state": "up"}])
    ctx.node_status.set_unclean(node, bool(stuck))
