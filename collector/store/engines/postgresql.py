"""PostgreSQL: array (unnest) upserts, samples partitioned by tier and time range."""

from __future__ import annotations

import contextlib
import re
import time
import zlib
from collections.abc import Iterator, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from collector.store.engines.base import Engine, EngineOptions, SampleKeys
from sampler.profile import align_down

__all__ = ["PostgreSQLEngine", "partition_span"]

# All ids in one array parameter, whatever their number.
_STACK_TEXTS = sa.text("SELECT id, folded FROM stacks WHERE id = ANY(CAST(:ids AS bigint[]))")

# One statement per batch: the arrays travel as four parameters, whatever the row count.
_INSERT_SAMPLES = (
    "INSERT INTO samples (width, bucket, series_id, stack_id, count) "
    "SELECT :width, t.b, t.s, t.k, t.c FROM unnest("
    "CAST(:buckets AS bigint[]), CAST(:series AS bigint[]), "
    "CAST(:stacks AS bigint[]), CAST(:counts AS bigint[])) AS t(b, s, k, c)"
)
_ADD_SAMPLES = sa.text(
    _INSERT_SAMPLES + " ON CONFLICT (width, bucket, series_id, stack_id) "
    "DO UPDATE SET count = samples.count + EXCLUDED.count"
)
_NEW_SAMPLES = sa.text(_INSERT_SAMPLES)
_UNIQUE_VIOLATION = "23505"

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

    dialect_insert = staticmethod(pg_insert)

    def _add_samples(
        self, conn: sa.Connection, width: int, keys: SampleKeys, counts: Sequence[int], new: bool
    ) -> None:
        """Adds rows with one INSERT ... SELECT FROM unnest(arrays) ON CONFLICT DO UPDATE.

        ``new`` says the rows are probably not stored yet (their bucket is new to this
        writer): they are inserted without ON CONFLICT, about twice as fast, and upserted
        after all if one of them was (another writer's, or a retried write's)."""
        buckets, series, stacks = (_int_array(column) for column in zip(*keys, strict=True))
        arrays = {"width": width, "buckets": buckets, "series": series, "stacks": stacks}
        arrays["counts"] = _int_array(counts)
        if new:
            try:
                with conn.begin_nested():
                    conn.execute(_NEW_SAMPLES, arrays)
                return
            except sa.exc.IntegrityError as exc:
                if getattr(exc.orig, "sqlstate", None) != _UNIQUE_VIOLATION:
                    raise
        conn.execute(_ADD_SAMPLES, arrays)

    def stack_texts(self, conn: sa.Connection, ids: Sequence[int]) -> list[tuple[int, str]]:
        """Reads the (id, folded text) of stacks with one query; ids not stored are left out."""
        if not ids:
            return []
        result = conn.execute(_STACK_TEXTS, {"ids": _int_array(ids)})
        return result.cursor.fetchall()

    def ensure_partitions(self, width: int, buckets: set[int]) -> None:
        """Creates the missing time partitions of tier `width` for these buckets, in their own transaction."""
        span = partition_span(width)
        missing = sorted(
            {align_down(b, span) for b in buckets} - {s for w, s in self._partitions if w == width}
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
            for start in sorted({align_down(b, span) for b in buckets}):
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
