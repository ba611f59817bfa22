"""Tokens and principals (DESIGN.md 6.6).

A token is 256 random bits (`secrets.token_urlsafe(32)`) behind a short public id; only its
SHA-256 is stored (not bcrypt: a slow hash would cap the API at dozens of requests per second,
and a random 256-bit secret needs no stretching). Lookups are cached for a few seconds;
revoking through this process drops the cache entry at once.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, insert, select, update

from corral.store import schema

ROLES = ("admin", "member", "agent")
CACHE_SECONDS = 5.0


@dataclass(frozen=True)
class Principal:
    """Who is calling: a name, a role, and the team (member) or node (agent) it is bound to."""

    name: str
    role: str
    team: str = ""
    node: str = ""
    run_as: str = ""
    token_id: str = ""

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """A fresh (public id, secret token); the token embeds the id so `token list` can show it."""
    token_id = "t" + secrets.token_hex(6)
    return token_id, f"crl_{token_id}_{secrets.token_urlsafe(32)}"


def create_token(
    conn: Connection, name: str, role: str, *, team: str = "", node: str = "", run_as: str = "", by: str = ""
) -> tuple[str, str]:
    """Store a new token; returns (id, secret). The secret is shown once and never stored."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; use one of: {', '.join(ROLES)}")
    token_id, token = new_token()
    conn.execute(
        insert(schema.tokens).values(
            id=token_id,
            hash=digest(token),
            name=name,
            role=role,
            team=team,
            node=node,
            run_as=run_as,
            created_at=time.time(),
            created_by=by,
        )
    )
    return token_id, token


def revoke_token(conn: Connection, token_id: str) -> bool:
    t = schema.tokens
    result = conn.execute(
        update(t).where(t.c.id == token_id, t.c.revoked_at.is_(None)).values(revoked_at=time.time())
    )
    return result.rowcount == 1


class TokenCache:
    """SHA-256 of a token -> Principal, read through to the database every few seconds."""

    def __init__(self, reader: Engine) -> None:
        self.reader = reader
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Principal | None]] = {}

    def cached(self, token: str) -> Principal | bool | None:
        """The cached answer without touching the database; False when there is none."""
        hit = self._entries.get(digest(token))
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        return False

    def lookup(self, token: str) -> Principal | None:
        key = digest(token)
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        t = schema.tokens
        with self.reader.connect() as conn:
            row = conn.execute(select(t).where(t.c.hash == key)).first()
        who = None
        if row is not None and row.revoked_at is None:
            who = Principal(row.name, row.role, row.team, row.node, row.run_as, row.id)
        with self._lock:
            if len(self._entries) > 100_000:
                self._entries.clear()
            self._entries[key] = (now + CACHE_SECONDS, who)
        return who

    def forget(self, token_id: str) -> None:
        with self._lock:
            for key, (_, who) in list(self._entries.items()):
                if who is not None and who.token_id == token_id:
                    del self._entries[key]
