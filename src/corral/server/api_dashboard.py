"""What the web dashboard asks of the API beyond the rest (`/v1`): who am I, the newest event's
seq, GPU use over time, simulation reports, and one-time login links."""

from __future__ import annotations

import html
import re
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import func, select
from starlette.responses import Response

from corral.server.auth import Principal
from corral.server.caller import ctx_of, who_of
from corral.server.context import Context
from corral.server.dashboard import LINK_SECONDS, bearer_of, links_of
from corral.server.errors import ApiError
from corral.server.jobs import queues_of
from corral.server.responses import json_response
from corral.server.series import choose_window, series
from corral.store import schema

router = APIRouter(tags=["dashboard"])
REPORT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
TITLE = re.compile(rb"<title>(.*?)</title>", re.S | re.I)
MAX_REPORT = 64 << 20


def _no_agents(who: Principal, what: str) -> None:
    if who.role == "agent":
        raise ApiError(403, f"agent tokens may not read {what}", fix="use a member or admin token")


@router.get("/whoami")
async def whoami(request: Request) -> Response:
    """The caller: name, role (admin, member, agent) and team."""
    who = who_of(request)
    return json_response({"name": who.name, "role": who.role, "team": who.team, "node": who.node})


def _latest(ctx: Context) -> int:
    with ctx.engines.reader.connect() as conn:
        return int(conn.execute(select(func.max(schema.events.c.seq))).scalar() or 0)


@router.get("/events/latest", tags=["events"])
async def latest_event(request: Request) -> Response:
    """The newest event's seq: start `GET /v1/events?after=SEQ&wait=...` from here to follow changes."""
    _no_agents(who_of(request), "the event log")
    return json_response({"seq": await run_in_threadpool(_latest, ctx_of(request))})


SERIES_REUSE_S = 2.0  # every open dashboard asks for the same series after a burst of events
_recent: dict[tuple[Any, ...], tuple[float, dict[str, Any]]] = {}


def _series(
    ctx: Context, who: Principal, since: float | None, until: float | None, span: float | None, points: int
) -> dict[str, Any]:
    key = (id(ctx), since, until, span, points, None if who.is_admin else who.team)
    found = _recent.get(key)
    if found is not None and time.monotonic() - found[0] < SERIES_REUSE_S:
        return found[1]
    out = _compute_series(ctx, who, since, until, span, points)
    if len(_recent) > 64:
        _recent.clear()
    _recent[key] = (time.monotonic(), out)
    return out


def _compute_series(
    ctx: Context, who: Principal, since: float | None, until: float | None, span: float | None, points: int
) -> dict[str, Any]:
    model, _ = ctx.model()
    now = ctx.clock()
    if span is not None:
        since = (now if until is None else until) - span
    window = choose_window(since, until, points, now)
    visible = None if who.is_admin else set(queues_of(model, who))
    with ctx.engines.reader.connect() as conn:
        out = series(conn, window, now, visible)
    out["gpus"] = sum(n.gpus for n in model.config.nodes)
    out["now"] = now
    return out


@router.get("/usage/series", tags=["queues"])
async def usage_series(
    request: Request,
    since: float | None = Query(None, description="Unix time (default: an hour before `until`)"),
    until: float | None = Query(None, description="Unix time (default: now)"),
    span: float | None = Query(
        None, gt=0, le=366 * 86400, description="seconds before `until` (instead of `since`)"
    ),
    points: int = Query(120, ge=2, le=1000, description="buckets of equal length"),
) -> Response:
    """Per queue you may use, the average GPUs allocated and waiting in each bucket; the cluster's
    GPUs allocated (all queues) and its GPU count. From the jobs and attempts the journal records."""
    who = who_of(request)
    _no_agents(who, "usage")
    return json_response(await run_in_threadpool(_series, ctx_of(request), who, since, until, span, points))


# ---- simulation reports ----------------------------------------------------------------------
WHATIF_MARK = "whatif.json"  # written beside a what-if report's index.html (sim/whatif_run.py)


def reports_dir(request: Request) -> Path | None:
    found: Path | None = getattr(request.app.state, "reports_dir", None)
    return found


def _report_path(folder: Path, name: str) -> Path | None:
    if not REPORT_NAME.match(name):
        return None
    for candidate in (folder / name / "index.html", folder / f"{name}.html"):
        if candidate.is_file():
            return candidate
    return None


def _title(path: Path) -> str:
    with path.open("rb") as f:
        found = TITLE.search(f.read(8192))
    return html.unescape(found.group(1).decode("utf-8", "replace")).strip() if found else path.parent.name


def _reports(folder: Path | None) -> list[dict[str, Any]]:
    if folder is None or not folder.is_dir():
        return []
    out: list[dict[str, Any]] = []
    for entry in sorted(folder.iterdir()):
        name = entry.name[: -len(".html")] if entry.suffix == ".html" and entry.is_file() else entry.name
        path = _report_path(folder, name)
        if path is not None and not any(r["name"] == name for r in out):
            kind = "what-if" if (path.parent / WHATIF_MARK).is_file() else "simulation"
            out.append({"name": name, "title": _title(path), "modified": path.stat().st_mtime, "kind": kind})
    return out


@router.get("/reports", tags=["dashboard"])
async def list_reports(request: Request) -> Response:
    """Simulation reports (`corral simulate --report DIR/NAME`) in the server's reports folder."""
    who = who_of(request)
    _no_agents(who, "reports")
    folder = reports_dir(request)
    out: dict[str, Any] = {"reports": await run_in_threadpool(_reports, folder)}
    if who.is_admin:
        out["folder"] = str(folder) if folder else None
    return json_response(out)


@router.get("/reports/{name}", tags=["dashboard"])
async def get_report(request: Request, name: str) -> Response:
    """One report's HTML (the dashboard shows it in its own style)."""
    _no_agents(who_of(request), "reports")
    folder = reports_dir(request)
    path = _report_path(folder, name) if folder is not None else None
    if path is None:
        raise ApiError(404, f"no report {name!r}", fix="list them with GET /v1/reports")
    if path.stat().st_size > MAX_REPORT:
        raise ApiError(413, f"report {name} is over {MAX_REPORT >> 20} MiB")
    body = await run_in_threadpool(path.read_bytes)
    # never run as a page of this origin, whatever the file holds
    headers = {"Content-Security-Policy": "sandbox"}
    return Response(body, media_type="text/html; charset=utf-8", headers=headers)


# ---- one-time login links --------------------------------------------------------------------
@router.post("/login-links", tags=["dashboard"], status_code=201)
async def make_login_link(request: Request) -> Response:
    """A one-time code that signs the dashboard in as you: open `/login#code=CODE` within the hour.
    The code is kept in the database (any replica redeems it), and works once."""
    who = who_of(request)
    _no_agents(who, "the dashboard")
    token, links = bearer_of(request.headers.get("authorization", "")), links_of(request.app)
    code = await ctx_of(request).write(lambda conn: links.create(conn, token, time.time()))
    request.state.audit_detail = f"login link for {who.name}"
    return json_response({"code": code, "path": f"/login#code={code}", "expires_in": LINK_SECONDS}, 201)
