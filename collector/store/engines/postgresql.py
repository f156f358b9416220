"""PostgreSQL: array (unnest) upserts, samples partitioned by tier and time range."""

from __future__ import annotations

import contextlib
import re
import time
import zlib
from collections.abc import Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from collector.store.engines.base import Engine, EngineOptions

__all__ = ["PostgreSQLEngine", "partition_span"]

# All ids in one array parameter, whatever their number.
_STACK_TEXTS = sa.text("SELECT id, folded FROM stacks WHERE id = ANY(CAST(:ids AS bigint[]))")

# One statement per batch: the arrays travel as four parameters, whatever the row count.
_ADD_SAMPLES = sa.text(
    "INSERT INTO samples (width, bucket, series_id, stack_id, count) "
    "SELECT :width, t.b, t.s, t.k, t.c FROM unnest("
    "CAST(:buckets AS bigint[]), CAST(:series AS bigint[]), "
    "CAST(:stacks AS bigint[]), CAST(:counts AS bigint[])) AS t(b, s, k, c) "
    "ON CONFLICT (width, bucket, series_id, stack_id) "
    "DO UPDATE SET count = samples.count + EXCLUDED.count"
)
_SET_CURSOR = sa.text(
    "INSERT INTO cursor_entries (target, label_index, stack_id, count) "
    "SELECT * FROM unnest(CAST(:targets AS text[]), CAST(:indexes AS integer[]), "
    "CAST(:stacks AS bigint[]), CAST(:counts AS bigint[])) "
    "ON CONFLICT (target, label_index, stack_id) DO UPDATE SET count = EXCLUDED.count"
)

_BOUND = re.compile(r"FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)")
_LOCK_KEY = zlib.crc32(b"fleetflame partitions")


def partition_span(width: int) -> int:
    """Returns the time span of one partition of a tier: 6 h for minute rows, 1 day for coarser."""
    return min(86400, max(21600, width * 360))


def partition_name(width: int, start: int) -> str:
    """Returns the table name of the partition of tier `width` starting at `start` (UTC)."""
    return f"samples_w{width}_{time.strftime('%Y%m%dt%H%M', time.gmtime(start))}"


class PostgreSQLEngine(Engine):
    """A PostgreSQL database, possibly shared by several collectors."""

    name = "postgresql"

    def __init__(self, url: str, options: EngineOptions) -> None:
        super().__init__(url, options)
        self._partitions: set[tuple[int, int]] = set()

    def _create(self, url: str, options: EngineOptions) -> sa.Engine:
        return sa.create_engine(
            url,
            echo=options.echo,
            pool_pre_ping=True,  # after an outage, stale pooled connections are replaced
            connect_args={
                "connect_timeout": options.connect_timeout,
                "application_name": "fleetflame",
                # Like SQLite's busy timeout: a lock held too long fails the write as
                # StoreUnavailable (the poller retries) instead of hanging the poll loop.
                "options": f"-c lock_timeout={int(options.busy_timeout * 1000)}",
            },
        )

    @contextlib.contextmanager
    def read_transaction(self) -> Iterator[sa.Connection]:
        """Yields a connection in a REPEATABLE READ transaction: every statement sees the same
        snapshot (READ COMMITTED, the default, takes a new one for each statement)."""
        with self.sa_engine.connect() as conn:
            conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn

    def dialect_insert(self, table: sa.Table):  # type: ignore[no-untyped-def]
        """Returns PostgreSQL's INSERT construct."""
        return pg_insert(table)

    def add_samples(
        self, conn: sa.Connection, width: int, rows: Sequence[tuple[int, int, int, int]]
    ) -> None:
        """Adds rows with one INSERT ... SELECT FROM unnest(arrays) ON CONFLICT DO UPDATE."""
        if not rows:
            return
        buckets, series, stacks, counts = (_int_array(c) for c in zip(*rows, strict=True))
        conn.execute(
            _ADD_SAMPLES,
            {
                "width": width,
                "buckets": buckets,
                "series": series,
                "stacks": stacks,
                "counts": counts,
            },
        )

    def stack_texts(self, conn: sa.Connection, ids: Sequence[int]) -> list[tuple[int, str]]:
        """Reads the (id, folded text) of stacks with one query; ids not stored are left out."""
        if not ids:
            return []
        result = conn.execute(_STACK_TEXTS, {"ids": _int_array(ids)})
        return result.cursor.fetchall()

    def upsert_cursor_entries(
        self, conn: sa.Connection, rows: Sequence[tuple[str, int, int, int]]
    ) -> None:
        """Sets cursor entries with one INSERT ... SELECT FROM unnest(arrays) ON CONFLICT."""
        if not rows:
            return
        targets, indexes, stacks, counts = zip(*rows, strict=True)
        conn.execute(
            _SET_CURSOR,
            {
                "targets": _text_array(targets),
                "indexes": _int_array(indexes),
                "stacks": _int_array(stacks),
                "counts": _int_array(counts),
            },
        )

    def ensure_partitions(self, width: int, buckets: set[int]) -> None:
        """Creates the missing time partitions of tier `width` for these buckets, in their own transaction."""
        span = partition_span(width)
        missing = sorted(
            {b - b % span for b in buckets} - {s for w, s in self._partitions if w == width}
        )
        if not missing:
            return
        with self.sa_engine.begin() as conn:
            # Several collectors may share the database: one creates, the others find it made.
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
            parent = f"samples_w{width}"
            conn.exec_driver_sql(
                f"CREATE TABLE IF NOT EXISTS {parent} PARTITION OF samples "
                f"FOR VALUES IN ({int(width)}) PARTITION BY RANGE (bucket)"
            )
            existing = {start for start, _end in self._bounds(conn, width)}
            for start in missing:
                if start not in existing:
                    conn.exec_driver_sql(
                        f"CREATE TABLE {partition_name(width, start)} PARTITION OF {parent} "
                        f"FOR VALUES FROM ({int(start)}) TO ({int(start + span)})"
                    )
        self._partitions.update((width, start) for start in missing)

    def _bounds(self, conn: sa.Connection, width: int) -> list[tuple[int, int]]:
        rows = conn.execute(
            sa.text(
                "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
                "JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent = to_regclass(:parent)"
            ),
            {"parent": f"samples_w{width}"},
        ).scalars()
        bounds = []
        for text in rows:
            match = _BOUND.search(text or "")
            if match:
                bounds.append((int(match.group(1)), int(match.group(2))))
        return sorted(bounds)

    def expire(self, conn: sa.Connection, width: int, before: int) -> int:
        """Drops the partitions of tier `width` that end at or before `before`."""
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LOCK_KEY})
        complete_from = 0
        for start, end in self._bounds(conn, width):
            if end <= before:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {partition_name(width, start)}")
                self._partitions.discard((width, start))
                complete_from = max(complete_from, end)
        return complete_from

    def analyze(self, width: int, buckets: set[int]) -> None:
        """Runs ANALYZE on the partitions holding these buckets.

        Freshly filled partitions have no statistics until autovacuum gets to them, and the
        planner then picks nested loops that are ten times slower for a window query.
        """
        span = partition_span(width)
        with self.sa_engine.begin() as conn:
            for start in sorted({b - b % span for b in buckets}):
                name = partition_name(width, start)
                if conn.execute(sa.text("SELECT to_regclass(:n)"), {"n": name}).scalar():
                    conn.exec_driver_sql(f"ANALYZE {name}")

    def is_missing_partition(self, exc: BaseException) -> bool:
        """Tells whether a write failed with "no partition of relation ... found for row"."""
        orig = getattr(exc, "orig", None)
        return getattr(orig, "sqlstate", None) == "23514" and "no partition" in str(orig)

    def forget_partitions(self) -> None:
        """Drops the cache of known partitions, so the next write checks the catalog again."""
        self._partitions.clear()


# Arrays travel as PostgreSQL array literals in one text parameter each: psycopg would dump a
# Python list element by element (a regex per element), several times slower than the query.
def _int_array(values: Sequence[int]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def _text_array(values: Sequence[str]) -> str:
    quoted = (v.replace("\\", "\\\\").replace('"', '\\"') for v in values)
    return '{"' + '","'.join(quoted) + '"}'
