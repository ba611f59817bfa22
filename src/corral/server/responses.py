"""Answers the routers and the middleware share: JSON bodies, the 422 of a request that does not
match its model, the 413 and 429 of the gate.

A module of its own so that the routers need not import `app.py`, which imports every router.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from corral.server.errors import ApiError
from corral.server.throttle import retry_after

SHAPE_FIX = "see /openapi.json for the request shape"


def json_response(content: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(content, separators=(",", ":")), status_code=status, media_type="application/json"
    )


def invalid_request(errors: Iterable[Mapping[str, Any]], prefix: str = "", empty: str = "") -> ApiError:
    """The 422 of a request that does not match its model: every problem as `where: what`.
    `prefix` names where the fields were (`query.`); `empty` names a problem with no location."""
    problems = "; ".join(f"{prefix}{'.'.join(str(p) for p in e['loc']) or empty}: {e['msg']}" for e in errors)
    return ApiError(422, f"invalid request: {problems}", fix=SHAPE_FIX)


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def throttled(wait: float) -> Response:
    """429 for an address whose failed authentications are over the limit (`server/throttle.py`)."""
    body = {
        "error": "too many failed authentications from this address",
        "fix": f"wait {retry_after(wait)} s and send a valid token (a valid token is never refused)",
    }
    return Response(
        json.dumps(body),
        status_code=429,
        media_type="application/json",
        headers={"Retry-After": retry_after(wait)},
    )


def too_deep() -> ApiError:
    return ApiError(422, "invalid request: the JSON is nested too deeply", fix="send a flatter document")


def out_of_range(exc: RecursionError | OverflowError) -> ApiError:
    """A body the checks let through but Python could not handle: a number too large, or nesting
    too deep. Answered 422, never 500."""
    if isinstance(exc, RecursionError):
        return too_deep()
    return ApiError(422, f"invalid request: a number is out of range ({exc})", fix="send smaller numbers")


def too_large(limit: int) -> JSONResponse:
    return JSONResponse(
        {"error": f"request body over {limit} bytes", "fix": "send a smaller body"}, status_code=413
    )
