"""Idempotency keys on submissions (`Idempotency-Key`, the IETF httpapi draft's header).

A client that sends `POST /v1/jobs` with a key and gets no answer (a replica died after its
commit, a connection dropped) sends the same request again, to the same or another replica;
the key makes that retry return the job the first request made instead of a second job. The key
is written with the job, in the same transaction, in `idempotency_keys` (unique per submitting
user and key), and looked up inside the write transaction: writers are serialised (SQLite's
single writer; PostgreSQL's journal lock, `store/engine.py`), so two replicas racing with one
key cannot both insert. A key reused with a different body is refused (422). Keys live `TTL`
seconds (24 h); older rows are ignored, then deleted by the writer now and then (`sweep`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, delete, insert, select, tuple_

from corral.server.errors import ApiError
from corral.store import schema

__all__ = ["HEADER", "TTL", "Key", "Replay", "Seen", "find", "parse", "record", "reused", "sweep"]

HEADER = "Idempotency-Key"
TTL = 24 * 3600.0  # seconds a key is remembered
SWEEP_EVERY = 600.0  # seconds between deletions of expired keys (per process)
MAX_LENGTH = 255
_VISIBLE = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no spaces
_last_sweep = [0.0]  # the writer thread's: when this process last deleted expired keys


@dataclass(frozen=True)
class Key:
    """A submission's key: who sent it, the key, and the SHA-256 of the body it came with."""

    user: str
    key: str
    digest: str


@dataclass(frozen=True)
class Replay:
    """A key seen before: the job (or job array) it made, and whether this body is the same."""

    job_id: str
    same: bool


def parse(header: str | None, user: str, body: object) -> Key | None:
    """The request's key (None without the header); 422 for a key that is not one."""
    if header is None:
        return None
    text = header.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':  # the draft's sf-string form: "abc"
        text = text[1:-1]
    if not text or len(text) > MAX_LENGTH or not _VISIBLE.fullmatch(text):
        raise ApiError(
            422,
            f"{HEADER}: {header[:80]!r} is not a key: it must be 1 to {MAX_LENGTH} printable "
            "ASCII characters without spaces",
            fix="send a fresh random value per submission, e.g. a UUID (`corral submit` does)",
        )
    return Key(user, text, digest(body))


def digest(body: object) -> str:
    """SHA-256 of the body as canonical JSON (key order and spacing do not matter)."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))  # ASCII: lone surrogates too
    return hashlib.sha256(text.encode()).hexdigest()


Seen = dict[tuple[str, str], tuple[str, str]]  # (user, key) -> (job id, body digest)


def find(conn: Connection, keys: Sequence[Key], now: float) -> Seen:
    """The live keys among `keys` already written, with the job each made and its body's digest
    (run in the write transaction). Expired rows found are deleted, so the key may be used again."""
    wanted = {(k.user, k.key) for k in keys}
    if not wanted:
        return {}
    t = schema.idempotency_keys
    rows = conn.execute(
        select(t.c.id, t.c.user, t.c.key, t.c.digest, t.c.job_id, t.c.created_at).where(
            tuple_(t.c.user, t.c.key).in_(list(wanted))
        )
    ).all()
    out: Seen = {}
    expired = []
    for row in rows:
        if row.created_at < now - TTL:
            expired.append(row.id)
            continue
        out[(row.user, row.key)] = (row.job_id, row.digest)
    if expired:
        conn.execute(delete(t).where(t.c.id.in_(expired)))
    return out


def record(conn: Connection, made: Sequence[tuple[Key, str]], now: float) -> None:
    """Write each key with the job it made (in the transaction that writes the jobs)."""
    if made:
        conn.execute(
            insert(schema.idempotency_keys),
            [
                {"user": k.user, "key": k.key, "digest": k.digest, "job_id": job, "created_at": now}
                for k, job in made
            ],
        )
    if now - _last_sweep[0] >= SWEEP_EVERY:
        _last_sweep[0] = now
        sweep(conn, now)


def sweep(conn: Connection, now: float) -> int:
    """Delete the keys older than `TTL`; how many."""
    t = schema.idempotency_keys
    return int(conn.execute(delete(t).where(t.c.created_at < now - TTL)).rowcount or 0)


def reused(key: Key, replay: Replay) -> ApiError:
    """The refusal of a key sent again with another body."""
    return ApiError(
        422,
        f"{HEADER} {key.key!r} was already used for another submission (job {replay.job_id}) "
        "with a different body",
        fix="send a new key for a different submission; resend the same body to get that job back",
        code="idempotency_key_reused",
    )
