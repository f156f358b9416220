"""SQLite: WAL mode, a busy timeout, write transactions that take the lock up front."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from collector.store import schema
from collector.store.engines.base import Engine, EngineOptions, SampleKeys

__all__ = ["SQLiteEngine", "sqlite_path"]


def sqlite_path(url: str) -> Path | None:
    """The file a SQLite URL names (``file:`` URIs too), resolved; None for another database
    or an in-memory one."""
    parsed = sa.engine.make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    if database.startswith("file:"):
        database = database[len("file:") :].split("?", 1)[0]
    return Path(database).resolve()


_ADD_SAMPLES = (
    "INSERT INTO samples (width, bucket, series_id, stack_id, count) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (width, bucket, series_id, stack_id) DO UPDATE SET count = count + excluded.count"
)


# All ids in one parameter, a JSON array: an IN list of 200,000 bound parameters costs more to
# build than the query takes.
_STACK_TEXTS = "SELECT id, folded FROM stacks WHERE id IN (SELECT value FROM json_each(?))"
_LINES_CHUNK = 250_000  # ids a query: one string of their lines for most windows
_STACK_LINES = (
    "SELECT json_group_array(id), group_concat(folded, char(10)) FROM stacks "
    "WHERE id IN (SELECT value FROM json_each(?))"
)


class SQLiteEngine(Engine):
    """A SQLite file shared by one collector (the writer) and any number of readers."""

    name = "sqlite"

    def _create(self, url: str, options: EngineOptions) -> sa.Engine:
        engine = sa.create_engine(
            url, echo=options.echo, connect_args={"timeout": options.busy_timeout}
        )
        busy_ms = int(options.busy_timeout * 1000)

        @sa.event.listens_for(engine, "connect")
        def _configure(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            # Take transaction control from the sqlite3 module so BEGIN IMMEDIATE is possible.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            # A new file frees the pages of deleted rows on request (reclaim_space); this
            # is only possible before its first table, so an older file keeps its mode.
            if cursor.execute("PRAGMA page_count").fetchone()[0] == 0:
                cursor.execute("PRAGMA auto_vacuum = INCREMENTAL")
            # WAL: readers never block the writer and the writer never blocks readers.
            cursor.execute("PRAGMA journal_mode = WAL")
            # NORMAL in WAL mode can lose the last commits on power loss, never consistency;
            # samples and cursors commit together, and the sampler's counts are cumulative,
            # so a lost commit is polled again.
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.close()

        @sa.event.listens_for(engine, "begin")
        def _begin(conn):  # type: ignore[no-untyped-def]
            # A writer that starts deferred and upgrades later can fail at once with
            # SQLITE_BUSY (no busy wait); IMMEDIATE waits for the lock up front instead.
            write = conn.get_execution_options().get("fleetflame_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine

    @contextlib.contextmanager
    def write_transaction(self) -> Iterator[sa.Connection]:
        """Yields a connection inside BEGIN IMMEDIATE."""
        with self.sa_engine.connect() as conn:
            conn.execution_options(fleetflame_write=True)
            with conn.begin():
                yield conn

    def reclaim_space(self) -> int:
        """Returns free pages beyond a fifth of the file to the file system (those within
        are reused by the next writes); returns how many pages it freed. A file created
        before fleetflame set incremental auto-vacuum frees none (docs/operations.md)."""
        raw = self.sa_engine.raw_connection()
        try:
            driver = raw.driver_connection
            assert driver is not None
            mode, pages, free = (
                driver.execute(f"PRAGMA {name}").fetchone()[0]
                for name in ("auto_vacuum", "page_count", "freelist_count")
            )
            excess = free - (pages - free) // 4  # then a fifth of the file stays free
            if mode != 2 or excess <= 0:  # 2: INCREMENTAL
                return 0
            # Run to completion (execute() would take one step: one page), in a transaction
            # of its own: the connection is in autocommit mode.
            driver.executescript(f"PRAGMA incremental_vacuum({int(excess)});")
            return int(excess)
        finally:
            raw.close()

    dialect_insert = staticmethod(sqlite_insert)

    def _add_samples(
        self, conn: sa.Connection, width: int, keys: SampleKeys, counts: Sequence[int], new: bool
    ) -> None:
        """Adds rows with one executemany of an upsert."""
        rows = [(width, b, s, k, c) for (b, s, k), c in zip(keys, counts, strict=True)]
        conn.exec_driver_sql(_ADD_SAMPLES, rows)

    def stack_texts(self, conn: sa.Connection, ids: Sequence[int]) -> list[tuple[int, str]]:
        """Reads the (id, folded text) of stacks with one query; ids not stored are left out."""
        if sqlite3.sqlite_version_info < (3, 38):  # json_each is built in from 3.38
            return super().stack_texts(conn, ids)
        if not ids:
            return []
        return conn.exec_driver_sql(_STACK_TEXTS, (json.dumps(list(ids)),)).cursor.fetchall()

    def reads_lines_in_halves(self) -> bool:
        """One row of lines a query, made by SQLite outside the interpreter: two halves at once
        take ~85% of one read's time. Not an in-memory database: one per thread (SQLAlchemy's
        SingletonThreadPool), where the other half would find no tables, or one connection
        (StaticPool)."""
        pool = self.sa_engine.pool
        return not isinstance(pool, (sa.pool.SingletonThreadPool, sa.pool.StaticPool))

    def stack_lines(self, conn: sa.Connection, ids: Sequence[int]) -> tuple[list[int], str]:
        """Reads the stacks' text a row per 50,000 (see the base class): SQLite joins the
        lines, ~0.4 s faster for 200,000 stacks than making a string per stack and joining
        them."""
        if sqlite3.sqlite_version_info < (3, 38):
            return super().stack_lines(conn, ids)
        found: list[int] = []
        parts: list[str] = []
        for i in range(0, len(ids), _LINES_CHUNK):
            chunk = ids[i : i + _LINES_CHUNK]
            chunk_ids, lines = self._lines_in_one_row(conn, chunk) or super().stack_lines(
                conn, chunk
            )
            if chunk_ids:
                found += chunk_ids
                parts.append(lines)
        return found, "\n".join(parts)

    def _lines_in_one_row(
        self, conn: sa.Connection, ids: Sequence[int]
    ) -> tuple[list[int], str] | None:
        """Returns the ids and lines of stacks from one row, or None when the lines would be
        longer than SQLite's longest string (1 GB by default) or a text holds a newline.
        Texts are NOT NULL, so the two aggregates see the same rows in the same order."""
        try:
            row = conn.exec_driver_sql(_STACK_LINES, (json.dumps(list(ids)),)).fetchone()
        except sa.exc.DataError:
            return None
        found = json.loads(row[0])
        if found and row[1].count("\n") != len(found) - 1:
            return None
        return found, row[1] or ""

    def stack_counts(
        self, conn: sa.Connection, where: Sequence[sa.ColumnElement[bool]], *, merge: bool = True
    ) -> tuple[list[int], list[int]]:
        """Reads the stacks' sums as one row of two JSON arrays (see the base class): the
        driver makes three objects per row, which for a window of 200,000 distinct stacks
        cost more than the query itself. Grouping sorts the rows (~150 ms for 200,000
        distinct stacks), so rows that need no merging are not grouped."""
        if sqlite3.sqlite_version_info < (3, 38):  # JSON functions are built in from 3.38
            return super().stack_counts(conn, where, merge=merge)
        s = schema.samples
        count = sa.func.sum(s.c.count) if merge else s.c.count
        stmt = sa.select(s.c.stack_id, count.label("count")).where(*where)
        if merge:
            stmt = stmt.group_by(s.c.stack_id)
        sums = stmt.subquery()
        stmt = sa.select(
            sa.func.json_group_array(sums.c.stack_id), sa.func.json_group_array(sums.c.count)
        )
        ids, counts = conn.execute(stmt).cursor.fetchone()
        return json.loads(ids), json.loads(counts)
