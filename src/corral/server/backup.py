"""`corral admin backup`: an online copy of the database, and its restore.

SQLite: the online backup API (`sqlite3.Connection.backup`), a consistent copy taken while the
server keeps writing. PostgreSQL: `pg_dump --format=custom`, restored with `pg_restore --clean`.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from corral.server.errors import ApiError
from corral.store.engine import Engines

SQLITE_MAGIC = b"SQLite format 3\x00"
PG_DUMP_MAGIC = b"PGDMP"


def check_target(engines: Engines, path: str) -> Path:
    """Where a backup may go: an absolute path in an existing directory, not the live database
    (nor its -wal, -shm or -journal), and no existing file unless an earlier backup (422 otherwise)."""
    fix = "give an absolute path to a new file, e.g. /var/backups/corral-2026-12-03.db"
    if "\x00" in path or not path.startswith("/"):
        raise ApiError(
            422,
            f"backup: {path!r} is not an absolute path "
            "(a relative one would land in the server's working directory)",
            fix=fix,
        )
    target = Path(path)
    if not target.parent.is_dir():
        raise ApiError(422, f"backup: no directory {target.parent} on the server", fix="create it first")
    source = make_url(engines.url).database if engines.is_sqlite else None
    if source:
        live = Path(source).resolve()
        if target.resolve() in {live, *(live.with_name(live.name + s) for s in ("-wal", "-shm", "-journal"))}:
            raise ApiError(422, f"backup: {path} is the live database itself", fix=fix)
    if target.is_dir():
        raise ApiError(422, f"backup: {path} is a directory", fix=fix)
    if target.exists():
        magic = SQLITE_MAGIC if engines.is_sqlite else PG_DUMP_MAGIC
        with target.open("rb") as f:
            is_backup = f.read(len(magic)) == magic
        if not is_backup:
            raise ApiError(
                422,
                f"backup: {path} exists and is not an earlier backup of this kind: it is not overwritten",
                fix=fix,
            )
    return target


def backup(engines: Engines, path: str) -> dict[str, Any]:
    target = check_target(engines, path)
    started = time.perf_counter()
    if engines.is_sqlite:
        source = make_url(engines.url).database
        assert source is not None
        try:
            with sqlite3.connect(source) as src, sqlite3.connect(str(target)) as dst:
                src.backup(dst)
        except sqlite3.Error as exc:
            raise ApiError(
                422, f"backup: could not write {path}: {exc}", fix="check the path and its permissions"
            ) from None
    else:
        url = make_url(engines.url).set(drivername="postgresql")
        if shutil.which("pg_dump") is None:
            raise ApiError(500, "pg_dump is not installed on the server", fix="install postgresql-client")
        proc = subprocess.run(
            ["pg_dump", "--format=custom", "--file", str(target), url.render_as_string(hide_password=False)],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if proc.returncode != 0:
            raise ApiError(500, f"pg_dump failed: {proc.stderr.strip()}")
    return {
        "path": str(target),
        "bytes": target.stat().st_size,
        "seconds": round(time.perf_counter() - started, 3),
    }


def restore(url: str, path: str) -> None:
    """Replace the database at `url` with a backup (the server must be stopped)."""
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"no backup file {source}")
    if url.startswith("sqlite"):
        database = make_url(url).database
        assert database is not None
        with sqlite3.connect(str(source)) as src, sqlite3.connect(database) as dst:
            src.backup(dst)
        return
    pg = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    subprocess.run(
        ["pg_restore", "--clean", "--if-exists", "--dbname", pg, str(source)], check=True, timeout=3600
    )
