"""What an attempt's end means for its job: the ending event, the job's next state, the backoff
before a restart (DESIGN.md 4.4 and 5). The scheduler decides it; `commit.Batch.ends` writes it."""

from __future__ import annotations

import time
from typing import Any

RESTART_BACKOFF = 10.0
RESTART_BACKOFF_MAX = 300.0


class Ending:
    """What an attempt's end means for its job: the event, the job's next state, the backoff."""

    __slots__ = ("event", "exit_code", "log_tail", "not_before", "rank", "reason", "state")

    def __init__(
        self,
        event: str,
        state: str,
        reason: str = "",
        exit_code: int | None = None,
        rank: int | None = None,
        not_before: float = 0.0,
        log_tail: str = "",
    ) -> None:
        self.event, self.state, self.reason = event, state, reason
        self.exit_code, self.rank, self.not_before = exit_code, rank, not_before
        self.log_tail = log_tail

    @property
    def requeues(self) -> bool:
        return self.state == "pending"


def ending_of(
    stop_kind: str | None,
    stop_by: str | None,
    report: dict[str, Any],
    restarts: int,
    max_restarts: int,
    now: float | None = None,
) -> Ending:
    """DESIGN.md 4.4 and 5: an exit after a stop order never counts against `max_restarts`.

    `report` is the agent's `exited` report: `exit_code`, `rank`, and where the agent knows more,
    `why` (`time_limit`: it enforced the job's limit; `setup`: the attempt could not be set up on
    the node, a mount source or the user missing, which no restart can fix; `launch`: a rank did
    not start), `message`, and `log_tail` (the last lines of the failing rank's log).
    """
    now = time.time() if now is None else now
    exit_code, rank = report.get("exit_code"), report.get("rank")
    why, message = report.get("why") or "", report.get("message") or ""
    tail = report.get("log_tail") or ""
    if stop_kind == "preempt":
        return Ending(
            "preempt", "pending", f"preempted by {stop_by}" if stop_by else "preempted", exit_code, rank
        )
    if stop_kind == "requeue":
        return Ending("preempt", "pending", f"requeued by {stop_by or 'an operator'}", exit_code, rank)
    if stop_kind == "cancel":
        return Ending("cancel", "cancelled", f"cancelled by {stop_by or 'a user'}", exit_code, rank)
    if stop_kind == "time_limit" or why == "time_limit":
        return Ending("fail", "failed", "time_limit", exit_code, rank, log_tail=tail)
    if why == "lost":  # the node came back without the workers: a disruption, not a failure
        return Ending("lost", "pending", message or "node lost", exit_code, rank)
    if why == "setup":
        return Ending("fail", "failed", message or "the attempt could not be set up", exit_code, rank)
    if exit_code == 0:
        return Ending("finish", "finished", "", 0, None)
    what = message or f"worker exited with {exit_code}"
    if restarts < max_restarts:
        backoff = min(RESTART_BACKOFF * 2**restarts, RESTART_BACKOFF_MAX)
        return Ending("restart", "pending", what, exit_code, rank, now + backoff, log_tail=tail)
    return Ending("fail", "failed", f"{what}; no restarts left", exit_code, rank, log_tail=tail)
