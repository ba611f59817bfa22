"""Alembic environment: runs on the connection that `corral.store.engine.upgrade` hands over."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from corral.store.schema import metadata

config = context.config
connection = config.attributes.get("connection")


def _run(conn: Connection) -> None:
    context.configure(connection=conn, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if connection is not None:
    _run(connection)
else:  # `alembic -x url=...` from a shell, for developers writing a new revision
    url = context.get_x_argument(as_dictionary=True).get("url", "sqlite:///corral-dev.db")
    with create_engine(url).connect() as conn:
        _run(conn)
