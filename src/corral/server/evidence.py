"""Evidence kept with a configuration change (`corral queues set --what-if`, `corral admin policy
--what-if`): the what-if's summary and report name, stored with the new revision and written in
the audit log; or, when the change is forced without one, the reason given.

A server started with `--require-evidence-days N` refuses (409 `evidence_required`) a change
that carries no what-if over a window of at least N days, unless it is forced with a reason.
Rollbacks are never refused: they are how an operator recovers from a bad change.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field
from starlette.requests import Request

from corral.server.errors import ApiError

EVIDENCE_REQUIRED = "evidence_required"


class WhatIf(BaseModel):
    """What `corral whatif` found, as the CLI sends it with the change."""

    window_days: float = Field(ge=0, le=366, description="length of the replayed window, in days")
    jobs: int = Field(ge=0, description="jobs of the window replayed")
    summary: str = Field(max_length=4000, description="one paragraph: fidelity and the main differences")
    fidelity: float | None = Field(
        None, description="baseline's worst per-queue |avg wait error|, as a fraction"
    )
    report: str = Field("", max_length=200, description="the HTML report's name (`corral whatif --report`)")
    details: dict[str, Any] | None = Field(
        None, description="the comparison as `corral whatif --json` prints it"
    )


class Decision(BaseModel):
    """What a change may carry besides itself: its evidence, or a forced reason."""

    evidence: WhatIf | None = None
    force: bool = False
    reason: str = Field("", max_length=2000)


def required_days(request: Request) -> float:
    return float(getattr(request.app.state, "require_evidence_days", 0) or 0)


def vet(request: Request, decision: Decision) -> tuple[str, str]:
    """(JSON to store with the revision, text for the audit log); ApiError when refused."""
    days = required_days(request)
    what_if = decision.evidence
    if decision.force and not decision.reason.strip():
        raise ApiError(
            422, "--force needs a reason", fix='add --reason "why this change cannot wait for a what-if"'
        )
    enough = what_if is not None and what_if.window_days >= days
    if days and not enough and not decision.force:
        found = "no what-if" if what_if is None else f"a what-if over {what_if.window_days:g} days"
        raise ApiError(
            409,
            f"this server requires a what-if over at least {days:g} days for every configuration"
            f" change; got {found}",
            fix=f"add --what-if --since {days:g}d, or --force --reason TEXT",
            code=EVIDENCE_REQUIRED,
        )
    stored: dict[str, Any] = {}
    notes: list[str] = []
    if what_if is not None:
        stored["what_if"] = what_if.model_dump(exclude_none=True)
        notes.append(f"what-if over {what_if.window_days:.3g} days, {what_if.jobs} jobs: {what_if.summary}")
        if what_if.report:
            notes.append(f"report {what_if.report}")
    if decision.force:
        stored["forced"] = {"reason": decision.reason, "required_days": days}
        notes.append(f"forced: {decision.reason}")
    return (json.dumps(stored, separators=(",", ":")) if stored else ""), "; ".join(notes)


def loads(text: str | None) -> dict[str, Any] | None:
    """The stored evidence of a revision (None when none was given)."""
    if not text:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
