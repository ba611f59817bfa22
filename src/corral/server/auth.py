"""Tokens and principals (DESIGN.md 6.6).

A token is 256 random bits (`secrets.token_urlsafe(32)`) behind a short public id; only its
SHA-256 is stored (not bcrypt: a slow hash would cap the API at dozens of requests per second,
and a random 256-bit secret needs no stretching). Lookups are cached for CACHE_SECONDS (about
five minutes, longer than an agent's heartbeat interval, so heartbeats are served from memory).
Tokens change only through the API (`corral token revoke`, `DELETE /v1/tokens/ID`; a join token
bound at registration), whose replica drops the cache entries at once, so a revocation takes
effect with the next request there; the same transaction writes a new `tokens.changed` mark,
which every other replica reads each second and then drops its whole cache, so a revocation
holds on every replica within about a second. The expiry only bounds how long a change made
behind the API's back (an edit of the database) goes unseen.
"""

from __future__ import annotations

import hashlib
import random
import secrets
import threading
import time
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, insert, select, update

from corral.store import schema

ROLES = ("admin", "member", "agent")
CACHE_SECONDS = 300.0  # each entry lives 0.75 to 1 times this, so a fleet's misses spread out


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
    tokens_changed(conn)
    return result.rowcount == 1


CHANGED_KEY = "tokens.changed"


def tokens_changed(conn: Connection) -> None:
    """In the transaction that revokes or binds a token: a new mark in `settings`, so that every
    other replica drops its cache within a second (`changed_mark`, read by `Context`)."""
    s = schema.settings
    mark = secrets.token_hex(8)
    if conn.execute(update(s).where(s.c.key == CHANGED_KEY).values(value=mark)).rowcount == 0:
        conn.execute(insert(s).values(key=CHANGED_KEY, value=mark))


def changed_mark(conn: Connection) -> str | None:
    s = schema.settings
    return conn.execute(select(s.c.value).where(s.c.key == CHANGED_KEY)).scalar()


class TokenCache:
    """SHA-256 of a token -> Principal, read through to the database every few minutes."""

    def __init__(self, reader: Engine, seconds: float = CACHE_SECONDS) -> None:
        self.reader = reader
        self.seconds = seconds
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Principal | None]] = {}
        self._generation = 0  # bumped by forget(): a lookup that raced with it is not cached

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
        generation = self._generation
        t = schema.tokens
        with self.reader.connect() as conn:
            row = conn.execute(select(t).where(t.c.hash == key)).first()
        who = None
        if row is not None and row.revoked_at is None:
            who = Principal(row.name, row.role, row.team, row.node, row.run_as, row.id)
        with self._lock:
            if generation != self._generation:  # read before a revocation committed: not kept
                return who
            if len(self._entries) > 100_000:
                self._entries.clear()
            self._entries[key] = (now + self.seconds * random.uniform(0.75, 1.0), who)
        return who

    def clear(self) -> None:
        """Drop every entry (a token changed through another replica)."""
        with self._lock:
            self._generation += 1
            self._entries.clear()

    def forget(self, token_id: str) -> None:
        """Drop a token's entries (call after the change is committed)."""
        with self._lock:
            self._generation += 1
            for key, (_, who) in list(self._entries.items()):
                if who is not None and who.token_id == token_id:
                    del self._entries[key]
