"""The terminal channel: a shell inside a running job (`corral alloc`, `corral attach`), relayed.

Two WebSockets meet here, both authenticated like every other call (bearer tokens, the server's
TLS): the user's (`/v1/jobs/{id}/terminal`: members only into their team's jobs, admins into
any; agents never) and the agent's (`/v1/agents/{node}/terminals/{session}`: only the agent of
the node the session was ordered on). The server checks the user's right to the job before
anything is asked of a node; only then does it put a `terminal` order in the node's outbox (the
agent's long poll, so agents keep making only outbound connections), and the agent opens its
WebSocket back. Bytes are relayed unchanged both ways: binary frames are the terminal's input
and output; text frames are JSON control messages (`resize` from the user; `exit` and `error`
from the agent). Sessions are bounded: at most `MAX_PER_JOB` at once per job, closed after
`IDLE_S` seconds without traffic either way, frames of at most `MAX_FRAME` bytes; each open,
refusal and close leaves an audit record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, WebSocket
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect

from corral.protocol import TerminalOrder
from corral.server.auth import Principal
from corral.server.bearer import authenticate
from corral.server.context import Context
from corral.server.errors import ApiError
from corral.server.responses import client_address
from corral.store import schema
from corral.store.engine import dumps

router = APIRouter(tags=["terminal"])

MAX_PER_JOB = 4  # shells open at once into one job
IDLE_S = float(os.environ.get("CORRAL_TERMINAL_IDLE_S", "3600"))  # no byte either way this long: closed
AGENT_WAIT_S = 30.0  # the node's agent must open its side this soon after the order
MAX_FRAME = 1 << 16
SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def _future() -> asyncio.Future[WebSocket]:
    return asyncio.get_running_loop().create_future()


@dataclass
class Session:
    """One terminal: who opened it, where it runs, and the agent's side once it has connected."""

    id: str
    job: str
    attempt: int
    node: str
    rank: int
    by: str
    opened: float = field(default_factory=time.monotonic)
    agent: asyncio.Future[WebSocket] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    done: asyncio.Event = field(default_factory=asyncio.Event)
    last: float = field(default_factory=time.monotonic)
    exit_code: int | None = None


def sessions_of(ws: WebSocket) -> dict[str, Session]:
    state = ws.app.state
    if not hasattr(state, "terminals"):
        state.terminals = {}
    found: dict[str, Session] = state.terminals
    return found


def audit(ctx: Context, who: str, action: str, target: str, result: int, detail: str = "") -> None:
    row = {
        "t": time.time(),
        "principal": who,
        "action": action,
        "target": target,
        "result": str(result),
        "detail": detail,
    }
    ctx.writer.submit_many(ctx.insert_audit, row)


async def deny(scope: Scope, receive: Receive, send: Send, exc: ApiError) -> None:
    """Refuse a WebSocket before it opens: an HTTP answer with the API's error body where the
    server can send one (uvicorn can), else a close with a policy-violation code."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        body = json.dumps(exc.body()).encode()
        await send(
            {
                "type": "websocket.http.response.start",
                "status": exc.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "websocket.close", "code": 1008, "reason": exc.message[:120]})


async def gate(ctx: Context, scope: Scope, receive: Receive, send: Send, inner: Any) -> None:
    """The gate's part for WebSockets: the token, as for every request (401 and the throttle of
    failed authentications alike), before any route sees the connection."""
    try:
        scope.setdefault("state", {})["principal"] = await authenticate(ctx, scope)
    except ApiError as exc:
        refusal = exc
        wait = ctx.auth_failures.fail(client_address(scope), time.monotonic())
        if wait > 0:  # no audit row either: a flood of failures does not flood the audit log
            refusal = ApiError(429, "too many failed authentications from this address", fix="wait, retry")
        else:
            audit(ctx, "(anonymous)", f"WS {scope['path']}", "", exc.status)
        await deny(scope, receive, send, refusal)
        return
    await inner(scope, receive, send)


def _where(ctx: Context, who: Principal, job_id: str, rank: int) -> tuple[int, str]:
    """(attempt, node) of the rank of a running job the caller may enter; ApiError otherwise."""
    j, a = schema.jobs, schema.attempts
    with ctx.engines.reader.connect() as conn:
        row = conn.execute(select(j.c.team, j.c.state, j.c.attempt).where(j.c.id == job_id)).first()
        if row is None:
            raise ApiError(404, f"no job {job_id}", fix="list yours with `corral jobs`")
        if not (who.is_admin or row.team == who.team):
            raise ApiError(
                403,
                f"job {job_id} belongs to another team: you may open a shell only in your team's jobs",
                fix="ask the job's team or an admin",
            )
        if row.state != "running":
            raise ApiError(
                409,
                f"job {job_id} is {row.state}: a shell opens only inside a running job",
                fix="wait until `corral show` says running" if row.state in ("pending", "starting") else "",
            )
        placement = conn.execute(
            select(a.c.placement).where(a.c.job_id == job_id, a.c.attempt == row.attempt)
        ).scalar_one()
    replicas: list[dict[str, Any]] = json.loads(placement)
    if not 0 <= rank < len(replicas):
        raise ApiError(404, f"job {job_id} has ranks 0 to {len(replicas) - 1}, not {rank}", fix="pass --rank")
    return int(row.attempt), str(replicas[rank]["node"])


def _int(ws: WebSocket, name: str, default: int, low: int, high: int) -> int:
    text = ws.query_params.get(name)
    try:
        value = default if text is None else int(text)
    except ValueError:
        raise ApiError(422, f"{name} must be an integer, not {text!r}") from None
    if not low <= value <= high:
        raise ApiError(422, f"{name} must be between {low} and {high}, not {value}")
    return value


def _order(session: Session, ws: WebSocket) -> dict[str, Any]:
    term = ws.query_params.get("term") or "xterm"
    if not re.fullmatch(r"[A-Za-z0-9._+-]{1,64}", term):
        raise ApiError(422, f"term {term!r} is not a terminal type", fix="send e.g. term=xterm-256color")
    order = TerminalOrder(
        job=session.job,
        attempt=session.attempt,
        rank=session.rank,
        session=session.id,
        rows=_int(ws, "rows", 24, 1, 1000),
        cols=_int(ws, "cols", 80, 1, 1000),
        term=term,
        end=ws.query_params.get("end") in ("1", "true"),
    )
    return order.model_dump(mode="json", exclude={"seq"})


@router.websocket("/jobs/{job_id}/terminal")
async def job_terminal(ws: WebSocket, job_id: str) -> None:
    """A shell inside the job, on the node of rank `rank` (query: `rank`, `rows`, `cols`, `term`,
    `end=1` to end an allocation when the shell exits)."""
    ctx: Context = ws.app.state.ctx
    who: Principal = ws.scope["state"]["principal"]
    target = f"WS /v1/jobs/{job_id}/terminal"
    try:
        if who.role == "agent":
            raise ApiError(403, "agent tokens may not open terminals", fix="use a member or admin token")
        rank = _int(ws, "rank", 0, 0, 1 << 20)
        attempt, node = await run_in_threadpool(_where, ctx, who, job_id, rank)
        sessions = sessions_of(ws)
        if sum(s.job == job_id for s in sessions.values()) >= MAX_PER_JOB:
            raise ApiError(429, f"job {job_id} has {MAX_PER_JOB} terminals open", fix="close one first")
        session = Session(secrets.token_urlsafe(18), job_id, attempt, node, rank, who.name)
        order = _order(session, ws)
    except ApiError as exc:
        audit(ctx, who.name, target, job_id, exc.status, exc.message)
        await deny(ws.scope, ws.receive, ws.send, exc)
        return
    sessions[session.id] = session
    try:
        await ctx.write(
            lambda conn: conn.execute(schema.outbox.insert().values(node=node, body=dumps(order)))
        )
        detail = f"session {session.id[:8]} rank {rank} node {node}" + (
            " (allocation)" if order["end"] else ""
        )
        audit(ctx, who.name, "terminal open", job_id, 101, detail)
        await ws.accept()
        await _serve(ctx, ws, session)
    finally:
        sessions.pop(session.id, None)
        session.done.set()
        took = time.monotonic() - session.opened
        audit(
            ctx,
            who.name,
            "terminal close",
            job_id,
            200,
            f"session {session.id[:8]} exit {session.exit_code} after {took:.0f} s",
        )


async def _serve(ctx: Context, user: WebSocket, session: Session) -> None:
    try:
        agent = await asyncio.wait_for(asyncio.shield(session.agent), AGENT_WAIT_S)
    except TimeoutError:
        said = f"node {session.node} did not open the terminal in {AGENT_WAIT_S:.0f} s: is its agent up?"
        await _say(user, {"type": "error", "message": said})
        await _close(user)
        return
    idle = asyncio.create_task(_idle(session))
    tasks = [
        asyncio.create_task(_pump(user, agent, session, from_agent=False)),
        asyncio.create_task(_pump(agent, user, session, from_agent=True)),
        idle,
    ]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    if idle in done:
        said = f"the terminal was closed after {IDLE_S:.0f} s without traffic"
        await _say(user, {"type": "error", "message": said})
    for ws in (user, agent):
        await _close(ws)


async def _pump(source: WebSocket, sink: WebSocket, session: Session, *, from_agent: bool) -> None:
    """Copy frames from `source` to `sink` until either closes (or a frame is too large)."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while True:
            message = await source.receive()
            if message["type"] == "websocket.disconnect":
                return
            data, text = message.get("bytes"), message.get("text")
            if len(data or b"") + len(text or "") > MAX_FRAME:
                return
            session.last = time.monotonic()
            if data is not None:
                await sink.send_bytes(data)
            elif text is not None:
                if from_agent:
                    with contextlib.suppress(ValueError, TypeError, AttributeError):
                        said = json.loads(text)
                        if said.get("type") == "exit":
                            session.exit_code = int(said["code"])
                await sink.send_text(text)


async def _idle(session: Session) -> None:
    while True:
        left = session.last + IDLE_S - time.monotonic()
        if left <= 0:
            return
        await asyncio.sleep(min(left, 5.0))


async def _say(ws: WebSocket, message: dict[str, Any]) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await ws.send_text(json.dumps(message))


async def _close(ws: WebSocket) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await ws.close()


@router.websocket("/agents/{node}/terminals/{session_id}")
async def agent_terminal(ws: WebSocket, node: str, session_id: str) -> None:
    """The agent's side of a session ordered on its node; open until the session ends."""
    ctx: Context = ws.app.state.ctx
    who: Principal = ws.scope["state"]["principal"]
    session = sessions_of(ws).get(session_id) if SESSION_ID.match(session_id) else None
    refusal = None
    if who.role != "agent" or who.node != node:
        refusal = ApiError(403, f"only node {node}'s agent may open its terminals")
    elif session is None or session.node != node or session.agent.done():
        refusal = ApiError(404, f"no terminal session {session_id[:8]} waits for node {node}")
    if refusal is not None or session is None:
        assert refusal is not None
        audit(ctx, who.name, f"WS /v1/agents/{node}/terminals", node, refusal.status, refusal.message)
        await deny(ws.scope, ws.receive, ws.send, refusal)
        return
    await ws.accept()
    session.agent.set_result(ws)
    await session.done.wait()
