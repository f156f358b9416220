"""The collector's storage: writes samples and cursors together, loads cursors, runs migrations.

Rollups and retention live in maintenance.py; reads in collector/query.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import sqlalchemy as sa

from collector.store import cursors, fleet, maintenance, schema, writes
from collector.store.engines.base import EngineOptions, for_url, translate_errors
from collector.store.engines.sqlite import sqlite_path
from collector.store.errors import InvalidRow, StoreError
from collector.store.rows import (
    Batch,
    Cursor,
    CursorUpdate,
    IdCache,
    Limits,
    SampleRow,
    prepare_batch,
)
from collector.store.tiers import (
    DAY,
    DEFAULT_ROLLUPS,
    Tier,
    TierState,
    build_fleet_tiers,
    build_tiers,
)
from sampler.profile import align_down

__all__ = ["Store"]

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


class Store:
    """Samples of the whole fleet in SQLite or PostgreSQL, at several time resolutions."""

    def __init__(
        self,
        url: str,
        *,
        bucket_seconds: int = 60,
        rollups: Sequence[tuple[int, int]] = DEFAULT_ROLLUPS,
        retention_seconds: int = 30 * DAY,
        busy_timeout: float = 30.0,
        connect_timeout: int = 5,
        limits: Limits | None = None,
        echo: bool = False,
    ) -> None:
        try:
            self.tiers: tuple[Tier, ...] = build_tiers(bucket_seconds, rollups)
        except ValueError as exc:
            raise InvalidRow(f"bad rollup settings: {exc}") from exc
        longest = max((after for _width, after in rollups), default=0)
        if retention_seconds <= longest:
            raise InvalidRow(
                f"retention of {retention_seconds} s must exceed the last rollup age ({longest} s)"
            )
        self.fleet_tiers: tuple[Tier, ...] = build_fleet_tiers(self.tiers)
        # Tier states move in steps of the coarsest instance width (see tiers.plan).
        self.coarsest = self.tiers[-1].width
        self.bucket_seconds = bucket_seconds
        self.retention_seconds = retention_seconds
        self.limits = limits or Limits()
        folder = _missing_sqlite_folder(url)
        if folder is not None:  # not an outage to wait out: nothing will make the folder
            raise StoreError(f"opening the database: no folder {folder} for the SQLite file")
        with translate_errors("opening the database"):
            self.engine = for_url(
                url,
                EngineOptions(
                    busy_timeout=busy_timeout, connect_timeout=connect_timeout, echo=echo
                ),
            )
        self.dialect: str = self.engine.name
        self._ids = IdCache()
        self.written = writes.Written()  # what the writer knows is stored
        self.cursor_rows: dict[str, int] = {}  # target -> its cursor log's rows (cursors.py)
        self._tier_rows_ready = False

    # Schema ---------------------------------------------------------------------------------

    def migrate(self, revision: str = "head") -> None:
        """Brings the schema up to date (alembic upgrade head); safe to run from several
        collectors. ``revision`` names an older one (tests of the migrations)."""
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with translate_errors("migrating the schema"):
            with self.engine.write_transaction() as conn:
                if self.dialect == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(7202417)"))
                config.attributes["connection"] = conn
                command.upgrade(config, revision)
            if revision == "head":
                self._ensure_tier_rows()

    def _ensure_tier_rows(self) -> None:
        if self._tier_rows_ready:
            return
        with self.engine.write_transaction() as conn:
            self._check_bucket_seconds(conn)
            for table, tiers in (
                (schema.tiers, self.tiers),
                (schema.fleet_tiers, self.fleet_tiers),
            ):
                self.engine.insert_ignore(
                    conn, table, [{"width": t.width, "rolled_to": 0, "kept_from": 0} for t in tiers]
                )
        self._tier_rows_ready = True

    def check_bucket_seconds(self) -> None:
        """Raises StoreError when the database's finest buckets are not ``bucket_seconds``
        wide: samples of two widths are stored apart, and each reader shows one of them."""
        with translate_errors("reading the tiers"), self.engine.read_transaction() as conn:
            self._check_bucket_seconds(conn)

    def _check_bucket_seconds(self, conn: sa.Connection) -> None:
        finest = conn.execute(sa.select(sa.func.min(schema.tiers.c.width))).scalar()
        if finest is not None and finest != self.bucket_seconds:
            raise StoreError(
                f"the database holds {finest}-second buckets, and bucket_seconds is "
                f"{self.bucket_seconds}: samples of the two widths would be stored apart and "
                f"each view would show one of them (set bucket_seconds = {finest}, or use a new "
                "database)"
            )

    def tier_states(self, conn: sa.Connection, *, lock: str | None = None) -> list[TierState]:
        """Returns the configured tiers' states, finest first; `lock` is "share" or "update"."""
        stmt = sa.select(schema.tiers.c.width, schema.tiers.c.kept_from, schema.tiers.c.rolled_to)
        if lock is not None:
            stmt = stmt.with_for_update(read=lock == "share")
        stored = {w: (k, r) for w, k, r in conn.execute(stmt.order_by(schema.tiers.c.width))}
        return [TierState(t.width, *stored.get(t.width, (0, 0))) for t in self.tiers]

    def all_tier_states(self, conn: sa.Connection) -> list[TierState]:
        """Returns the states of the instance tiers, then of the fleet tiers."""
        return self.tier_states(conn) + fleet.fleet_states(self, conn)

    # Writes ---------------------------------------------------------------------------------

    def write(self, rows: Iterable[SampleRow], cursors: Iterable[CursorUpdate] = ()) -> None:
        """Stores sample rows and the cursors that produced them in one transaction.

        Raises InvalidRow (nothing written) for bad input, StoreUnavailable when the database
        cannot be reached or stays locked (nothing written: retry the same call later).
        """
        batch = prepare_batch(
            rows, cursors, bucket_seconds=self.bucket_seconds, limits=self.limits, cache=self._ids
        )
        if not batch.samples and not batch.cursors:
            return
        with translate_errors("writing samples"):
            self._ensure_tier_rows()
            for attempt in range(2):
                try:
                    self._ensure_partitions(batch)
                    with self.engine.write_transaction() as conn:
                        self._write(conn, batch)
                    break
                except sa.exc.IntegrityError as exc:
                    # Another collector's retention dropped a partition this one had cached.
                    if attempt or not self.engine.is_missing_partition(exc):
                        raise
                    self.engine.forget_partitions()
        self.written.remember(batch)

    def _ensure_partitions(self, batch: Batch) -> None:
        buckets = {bucket for bucket, _series, _stack in batch.samples}
        for tier in self.tiers:
            self.engine.ensure_partitions(tier.width, {align_down(b, tier.width) for b in buckets})

    def _write(self, conn: sa.Connection, batch: Batch) -> None:
        writes.write_batch(self, conn, batch)
        cursors.write_cursors(self, conn, batch)

    def forget(self) -> None:
        """Drops what the writer remembers as stored (after retention deleted rows)."""
        self.written = writes.Written()

    # Cursors --------------------------------------------------------------------------------

    def load_cursors(self) -> dict[str, Cursor]:
        """Returns the stored cursor of every target: its instance id and cumulative counts."""
        with translate_errors("loading cursors"), self.engine.read_transaction() as conn:
            return cursors.load_cursors(self, conn)

    # Maintenance ----------------------------------------------------------------------------

    def rollup(self, now: int) -> None:
        """Materialises complete buckets of every coarser tier and expires what each tier no longer keeps."""
        with translate_errors("rolling up"):
            self._ensure_tier_rows()
            maintenance.rollup(self, int(now))

    def apply_retention(self, now: int) -> None:
        """Deletes (or drops the partitions of) samples older than the retention period."""
        with translate_errors("applying retention"):
            self._ensure_tier_rows()
            maintenance.apply_retention(self, int(now))
        self.forget()

    def close(self) -> None:
        """Closes every pooled connection; the store can not be used afterwards."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _missing_sqlite_folder(url: str) -> str | None:
    """The folder a SQLite URL's file should be in, when there is no such folder."""
    path = sqlite_path(url)
    return None if path is None or path.parent.is_dir() else str(path.parent)
