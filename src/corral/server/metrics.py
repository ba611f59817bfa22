"""Prometheus metrics (prometheus-client). The scheduler runs in its own process, so the
server and the scheduler share them through prometheus-client's multiprocess mode
(`PROMETHEUS_MULTIPROC_DIR`, set by `corral server` before either imports this module);
gauges that describe the cluster are computed from the database at scrape time instead."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

CYCLE_SECONDS = Histogram(
    "corral_scheduling_cycle_seconds",
    "Duration of one scheduling cycle (the core's schedule() call)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
ADMISSION_WAIT = Histogram(
    "corral_admission_wait_seconds",
    "Time from a job's submission to the start of an attempt",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
)
PREEMPTIONS = Counter("corral_preemptions_total", "Attempts told to stop for another job", ["reason"])
ENDINGS = Counter(
    "corral_attempt_endings_total",
    "Attempts ended, by ending event (finish, fail, restart, ...) and reason",
    ["event", "reason"],
)
SUBMISSIONS = Counter("corral_submissions_total", "Submissions answered, by HTTP status", ["status"])
CONFIG_REFUSED = Counter(
    "corral_config_refused",
    "Configuration revisions the scheduler could not apply and refused (the last good one stayed in force)",
)
LEASE_RENEWALS = Counter("corral_leader_lease_renewals", "Renewals of the leader lease by this replica")
LEASE_RENEW_FAILURES = Counter("corral_leader_lease_renew_failures", "Lease renewals that failed (no answer)")
LEADER_TAKEOVERS = Counter("corral_leader_takeovers", "Times this replica's scheduler took the leader lease")
STALE_COMMITS_REFUSED = Counter(
    "corral_stale_commits_refused",
    "Scheduler commits refused: the lease was no longer this scheduler's (a newer epoch, or not renewed)",
)
REASON_WRITE_SECONDS = Histogram(
    "corral_reason_write_seconds",
    "Duration of one transaction writing waiting jobs' reasons (a chunk of at most 500 rows)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
REASON_ROWS = Counter("corral_reason_rows_total", "Waiting jobs' reasons written (rows of the jobs table)")
