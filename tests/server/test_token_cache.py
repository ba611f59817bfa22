"""The token cache (`corral.server.auth.TokenCache`): heartbeats are served from memory for
minutes, a revocation through the API drops the entry at once, and a lookup that raced with a
revocation is not kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.server.auth import CACHE_SECONDS, TokenCache, create_token, revoke_token
from corral.store.engine import make_engines, upgrade


def test_entries_outlive_heartbeats_and_revocation_drops_them(tmp_path: Path) -> None:
    engines = make_engines(f"sqlite:///{tmp_path / 'corral.db'}")
    upgrade(engines)
    try:
        with engines.writer.begin() as conn:
            token_id, token = create_token(conn, "n1", "agent", node="n1")
        cache = TokenCache(engines.reader)
        assert CACHE_SECONDS * 0.75 > 60  # far longer than the 5 s heartbeat interval
        assert cache.cached(token) is False
        who = cache.lookup(token)
        assert who is not None and who.node == "n1" and cache.cached(token) == who
        with engines.writer.begin() as conn:
            assert revoke_token(conn, token_id)
        assert cache.cached(token) == who  # not seen yet: the API forgets after its commit
        cache.forget(token_id)
        assert cache.cached(token) is False and cache.lookup(token) is None

        # a lookup that read the row before a revocation committed, and stores after it forgot
        with engines.writer.begin() as conn:
            token_id, token = create_token(conn, "n2", "agent", node="n2")
        connect = cache.reader.connect

        def racing() -> Any:
            conn = connect()
            cache.forget(token_id)  # the revocation commits and forgets while this read runs
            return conn

        cache.reader = type("Reader", (), {"connect": staticmethod(racing)})()
        assert cache.lookup(token) is not None  # the row as read
        assert cache.cached(token) is False  # but not kept
    finally:
        engines.dispose()
