"""What an attempt's end means for its job: the ending event, the job's next state, the backoff
before a restart (DESIGN.md 4.4 and 5). The scheduler decides it; `commit.Batch.ends` writes it."""

from __future__ import annotations

import time
from typing import Any

RESTART_BACKOFF = 10.0
RESTART_BACKOFF_MAX = 300.0
# an attempt lost before any node reported it running (its node could not launch it: the lease
# had expired) is a disruption, but one that may repeat at once on the same node: the job waits
# LAUNCH_BACKOFF, doubling to LAUNCH_BACKOFF_MAX, and fails after LAUNCH_LOSSES in a row
LAUNCH_BACKOFF = 1.0
LAUNCH_BACKOFF_MAX = 60.0
LAUNCH_LOSSES = 5


class Ending:
    """What an attempt's end means for its job: the event, the job's next state, the backoff."""

    __slots__ = ("event", "exit_code", "launch_losses", "log_tail", "not_before", "rank", "reason", "state")

    def __init__(
        self,
        event: str,
        state: str,
        reason: str = "",
        exit_code: int | None = None,
        rank: int | None = None,
        not_before: float = 0.0,
        log_tail: str = "",
        launch_losses: int | None = None,
    ) -> None:
        self.event, self.state, self.reason = event, state, reason
        self.exit_code, self.rank, self.not_before = exit_code, rank, not_before
        self.log_tail = log_tail
        self.launch_losses = launch_losses  # the job's new count of losses before launch (None: as is)

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
    launch_losses: int | None = None,
) -> Ending:
    """DESIGN.md 4.4 and 5: an exit after a stop order never counts against `max_restarts`.

    `report` is the agent's `exited` report: `exit_code`, `rank`, and where the agent knows more,
    `why` (`time_limit`: it enforced the job's limit; `setup`: the attempt could not be set up on
    the node, a mount source or the user missing, which no restart can fix; `launch`: a rank did
    not start; `lost`: the node lost the workers, or could not launch them), `message`, and
    `log_tail` (the last lines of the failing rank's log).

    `launch_losses` is given when the attempt had not been reported running by any node: the
    job's losses before launch in a row so far. Such a `lost` backs off and counts (`lost_unlaunched`).
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
    if why == "lost" and launch_losses is not None:
        return lost_unlaunched(message, launch_losses + 1, exit_code, rank, now)
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


def lost_unlaunched(message: str, losses: int, exit_code: int | None, rank: int | None, now: float) -> Ending:
    """The `losses`-th attempt in a row lost before it launched: `lost` with a backoff before the
    next placement, or, at LAUNCH_LOSSES, `fail` (so no job loops between placement and loss)."""
    what = message or "lost before it launched"
    if losses >= LAUNCH_LOSSES:
        reason = (
            f"not launched {losses} times in a row (last: {what}); its nodes' agents could not keep"
            " their lease with the control plane: check `corral nodes`, then submit it again"
        )
        return Ending("fail", "failed", reason, exit_code, rank, launch_losses=losses)
    backoff = min(LAUNCH_BACKOFF * 2 ** (losses - 1), LAUNCH_BACKOFF_MAX)
    reason = f"{what} ({losses} of {LAUNCH_LOSSES} in a row; next try in {backoff:.0f} s)"
    return Ending("lost", "pending", reason, exit_code, rank, now + backoff, launch_losses=losses)
