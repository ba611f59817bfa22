"""The web dashboard: its page shell and static assets, and the exchange of one-time login links.

The shell (`/`, `/login`) and the assets under `/ui/` hold no data, so they are served without
a token; every piece of data comes from the `/v1` API, which the page calls with the bearer
token it keeps in the tab's sessionStorage. `POST /login` trades a one-time code (made by
`POST /v1/login-links`, printed by `corral up` and `corral dashboard`) for the token that made
it; codes live in the database (any replica redeems them) for an hour and work once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import Connection, delete, func, insert, select
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles

from corral.server.responses import client_address, throttled
from corral.store import schema

STATIC = Path(__file__).parent / "static"
SHELL_PATHS = ("/", "/login")
LINK_SECONDS = 3600.0
MAX_LINKS = 1000
HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


# the answer to `POST /login` holds a token: never kept by a browser or a proxy
NO_STORE = {**HEADERS, "Cache-Control": "no-store", "Pragma": "no-cache"}


def is_public(method: str, path: str) -> bool:
    """Routes the gate lets through without a token: health, the dashboard's shell, assets, login."""
    if path == "/healthz":
        return True
    if path == "/login" and method == "POST":
        return True
    return method in ("GET", "HEAD") and (path in SHELL_PATHS or path.startswith("/ui/"))


def bearer_of(header: str) -> str:
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class LoginLinks:
    """One-time codes, each standing for the token that asked for it, until used or expired.

    Kept in the database (`login_codes`), so a code made through one replica works on any other:
    only the code's SHA-256 is stored, with the token sealed by the code itself (XOR with a
    SHAKE-256 stream of the code: a 256-bit random key used once), so the table alone gives no
    token away. Redeeming deletes the row: a code works once, whichever replicas race for it."""

    def create(self, conn: Connection, token: str, now: float) -> str:
        code = secrets.token_urlsafe(32)
        c = schema.login_codes
        conn.execute(delete(c).where(c.c.expires_at <= now))
        extra = (conn.execute(select(func.count()).select_from(c)).scalar() or 0) - MAX_LINKS + 1
        if extra > 0:  # the oldest go
            oldest = select(c.c.hash).order_by(c.c.expires_at).limit(extra).scalar_subquery()
            conn.execute(delete(c).where(c.c.hash.in_(oldest)))
        sealed = _seal(code, token)
        conn.execute(insert(c).values(hash=_digest(code), sealed=sealed, expires_at=now + LINK_SECONDS))
        return code

    def redeem(self, conn: Connection, code: str, now: float) -> str | None:
        c = schema.login_codes
        key = _digest(code)
        row = conn.execute(select(c.c.sealed, c.c.expires_at).where(c.c.hash == key)).first()
        if row is None or conn.execute(delete(c).where(c.c.hash == key)).rowcount != 1:
            return None
        if row.expires_at <= now:
            return None
        return _unseal(code, row.sealed)


def _stream(code: str, length: int) -> bytes:
    return hashlib.shake_256(b"corral login code\0" + code.encode()).digest(length)


def _xor(code: str, data: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(data, _stream(code, len(data)), strict=True))


def _seal(code: str, token: str) -> str:
    return base64.b64encode(_xor(code, token.encode())).decode()


def _unseal(code: str, sealed: str) -> str:
    return _xor(code, base64.b64decode(sealed)).decode()


def _digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def links_of(app: Any) -> LoginLinks:
    links: LoginLinks = app.state.login_links
    return links


class Assets(StaticFiles):
    """The static files, revalidated on every load (a new version is picked up at once)."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update({k: v for k, v in HEADERS.items() if k != "Content-Security-Policy"})
        return response


def _error(status: int, error: str, fix: str) -> Response:
    body = json.dumps({"error": error, "fix": fix})
    return Response(
        body, status_code=status, media_type="application/json", headers={"Cache-Control": "no-store"}
    )


def install(app: FastAPI, reports_dir: Path | None = None) -> None:
    """Add the shell, the assets and `POST /login` to `app`."""
    app.state.login_links = LoginLinks()
    app.state.reports_dir = reports_dir

    async def shell() -> Response:
        return FileResponse(STATIC / "index.html", headers=HEADERS, media_type="text/html")

    for path in SHELL_PATHS:
        app.add_api_route(path, shell, methods=["GET"], include_in_schema=False)

    async def login(request: Request) -> Response:
        try:
            code = (await request.json()).get("code", "")
        except (ValueError, AttributeError):
            code = ""
        if not isinstance(code, str) or not code:
            return _error(422, 'send {"code": "..."} from a login link', "open the link `corral up` printed")
        ctx = request.app.state.ctx
        links = links_of(request.app)
        token = await ctx.write(lambda conn: links.redeem(conn, code, time.time()))
        if token is not None and await run_in_threadpool(ctx.tokens.lookup, token) is None:
            request.state.audit_detail = "login link refused: its token was revoked"
            return _error(
                401,
                "the token behind this login link was revoked",
                "ask an admin for a new token, then run `corral dashboard` for a fresh link",
            )
        request.state.audit_detail = "login link redeemed" if token else "login link refused"
        if token is None:
            wait = ctx.auth_failures.fail(client_address(request.scope), time.monotonic())
            if wait > 0:
                return throttled(wait)
            return _error(
                401,
                "this login link was used already, or has expired",
                "run `corral dashboard` for a fresh link, or sign in with a token",
            )
        return Response(json.dumps({"token": token}), media_type="application/json", headers=NO_STORE)

    app.add_api_route("/login", login, methods=["POST"], include_in_schema=False)
    app.mount("/ui", Assets(directory=STATIC), name="ui")
