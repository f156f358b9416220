"""The collector's storage: writes samples and cursors together, loads cursors, runs migrations.

Rollups and retention live in maintenance.py; reads in collector/query.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import sqlalchemy as sa

from collector.store import maintenance, schema
from collector.store.engines.base import EngineOptions, for_url, translate_errors
from collector.store.errors import InvalidRow, StackHashCollision
from collector.store.rows import (
    Batch,
    Cursor,
    CursorUpdate,
    IdCache,
    Limits,
    SampleRow,
    prepare_batch,
)
from collector.store.tiers import DAY, DEFAULT_ROLLUPS, Tier, TierState, build_tiers

__all__ = ["Store"]

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
_CHUNK = 5000  # ids per IN (...) list: well under SQLite's bound-parameter limit
_KNOWN_STACKS_LIMIT = 2_000_000  # ids the writer remembers as stored (about 100 MB at most)


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
        self.bucket_seconds = bucket_seconds
        self.retention_seconds = retention_seconds
        self.limits = limits or Limits()
        with translate_errors("opening the database"):
            self.engine = for_url(
                url,
                EngineOptions(
                    busy_timeout=busy_timeout, connect_timeout=connect_timeout, echo=echo
                ),
            )
        self.dialect: str = self.engine.name
        self._ids = IdCache()
        self._known_stacks: set[int] = set()
        self._known_label_sets: set[int] = set()
        self._series_span: dict[int, tuple[int, int]] = {}  # series id -> stored first, last bucket
        self._tier_rows_ready = False

    # Schema ---------------------------------------------------------------------------------

    def migrate(self) -> None:
        """Brings the schema up to date (alembic upgrade head); safe to run from several collectors."""
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with translate_errors("migrating the schema"):
            with self.engine.write_transaction() as conn:
                if self.dialect == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(7202417)"))
                config.attributes["connection"] = conn
                command.upgrade(config, "head")
            self._ensure_tier_rows()

    def _ensure_tier_rows(self) -> None:
        if self._tier_rows_ready:
            return
        with self.engine.write_transaction() as conn:
            self.engine.insert_ignore(
                conn,
                schema.tiers,
                [{"width": t.width, "rolled_to": 0, "kept_from": 0} for t in self.tiers],
            )
        self._tier_rows_ready = True

    def tier_states(self, conn: sa.Connection, *, lock: str | None = None) -> list[TierState]:
        """Returns the configured tiers' states, finest first; `lock` is "share" or "update"."""
        stmt = sa.select(schema.tiers.c.width, schema.tiers.c.kept_from, schema.tiers.c.rolled_to)
        if lock is not None:
            stmt = stmt.with_for_update(read=lock == "share")
        stored = {w: (k, r) for w, k, r in conn.execute(stmt.order_by(schema.tiers.c.width))}
        return [TierState(t.width, *stored.get(t.width, (0, 0))) for t in self.tiers]

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
        self._remember(batch)

    def _ensure_partitions(self, batch: Batch) -> None:
        buckets = {bucket for bucket, _series, _stack in batch.samples}
        for tier in self.tiers:
            self.engine.ensure_partitions(tier.width, {b - b % tier.width for b in buckets})

    def _write(self, conn: sa.Connection, batch: Batch) -> None:
        # Shared lock on the rollup state: a rollup cannot move past a bucket while a row
        # for it is being written, so late rows land in every tier already rolled past them.
        states = self.tier_states(conn, lock="share")
        self._insert_stacks(conn, batch.stacks)
        self._insert_label_sets(conn, batch.label_sets)
        self._upsert_series(conn, batch)
        rows = sorted(batch.samples.items())  # one lock order for every writer: no deadlocks
        self.engine.add_samples(conn, self.tiers[0].width, [(*key, c) for key, c in rows])
        for state in states[1:]:
            late: dict[tuple[int, int, int], int] = {}
            for (bucket, series, stack), count in rows:
                if bucket < state.rolled_to:
                    key = (bucket - bucket % state.width, series, stack)
                    late[key] = late.get(key, 0) + count
            self.engine.add_samples(conn, state.width, [(*k, c) for k, c in sorted(late.items())])
        self._write_cursors(conn, batch)

    def _insert_stacks(self, conn: sa.Connection, stacks: dict[int, str]) -> None:
        new = sorted(sid for sid in stacks if sid not in self._known_stacks)
        if not new:
            return
        self.engine.insert_ignore(
            conn, schema.stacks, [{"id": s, "folded": stacks[s]} for s in new]
        )
        # Ids are 64-bit hashes: check that what is stored under each new id is this stack.
        for i in range(0, len(new), _CHUNK):
            chunk = new[i : i + _CHUNK]
            stored = conn.execute(
                sa.select(schema.stacks.c.id, schema.stacks.c.folded).where(
                    schema.stacks.c.id.in_(chunk)
                )
            )
            for sid, folded in stored:
                if folded != stacks[sid]:
                    raise StackHashCollision(
                        f"stacks {folded[:60]!r} and {stacks[sid][:60]!r} share id {sid}"
                    )

    def _insert_label_sets(self, conn: sa.Connection, label_sets: dict[int, str]) -> None:
        new = sorted(lid for lid in label_sets if lid not in self._known_label_sets)
        if not new:
            return
        self.engine.insert_ignore(
            conn, schema.label_sets, [{"id": lid, "labels": label_sets[lid]} for lid in new]
        )
        pairs = [
            {"key": key, "value": value, "label_set_id": lid}
            for lid in new
            for key, value in json.loads(label_sets[lid]).items()
        ]
        self.engine.insert_ignore(conn, schema.label_pairs, pairs)

    def _upsert_series(self, conn: sa.Connection, batch: Batch) -> None:
        rows = []
        for sid, (first, last) in sorted(batch.series_buckets.items()):
            known = self._series_span.get(sid)
            if known is not None and known[0] <= first and last <= known[1]:
                continue
            mode, service, host, instance, labels_id = batch.series[sid]
            rows.append(
                {
                    "id": sid,
                    "mode": mode,
                    "service": service,
                    "host": host,
                    "instance": instance,
                    "label_set_id": labels_id,
                    "first_bucket": first,
                    "last_bucket": last,
                }
            )
        if not rows:
            return
        series = schema.series
        stmt = self.engine.dialect_insert(series)
        new_first, new_last = stmt.excluded.first_bucket, stmt.excluded.last_bucket
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["id"],
                set_={
                    "first_bucket": sa.case(
                        (new_first < series.c.first_bucket, new_first), else_=series.c.first_bucket
                    ),
                    "last_bucket": sa.case(
                        (new_last > series.c.last_bucket, new_last), else_=series.c.last_bucket
                    ),
                },
            ),
            rows,
        )

    def _write_cursors(self, conn: sa.Connection, batch: Batch) -> None:
        if not batch.cursors:
            return
        replaced = sorted({c.target for c in batch.cursors if c.replaced})
        for table in (schema.cursor_entries, schema.cursor_label_sets):
            for i in range(0, len(replaced), _CHUNK):
                conn.execute(sa.delete(table).where(table.c.target.in_(replaced[i : i + _CHUNK])))
        targets = {c.target: c.instance for c in batch.cursors}
        self.engine.upsert(
            conn,
            schema.cursor_targets,
            [{"target": t, "instance": i} for t, i in sorted(targets.items())],
            ["instance"],
        )
        label_rows = {(c.target, index): lid for c in batch.cursors for index, lid in c.label_sets}
        self.engine.upsert(
            conn,
            schema.cursor_label_sets,
            [
                {"target": t, "label_index": i, "label_set_id": lid}
                for (t, i), lid in sorted(label_rows.items())
            ],
            ["label_set_id"],
        )
        entries = {
            (c.target, index, sid): count for c in batch.cursors for index, sid, count in c.entries
        }
        self.engine.upsert_cursor_entries(conn, sorted((*k, v) for k, v in entries.items()))

    def _remember(self, batch: Batch) -> None:
        """Records what the committed batch stored, so the next writes skip it."""
        if len(self._known_stacks) > _KNOWN_STACKS_LIMIT:
            self._known_stacks.clear()
        self._known_stacks.update(batch.stacks)
        self._known_label_sets.update(batch.label_sets)
        for sid, (first, last) in batch.series_buckets.items():
            known = self._series_span.get(sid)
            if known is not None:
                first, last = min(first, known[0]), max(last, known[1])
            self._series_span[sid] = (first, last)

    def forget(self) -> None:
        """Drops what the writer remembers as stored (after retention deleted rows)."""
        self._known_stacks.clear()
        self._known_label_sets.clear()
        self._series_span.clear()

    # Cursors --------------------------------------------------------------------------------

    def load_cursors(self) -> dict[str, Cursor]:
        """Returns the stored cursor of every target: its instance id and cumulative counts."""
        e, s, t = schema.cursor_entries, schema.stacks, schema.cursor_targets
        ls, cl = schema.label_sets, schema.cursor_label_sets
        with translate_errors("loading cursors"), self.engine.read_transaction() as conn:
            cursors = {target: Cursor(instance) for target, instance in conn.execute(sa.select(t))}
            for target, index, folded, count in conn.execute(
                sa.select(e.c.target, e.c.label_index, s.c.folded, e.c.count).join(
                    s, s.c.id == e.c.stack_id
                )
            ):
                if target in cursors:
                    cursors[target].counts[(index, folded)] = count
            for target, index, labels in conn.execute(
                sa.select(cl.c.target, cl.c.label_index, ls.c.labels).join(
                    ls, ls.c.id == cl.c.label_set_id
                )
            ):
                if target in cursors:
                    cursors[target].label_sets[index] = json.loads(labels)
        return cursors

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
