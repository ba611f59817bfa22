"""The FastAPI application: `/healthz`, `/metrics`, and the API under `/v1` (DESIGN.md 4.7, 6.6).

Every route but `/healthz` and the dashboard's page shell and assets (`dashboard.py`: they hold
no data) needs a bearer token. Mutating calls leave an audit record (who, what, result),
written through the same group commit as the change. Request bodies are capped
(`MAX_BODY` bytes). Database reads run in the thread pool, writes in the group-commit writer:
nothing blocks the event loop on the database.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import SQLAlchemyError
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.server import (
    api_acct,
    api_admin,
    api_agents,
    api_config,
    api_dashboard,
    api_jobs,
    api_logs,
    api_nodes,
    api_terminal,
    dashboard,
    history,
)
from corral.server.api_jobs import submit_job
from corral.server.api_metrics import render
from corral.server.auth import Principal
from corral.server.bearer import authenticate
from corral.server.context import Context
from corral.server.dashboard import is_public
from corral.server.errors import ApiError
from corral.server.leader import role
from corral.server.liveness import Liveness
from corral.server.notify import Notifications
from corral.server.responses import (
    client_address,
    invalid_request,
    json_response,
    out_of_range,
    throttled,
    too_deep,
    too_large,
)

MAX_BODY = 1 << 20  # 1 MiB
UNAUDITED = ("/heartbeat",)
AGENT_TRAFFIC = ("/reports",)  # an agent's reports: audited only when refused (a 4xx says something)


class BodyLimit:
    """Refuses request bodies over `limit` bytes with 413, whether or not Content-Length is sent."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await too_large(self.limit)(scope, receive, send)
                return
        seen, over, answered = 0, False, False

        async def limited() -> Message:
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    over = True
                    raise ApiError(413, f"request body over {self.limit} bytes", fix="send a smaller body")
            return message

        async def checked(message: Message) -> None:
            # FastAPI turns an error while reading the body into its own 400: the answer is 413
            nonlocal answered
            if not over:
                answered = True
                await send(message)

        try:
            await self.app(scope, limited, checked)
        except ApiError:
            if not over:
                raise
        if over and not answered:
            await too_large(self.limit)(scope, receive, send)


def create_app(ctx: Context) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        ctx.notifier.bind(asyncio.get_running_loop())
        ctx.start()
        liveness = Liveness(ctx)  # declares silent nodes lost
        liveness.start()
        notifications = Notifications(ctx)  # webhook deliveries (server/notify.py)
        notifications.start()
        yield
        notifications.close()
        liveness.close()
        ctx.close()

    app = FastAPI(
        title="Corral",
        version="1",
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        description="GPU cluster scheduler: jobs, nodes, queues, agents. "
        "Every route but /healthz needs a bearer token.",
    )
    app.state.ctx = ctx

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> Response:
        return json_response(exc.body(), exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> Response:
        error = invalid_request(exc.errors())
        return json_response(error.body(), error.status)

    @app.exception_handler(RecursionError)
    @app.exception_handler(OverflowError)
    async def _out_of_range(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RecursionError | OverflowError)
        error = out_of_range(exc)
        return json_response(error.body(), error.status)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> Response:
        body: dict[str, Any] = {"ok": True, "uptime_s": round(time.monotonic() - ctx.started, 3)}
        try:
            body.update(await run_in_threadpool(_role, ctx))
        except SQLAlchemyError as exc:  # the API answers; the database does not
            body.update(ok=False, database=f"unreachable: {exc.__class__.__name__}")
            return json_response(body, 503)
        return json_response(body)

    @app.get("/metrics", tags=["health"])
    async def metrics_route() -> Response:
        body, content_type = await run_in_threadpool(render, ctx)
        return Response(body, media_type=content_type)

    # FastAPI's own /openapi.json, /docs and /redoc would answer without a token (DESIGN.md 6.6):
    # they are off, and the schema is served here behind the token; there is no browsable UI.
    @app.get("/openapi.json", tags=["health"], include_in_schema=False)
    async def openapi_route() -> Response:
        return json_response(app.openapi())

    for module in (
        api_jobs,
        api_logs,
        api_nodes,
        api_agents,
        api_admin,
        api_config,
        api_dashboard,
        api_acct,
        api_terminal,
        history,
    ):
        app.include_router(module.router, prefix="/v1")
    dashboard.install(app)
    app.add_middleware(Gate, ctx=ctx)
    return app


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(400, "the client went away before sending the body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body over {limit} bytes", fix="send a smaller body")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (the first), decoded as Latin-1 as HTTP's bytes are."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


class Gate:
    """Every request passes here first (pure ASGI, no per-request task): the body limit, the
    token (before FastAPI reads a body; `/healthz` and the dashboard's shell excepted), and after
    the answer an audit record for each mutating call, written in the next group commit."""

    def __init__(self, app: ASGIApp, ctx: Context) -> None:
        self.inner = BodyLimit(app)
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # the terminal channel (`server/api_terminal.py`)
            from corral.server.api_terminal import gate

            await gate(self.ctx, scope, receive, send, self.inner)
            return
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        path: str = scope["path"]
        state = scope.setdefault("state", {})
        try:
            if not is_public(scope["method"], path):
                state["principal"] = await authenticate(self.ctx, scope)
        except ApiError as exc:
            wait = self.ctx.auth_failures.fail(client_address(scope), time.monotonic())
            if wait > 0:  # no audit row either: a flood of failures does not flood the audit log
                await throttled(wait)(scope, receive, send)
                return
            await json_response(exc.body(), exc.status)(scope, receive, send)
            self._audit(scope, state, exc.status)
            return
        if path == "/v1/jobs" and scope["method"] == "POST":
            status = await self._submit(scope, receive, send, state["principal"])
            self._audit(scope, state, status)
            return
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.inner(scope, receive, sending)
        except ApiError as exc:
            status = exc.status
            await json_response(exc.body(), exc.status)(scope, receive, send)
        finally:
            self._audit(scope, state, status)

    async def _submit(self, scope: Scope, receive: Receive, send: Send, who: Principal) -> int:
        """`POST /v1/jobs`, the hot route, without FastAPI's generic request handling (about half
        of the API's CPU per submission): the same checks and writes as the declared route."""
        try:
            body = await _read_body(receive, MAX_BODY)
            try:
                spec = json.loads(body)
            except ValueError as exc:
                raise ApiError(
                    422, f"invalid request: the body is not JSON ({exc})", fix="send a job spec"
                ) from None
            except RecursionError:
                raise too_deep() from None
            if not isinstance(spec, dict):
                raise ApiError(422, "invalid request: the body is not a JSON object", fix="send a job spec")
            try:
                key = _header(scope, b"idempotency-key")
                response = json_response(*await submit_job(self.ctx, who, spec, key))
            except (RecursionError, OverflowError) as exc:
                raise out_of_range(exc) from None
        except ApiError as exc:
            response = json_response(exc.body(), exc.status)
        await response(scope, receive, send)
        return response.status_code

    def _audit(self, scope: Scope, state: dict[str, Any], status: int) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        if method not in ("POST", "PUT", "PATCH", "DELETE") or path.endswith(UNAUDITED):
            return
        if path.endswith(AGENT_TRAFFIC) and status < 400:
            return
        who = state.get("principal")
        parts = path.strip("/").split("/")
        row = {
            "t": time.time(),
            "principal": who.name if who else "(anonymous)",
            "action": f"{method} {path}",
            "target": parts[2] if len(parts) > 2 else "",
            "result": str(status),
            "detail": state.get("audit_detail", ""),
        }
        self.ctx.writer.submit_many(self.ctx.insert_audit, row)


def _role(ctx: Context) -> dict[str, Any]:
    with ctx.engines.reader.connect() as conn:
        return role(conn, ctx.replica)
