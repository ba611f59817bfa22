"""The control plane's tables (SQLAlchemy Core). Alembic revisions under `migrations/` create them.

Rules that live in the schema (DESIGN.md 6.2):
- `allocations` has a unique index on (node, gpu) over live rows only, so a GPU given twice
  is a database error in SQLite and PostgreSQL alike, whatever the code above does.
- `attempt_nodes` names every node of every attempt (GPUs or not): what runs on a node is read
  there, never decoded from `attempts.placement`.
- `events` is the one ordered journal: the event log of DESIGN.md 4.6 plus internal kinds
  (prefixed `x.`) that the scheduler tails; `seq` order is commit order (writers serialise).
- `jobs.version` guards every change to a job: writers update `WHERE version = :seen`.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    text,
)

metadata = MetaData()

jobs = Table(
    "jobs",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), nullable=False, unique=True),
    Column("name", String(200), nullable=False, server_default=""),
    Column("queue", String(200), nullable=False),
    Column("user", String(200), nullable=False, server_default=""),
    Column("team", String(200), nullable=False, server_default=""),
    Column("run_as", String(200), nullable=False, server_default=""),
    Column("state", String(16), nullable=False),
    Column("attempt", Integer, nullable=False, server_default="0"),
    Column("version", Integer, nullable=False, server_default="1"),
    Column("held", Boolean, nullable=False, server_default=text("false")),
    Column("restarts", Integer, nullable=False, server_default="0"),
    Column("not_before", Float, nullable=False, server_default="0"),
    # attempts in a row that ended `lost` before any node reported them running (their node could
    # not launch them, e.g. its lease had expired): each backs off longer, and a budget ends it
    Column("launch_losses", Integer, nullable=False, server_default="0"),
    Column("submit_time", Float, nullable=False),
    Column("start_time", Float),
    Column("end_time", Float),
    Column("exit_code", Integer),
    Column("reason_code", String(32), nullable=False, server_default=""),
    Column("reason", Text, nullable=False, server_default=""),
    Column("reason_at", Float),  # the time the reason names (a reservation's start, a backoff's end)
    Column("spec", Text, nullable=False),  # the scheduling spec (JobSpec fields), JSON
    Column("request", Text, nullable=False),  # what the user asked for (command, env, mounts...), JSON
    # a task of a job array (server/arrays.py): the array's id and the task's index
    Column("array_id", String(64)),
    Column("array_task", Integer),
    # conditions on other jobs before it may start, JSON (server/dependencies.py); "" for none
    Column("dependency", Text, nullable=False, server_default=""),
    Index("ix_jobs_state", "state"),
    Index("ix_jobs_array", "array_id"),
    Index("ix_jobs_queue_state", "queue", "state"),
    Index("ix_jobs_team_seq", "team", "seq"),  # `corral acct` for a member
    Index("ix_jobs_user_seq", "user", "seq"),
    Index("ix_jobs_end_time", "end_time"),
)

arrays = Table(
    "arrays",
    metadata,
    Column("id", String(64), primary_key=True),  # the id of its first task's row, e.g. j12 (tasks j12_0...)
    Column("spec", Text, nullable=False),  # as submitted, e.g. 0-99%8
    Column("tasks", Integer, nullable=False),
    Column("max_running", Integer, nullable=False, server_default="0"),  # %N; 0: no cap
    Column("team", String(200), nullable=False, server_default=""),
    Column("created_at", Float, nullable=False),
)

attempts = Table(
    "attempts",
    metadata,
    Column("job_id", String(64), ForeignKey("jobs.id"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("state", String(16), nullable=False),  # starting, running, stopping, ended
    Column("placement", Text, nullable=False),
    Column("master_port", Integer),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float),
    Column("end_kind", String(16)),  # the ending event: finish, fail, preempt, lost, restart, cancel
    Column("exit_code", Integer),
    Column("rank", Integer),
    Column("stop_kind", String(16)),  # why it is stopping: preempt, cancel, requeue, time_limit, drain
    Column("stop_by", String(64)),
    Column("deadline", Float),
    Column("last_checkpoint", Float),
    PrimaryKeyConstraint("job_id", "attempt"),
    Index("ix_attempts_state", "state"),
)

allocations = Table(
    "allocations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(64), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("node", String(200), nullable=False),
    Column("gpu", Integer, nullable=False),
    Column("live", Integer),  # 1 while allocated, NULL once released
    Index(
        "ux_allocations_live_gpu",
        "node",
        "gpu",
        unique=True,
        sqlite_where=text("live = 1"),
        postgresql_where=text("live = 1"),
    ),
    Index("ix_allocations_job", "job_id", "attempt"),
)

attempt_nodes = Table(
    # one row per node of an attempt, 0-GPU attempts included: the one answer to "which
    # attempts run on node N" (server/allocations.py); `master` marks the node of replica 0,
    # whose master port (attempts.master_port) a new attempt there must not take (DESIGN.md 4.3)
    "attempt_nodes",
    metadata,
    Column("job_id", String(64), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("node", String(200), nullable=False),
    Column("master", Boolean, nullable=False, server_default=text("false")),
    PrimaryKeyConstraint("job_id", "attempt", "node"),
    Index("ix_attempt_nodes_node", "node"),
)

nodes = Table(
    "nodes",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("state", String(16), nullable=False),
    Column("reason", Text, nullable=False, server_default=""),
    Column("gpus", Integer, nullable=False),
    Column("gpu_model", String(100), nullable=False, server_default=""),
    Column("gpu_memory_gib", Float, nullable=False, server_default="0"),
    Column("cpus", Integer, nullable=False, server_default="0"),
    Column("memory_gib", Float, nullable=False, server_default="0"),
    Column("labels", Text, nullable=False, server_default="{}"),
    Column("nvlink", Text, nullable=False, server_default="[]"),
    Column("network", Text, nullable=False, server_default="{}"),
    Column("address", String(200), nullable=False, server_default=""),
    Column("declared", Boolean, nullable=False, server_default=text("false")),
    Column("registered", Boolean, nullable=False, server_default=text("false")),
    Column("incarnation", Integer, nullable=False, server_default="0"),
    Column("unhealthy", Text, nullable=False, server_default="{}"),  # GPU index -> reason
    Column("drain_deadline", Float),
    Column("updated_at", Float, nullable=False, server_default="0"),
    # where the agent serves worker logs, and the token it registered with (whose hash keys the
    # signature the server puts on log requests; see corral.agent.logserver)
    Column("logs_url", String(300), nullable=False, server_default=""),
    Column("agent_token", String(32), nullable=False, server_default=""),
    # false while a registered node has been silent for half of lost-after: no new work (Slurm's
    # NOT_RESPONDING); its state is untouched and its first heartbeat sets it back
    Column("responding", Boolean, nullable=False, server_default=text("true")),
)

events = Table(
    "events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("t", Float, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("job", String(64)),
    Column("body", Text, nullable=False),
    Index("ix_events_job", "job"),
)

outbox = Table(
    "outbox",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("node", String(200), nullable=False),
    Column("body", Text, nullable=False),
    Index("ix_outbox_node_seq", "node", "seq"),
)

config_revisions = Table(
    "config_revisions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("created_at", Float, nullable=False),
    Column("author", String(200), nullable=False),
    Column("comment", Text, nullable=False, server_default=""),
    Column("body", Text, nullable=False),  # the cluster file as a JSON document
    # what the change was decided on: a what-if's summary (and report), or why it was forced
    # without one (JSON; empty when none was given). See server/evidence.py.
    Column("evidence", Text, nullable=False, server_default=""),
)

settings = Table(
    "settings",
    metadata,
    Column("key", String(100), primary_key=True),
    Column("value", Text, nullable=False),
)

tokens = Table(
    "tokens",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("hash", String(64), nullable=False, unique=True),
    Column("name", String(200), nullable=False),
    Column("role", String(16), nullable=False),  # admin, member, agent
    Column("team", String(200), nullable=False, server_default=""),
    Column("node", String(200), nullable=False, server_default=""),
    Column("run_as", String(200), nullable=False, server_default=""),
    Column("created_at", Float, nullable=False),
    Column("created_by", String(200), nullable=False, server_default=""),
    Column("revoked_at", Float),
)

audit = Table(
    "audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("t", Float, nullable=False),
    Column("principal", String(200), nullable=False),
    Column("action", String(100), nullable=False),
    Column("target", String(200), nullable=False, server_default=""),
    Column("result", String(200), nullable=False),
    Column("detail", Text, nullable=False, server_default=""),
)

reasons = Table(
    "reasons",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(64), nullable=False),
    Column("t", Float, nullable=False),
    Column("code", String(32), nullable=False),
    Column("message", Text, nullable=False),
    Column("at", Float),  # the time the message names, if any
    Index("ix_reasons_job", "job_id"),
)

# webhook notifications waiting, sent or given up (server/notify.py): one row per (journal event,
# sink), made in the transaction that moves the notifier's cursor (`notify.cursor` setting), so
# a restart neither loses nor repeats one; `id` is the delivery id receivers deduplicate by
notify_deliveries = Table(
    "notify_deliveries",
    metadata,
    Column("id", String(120), primary_key=True),
    Column("sink", String(64), nullable=False),
    Column("event_seq", Integer, nullable=False),
    Column("job", String(64), nullable=False),
    Column("kind", String(16), nullable=False),  # start, end, fail, preempt, restart
    Column("body", Text, nullable=False),  # the exact bytes sent (and signed), every attempt
    Column("state", String(16), nullable=False),  # pending, delivered, failed (gave up), dropped
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_at", Float, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("delivered_at", Float),
    Column("last_error", Text, nullable=False, server_default=""),
    Index("ix_notify_deliveries_state_next", "state", "next_at"),
    Index("ix_notify_deliveries_job", "job"),
)

# a client's `Idempotency-Key` on a submission (server/idempotency.py): written in the transaction
# that writes the job, so a retry of a request whose answer was lost finds the job it made; one
# key per submitting user; rows older than the key's lifetime (24 h) are deleted
idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("user", String(200), nullable=False),
    Column("key", String(255), nullable=False),
    Column("digest", String(64), nullable=False),  # SHA-256 of the request body (canonical JSON)
    Column("job_id", String(64), nullable=False),  # the job, or the job array, it made
    Column("created_at", Float, nullable=False),
    Index("ux_idempotency_user_key", "user", "key", unique=True),
    Index("ix_idempotency_created", "created_at"),
)

# the scheduler's leader lease (one row, id 1; `server/leader.py`): who decides, under which
# epoch (raised by every takeover: the fencing token every scheduler commit checks), and until
# when (the database's clock, Unix seconds)
leader = Table(
    "leader",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("holder", String(200), nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("since", Float, nullable=False),  # when this epoch began
)

# when each node was last heard of by any API replica (the database's clock), written in batches
# by every replica (`server/heard.py`), so a node's liveness does not depend on which replica its
# heartbeats reach
node_heard = Table(
    "node_heard",
    metadata,
    Column("node", String(200), primary_key=True),
    Column("heard_at", Float, nullable=False),
)

# one-time dashboard login codes (`dashboard.LoginLinks`): any replica may redeem a code another
# made. The token is stored sealed with the code (only the code's SHA-256 is stored)
login_codes = Table(
    "login_codes",
    metadata,
    Column("hash", String(64), primary_key=True),
    Column("sealed", Text, nullable=False),
    Column("expires_at", Float, nullable=False),
)
