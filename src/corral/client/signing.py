"""The signature the control plane puts on its requests to a node agent (worker logs).

Keyed with the hex SHA-256 of the agent's token: the agent knows its token, the server stores
its hash, and the token itself never crosses the wire again.
"""

from __future__ import annotations

import hashlib
import hmac

HEADER = "X-Corral-Signature"
SKEW = 60.0  # seconds a signature stays good


def token_key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def signature(key: str, when: int, target: str) -> str:
    """`target` is the request's path with its query string, exactly as sent."""
    return hmac.new(key.encode(), f"{when}:{target}".encode(), hashlib.sha256).hexdigest()


def valid(key: str, header: str, target: str, now: float) -> bool:
    when, _, mac = header.partition(":")
    if not when.isdigit() or abs(now - int(when)) > SKEW:
        return False
    return hmac.compare_digest(mac, signature(key, int(when), target))
