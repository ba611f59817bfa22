"""What every route asks of its request: the server's context and the caller (set by the gate)."""

from __future__ import annotations

from fastapi import Request

from corral.server.auth import Principal
from corral.server.context import Context
from corral.server.errors import ApiError


def ctx_of(request: Request) -> Context:
    ctx: Context = request.app.state.ctx
    return ctx


def who_of(request: Request) -> Principal:
    who: Principal = request.state.principal
    return who


def require_admin(who: Principal, what: str) -> None:
    if not who.is_admin:
        raise ApiError(403, f"only an admin may {what}", fix="ask a cluster admin")
