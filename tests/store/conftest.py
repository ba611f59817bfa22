"""The store's tests run on SQLite and on PostgreSQL, as the control plane's do."""

from tests.server.conftest import database_url

__all__ = ["database_url"]
