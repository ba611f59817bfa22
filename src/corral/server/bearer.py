"""Who is calling: the bearer token of an HTTP request or a WebSocket, checked against the token
store (cached). The gate of `app.py` and the terminal channel's gate both use it."""

from __future__ import annotations

from fastapi.concurrency import run_in_threadpool
from starlette.types import Scope

from corral.server.auth import Principal
from corral.server.context import Context
from corral.server.errors import ApiError


async def authenticate(ctx: Context, scope: Scope) -> Principal:
    """The caller, from `Authorization: Bearer <token>`; 401 when absent, unknown or revoked."""
    header = ""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            header = value.decode("latin-1")
            break
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "no token: send the header `Authorization: Bearer <token>`",
            fix="set CORRAL_TOKEN (or run `corral up`, which writes one to your config); "
            "admins make tokens with `corral token create`",
        )
    token = token.strip()
    cached = ctx.tokens.cached(token)
    found = cached if not isinstance(cached, bool) else await run_in_threadpool(ctx.tokens.lookup, token)
    if found is None:
        raise ApiError(
            401, "the token is unknown or revoked", fix="ask an admin for a new one (`corral token create`)"
        )
    return found
