"""The scenarios also run through the control plane, on the same databases as tests/server."""

from tests.server.conftest import database_url

__all__ = ["database_url"]
