"""Opening the collector's database read-only, and saying why a SQLite file cannot be opened.

The web UI never writes. ``readonly_url`` turns the configured URL into one that opens the
same database read-only (SQLite in ``mode=ro``, PostgreSQL with
``default_transaction_read_only``), and ``read_only_sessions`` makes every PostgreSQL session
read-only as it connects, for the driver options that replace the URL's. Before the store is
opened, ``sqlite_file_problem`` tells a user who named the wrong file what is wrong with it
(no such file, a folder, not a database, a database the collector never wrote), where the
store's own errors would only say that a query failed.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from urllib.parse import quote

import sqlalchemy as sa

from collector.store.engines.sqlite import sqlite_path

__all__ = ["NOT_A_DATABASE", "read_only_sessions", "readonly_url", "sqlite_file_problem"]


def readonly_url(url: str) -> str:
    """Returns the database URL that opens the same database read-only."""
    parsed = sa.engine.make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:"):
            return url
        query = dict(parsed.query)
        if query.get("uri", "").lower() != "true":
            database = "file:" + quote(str(Path(database).resolve()), safe="/:")
        query.update(mode="ro", uri="true")
        parsed = parsed.set(database=database, query=query)
    elif backend == "postgresql":
        options = parsed.query.get("options", "")
        if isinstance(options, tuple):
            options = " ".join(options)
        options = f"{options} -c default_transaction_read_only=on".strip()
        parsed = parsed.update_query_dict({"options": options})
    return parsed.render_as_string(hide_password=False)


NOT_A_DATABASE = "file is not a database"  # SQLite's message (Python 3.10 has no error name)


def sqlite_file_problem(url: str) -> str | None:
    """What is wrong with the SQLite file ``url`` names, when it is not a fleetflame database
    (no such file, a folder, another kind of file, a database the collector never wrote), else
    None: the store's own errors then say what failed."""
    path = sqlite_path(url)
    if path is None:
        return None
    if not path.exists():
        return (
            f"there is no SQLite file at {path} (is database_url the one the collector writes "
            "to, and has it started?)"
        )
    if not path.is_file():
        return f"{path} is not a file (database_url must name the collector's SQLite file)"
    try:
        with closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=0)) as conn:
            ours = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
            ).fetchone()
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_NOTADB" or str(exc) == NOT_A_DATABASE:
            return f"{path} is not a SQLite database ({exc})"
        return None  # locked, or not readable now: the store's own error says so
    if ours is None:
        return (
            f"the SQLite file at {path} holds no fleetflame data (is database_url the one the "
            "collector writes to?)"
        )
    return None


def read_only_sessions(engine: sa.Engine) -> None:
    """Makes every PostgreSQL session read-only as it connects.

    The store passes its own ``options`` to the driver, which replace the URL's, so the
    setting from readonly_url() may not reach the server: this does regardless.
    """

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        dbapi_connection.commit()
