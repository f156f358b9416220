"""What every engine provides to the store; the portable parts are implemented here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from collector.store import schema
from collector.store.errors import StoreError, StoreUnavailable

__all__ = ["Engine", "EngineOptions", "SampleKeys", "for_url", "translate_errors"]

SampleKeys = Sequence[tuple[int, int, int]]  # sample rows' (bucket, series id, stack id)


@dataclass(frozen=True)
class EngineOptions:
    """Connection settings that apply to both engines."""

    busy_timeout: float = 30.0  # seconds a writer waits for a lock (SQLite busy, PG lock_timeout)
    connect_timeout: int = 5  # seconds to reach PostgreSQL before the store reports it unavailable
    echo: bool = False


@contextlib.contextmanager
def translate_errors(action: str) -> Iterator[None]:
    """Turns database errors into StoreUnavailable (retry later) or StoreError (a bug or bad data)."""
    try:
        yield
    except StoreError:
        raise
    except (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError) as exc:
        raise StoreUnavailable(f"{action}: database unavailable: {_first_line(exc)}") from exc
    except sa.exc.DBAPIError as exc:
        if exc.connection_invalidated:
            raise StoreUnavailable(f"{action}: connection lost: {_first_line(exc)}") from exc
        raise StoreError(f"{action}: {_first_line(exc)}") from exc
    except sa.exc.SQLAlchemyError as exc:
        raise StoreError(f"{action}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0] if text else type(orig).__name__


class Engine:
    """A SQLAlchemy engine plus the statements that differ between SQLite and PostgreSQL."""

    name = "base"

    def __init__(self, url: str, options: EngineOptions) -> None:
        self.url = url
        self.options = options
        self.sa_engine = self._create(url, options)

    def _create(self, url: str, options: EngineOptions) -> sa.Engine:
        raise NotImplementedError

    @contextlib.contextmanager
    def write_transaction(self) -> Iterator[sa.Connection]:
        """Yields a connection in a transaction that holds the write lock from its start."""
        with self.sa_engine.begin() as conn:
            yield conn

    @contextlib.contextmanager
    def read_transaction(self) -> Iterator[sa.Connection]:
        """Yields a connection in a read transaction (one consistent snapshot)."""
        with self.sa_engine.begin() as conn:
            yield conn

    def dispose(self) -> None:
        """Closes every pooled connection."""
        self.sa_engine.dispose()

    # Writes ---------------------------------------------------------------------------------

    def insert_ignore(self, conn: sa.Connection, table: sa.Table, rows: Sequence[dict]) -> None:
        """Inserts rows, skipping those whose primary key exists."""
        if rows:
            conn.execute(self.dialect_insert(table).on_conflict_do_nothing(), list(rows))

    def upsert(
        self, conn: sa.Connection, table: sa.Table, rows: Sequence[dict], update: Sequence[str]
    ) -> None:
        """Inserts rows, overwriting the `update` columns of rows whose primary key exists."""
        if not rows:
            return
        stmt = self.dialect_insert(table)
        keys = [c.name for c in table.primary_key.columns]
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=keys, set_={name: stmt.excluded[name] for name in update}
            ),
            list(rows),
        )

    def add_samples(
        self,
        conn: sa.Connection,
        width: int,
        keys: SampleKeys,
        counts: Sequence[int],
        *,
        new: bool = False,
    ) -> None:
        """Adds rows of (bucket, series, stack) keys and counts to tier `width`, summing counts
        on conflict;
        ``new``: they are probably not stored yet (an engine may insert them faster)."""
        if keys:
            self._add_samples(conn, width, keys, counts, new)

    def _add_samples(
        self, conn: sa.Connection, width: int, keys: SampleKeys, counts: Sequence[int], new: bool
    ) -> None:
        """add_samples() for one or more rows, the engine's way."""
        raise NotImplementedError

    def dialect_insert(self, table: sa.Table):  # type: ignore[no-untyped-def]
        """Returns the engine's INSERT construct (it has on_conflict_do_*)."""
        raise NotImplementedError

    # Reads ----------------------------------------------------------------------------------

    def stack_counts(
        self, conn: sa.Connection, where: Sequence[sa.ColumnElement[bool]], *, merge: bool = True
    ) -> tuple[list[int], list[int]]:
        """Reads the stack ids and summed counts of the sample rows matching ``where``, as two
        aligned lists. ``merge=False`` when the rows hold each stack once already (one bucket
        of one series): they are read as they are, without grouping them."""
        s = schema.samples
        count = sa.cast(sa.func.sum(s.c.count), sa.BigInteger) if merge else s.c.count
        stmt = sa.select(s.c.stack_id, count).where(*where)
        if merge:
            stmt = stmt.group_by(s.c.stack_id)
        # The driver's rows as they come: SQLAlchemy's row objects would triple the cost of
        # reading a window of many distinct stacks (both columns are integers).
        rows = conn.execute(stmt).cursor.fetchall()
        return [row[0] for row in rows], [row[1] for row in rows]

    def stack_texts(self, conn: sa.Connection, ids: Sequence[int]) -> list[tuple[int, str]]:
        """Reads the (id, folded text) of stacks; ids not stored are left out."""
        st = schema.stacks
        found: list[tuple[int, str]] = []
        for i in range(0, len(ids), 5000):
            stmt = sa.select(st.c.id, st.c.folded).where(st.c.id.in_(ids[i : i + 5000]))
            found += conn.execute(stmt).cursor.fetchall()
        return found

    def reads_lines_in_halves(self) -> bool:
        """Whether reading many stacks' text in two halves at once, on two connections, is
        faster (collector.query): not where the driver turns rows into objects under the
        interpreter's lock."""
        return False

    def stack_lines(self, conn: sa.Connection, ids: Sequence[int]) -> tuple[list[int], str]:
        """Reads the folded text of stacks, one per line, and their ids in the same order; ids
        not stored are left out. A newline inside a text (the store refuses them, another
        writer might not) is written ``%0A``. One string costs much less to read, and to cut
        into sort keys, than one per stack."""
        rows = self.stack_texts(conn, ids)
        texts = [text for _, text in rows]
        lines = "\n".join(texts)
        if texts and lines.count("\n") != len(texts) - 1:
            lines = "\n".join(text.replace("\n", "%0A") for text in texts)
        return [sid for sid, _ in rows], lines

    # Partitions (PostgreSQL only) -----------------------------------------------------------

    def ensure_partitions(self, width: int, buckets: set[int]) -> None:
        """Makes sure tier `width` can hold rows of these buckets (creates partitions ahead)."""

    def expire(self, conn: sa.Connection, width: int, before: int) -> int:
        """Removes tier rows with bucket < before; returns the bucket from which rows are complete."""
        conn.execute(
            sa.delete(schema.samples).where(
                schema.samples.c.width == width, schema.samples.c.bucket < before
            )
        )
        return before

    def reclaim_space(self) -> int:
        """Gives the space of deleted rows back to the file system where the engine needs
        asking (SQLite); returns the pages freed."""
        return 0

    def analyze(self, width: int, buckets: set[int]) -> None:
        """Refreshes planner statistics of the storage holding these buckets of tier `width`."""

    def is_missing_partition(self, exc: BaseException) -> bool:
        """Tells whether a write failed because a partition was dropped meanwhile."""
        return False

    def forget_partitions(self) -> None:
        """Drops the cache of known partitions."""


def backend_of(url: str) -> str:
    """The database a URL names, ``sqlite`` or ``postgresql``; StoreError for another, or for
    no URL at all."""
    try:
        backend = sa.engine.make_url(url).get_backend_name()
    except sa.exc.ArgumentError as exc:
        raise StoreError(str(exc)) from None
    if backend not in ("sqlite", "postgresql"):
        raise StoreError(
            f"unsupported database {backend!r}: use sqlite:/// or postgresql+psycopg://"
        )
    return backend


def for_url(url: str, options: EngineOptions | None = None) -> Engine:
    """Returns the engine for a database URL (sqlite:/// or postgresql+psycopg://)."""
    options = options or EngineOptions()
    backend = backend_of(url)
    if backend == "sqlite":
        from collector.store.engines.sqlite import SQLiteEngine

        return SQLiteEngine(url, options)
    from collector.store.engines.postgresql import PostgreSQLEngine

    return PostgreSQLEngine(url, options)
