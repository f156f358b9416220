"""Copies a fleetflame store from one database to another, e.g. from SQLite to PostgreSQL.

    python -m collector.migrate_db --from sqlite:////var/lib/fleetflame/fleetflame.db \\
        --to postgresql+psycopg://fleetflame@db/fleetflame

Stop the collector first (the web UI may keep running). The target is brought to the current
schema (Alembic) and must hold no samples yet. Every table is copied in one target
transaction, read from one consistent snapshot of the source, then the row counts and the
sum of all sample counts are compared: a copy that fails or does not match leaves the target
empty and says why. Nothing is ever written to the source.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

from collector.store import Store, StoreError, schema

__all__ = ["MigrationError", "copy_store", "head_revision", "main"]

# Copy order does not matter for integrity (ids are hashes, there are no foreign keys), but
# small reference tables first make a partial failure easier to read in the logs.
TABLES: tuple[sa.Table, ...] = (
    schema.stacks,
    schema.label_sets,
    schema.label_pairs,
    schema.series,
    schema.tiers,
    schema.samples,
    schema.cursor_targets,
    schema.cursor_label_sets,
    schema.cursor_log,
    schema.stall_events,
    schema.request_buckets,
    schema.request_fleet,
    schema.findings,
)


class MigrationError(RuntimeError):
    """The copy cannot be done or did not verify; the message says what to do."""


def head_revision() -> str:
    """Returns the schema revision this version of fleetflame writes (Alembic's head)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from collector.store.store import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def _revision(conn: sa.Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


@contextmanager
def _snapshot(store: Store) -> Iterator[sa.Connection]:
    """Yields a read connection that sees one consistent state of the source for the whole copy."""
    engine = store.engine.sa_engine
    if store.dialect == "postgresql":
        engine = engine.execution_options(isolation_level="REPEATABLE READ")
    with engine.connect() as conn, conn.begin():
        yield conn


def _count(conn: sa.Connection, table: sa.Table) -> int:
    return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def _sample_total(conn: sa.Connection) -> int:
    total = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(schema.samples.c["count"]), 0)))
    return int(total.scalar_one())


def copy_store(
    source_url: str,
    target_url: str,
    *,
    batch: int = 5000,
    log: Callable[[str], None] = print,
) -> dict[str, int]:
    """Copies every table of the store at ``source_url`` into ``target_url``; returns rows per table."""
    if sa.engine.make_url(source_url) == sa.engine.make_url(target_url):
        raise MigrationError("--from and --to are the same database")
    if batch < 1:
        raise MigrationError("the batch size must be at least 1")
    source_db = sa.engine.make_url(source_url)
    if source_db.get_backend_name() == "sqlite" and not (
        source_db.database and Path(source_db.database).is_file()
    ):
        # Opening it would create an empty file: the source must never be written.
        raise MigrationError(f"no SQLite file at {source_db.database!r}")
    source, target = Store(source_url), Store(target_url)
    try:
        return _copy(source, target, batch, log)
    except StoreError as exc:
        raise MigrationError(str(exc)) from exc
    except sa.exc.SQLAlchemyError as exc:
        raise MigrationError(f"the copy failed and was rolled back: {exc}") from exc
    finally:
        source.engine.dispose()
        target.engine.dispose()


def _copy(source: Store, target: Store, batch: int, log: Callable[[str], None]) -> dict[str, int]:
    head = head_revision()
    with source.engine.read_transaction() as conn:
        found = _revision(conn)
    if found is None:
        raise MigrationError(f"{source.engine.url} holds no fleetflame schema (no alembic_version)")
    if found != head:
        raise MigrationError(
            f"the source schema is at revision {found}, this fleetflame writes {head}: run this "
            "version's collector on the source once (it upgrades the schema), then copy"
        )
    log(f"bringing the target schema to revision {head}")
    target.migrate()
    with target.engine.read_transaction() as conn:
        filled = {t.name: n for t in TABLES if t is not schema.tiers and (n := _count(conn, t))}
    if filled:
        detail = ", ".join(f"{n} rows in {name}" for name, n in filled.items())
        raise MigrationError(
            f"the target already holds data ({detail}): copy into an empty database"
        )

    copied: dict[str, int] = {}
    started = time.monotonic()
    with _snapshot(source) as read:
        if target.dialect == "postgresql":
            # Samples go into time partitions that must exist before rows arrive.
            widths: dict[int, set[int]] = {}
            for width, bucket in read.execute(
                sa.select(schema.samples.c.width, schema.samples.c.bucket).distinct()
            ):
                widths.setdefault(int(width), set()).add(int(bucket))
            for width, buckets in widths.items():
                target.engine.ensure_partitions(width, buckets)
        with target.engine.write_transaction() as write:
            write.execute(sa.delete(schema.tiers))  # migrate() seeded defaults; use the source's
            for table in TABLES:
                rows = read.execute(sa.select(table).execution_options(yield_per=batch))
                n = 0
                for part in rows.partitions(batch):
                    write.execute(table.insert(), [dict(row._mapping) for row in part])
                    n += len(part)
                copied[table.name] = n
                log(f"copied {n:>10} rows of {table.name}")
        expected = {t.name: _count(read, t) for t in TABLES}
        expected_total = _sample_total(read)
    with target.engine.read_transaction() as check:
        got = {t.name: _count(check, t) for t in TABLES}
        got_total = _sample_total(check)
    if got != expected or got_total != expected_total:
        raise MigrationError(
            f"the copy does not match the source: rows {got} != {expected} or "
            f"sample total {got_total} != {expected_total}"
        )
    log(
        f"done in {time.monotonic() - started:.1f} s: {sum(copied.values())} rows, "
        f"{got_total} samples; point the collector and the web UI at the new database_url"
    )
    return copied


def main(argv: list[str] | None = None) -> int:
    """Runs the copy from the command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m collector.migrate_db",
        description="Copy a fleetflame store to another database (stop the collector first).",
    )
    parser.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="URL",
        help="SQLAlchemy URL of the store to copy (only read)",
    )
    parser.add_argument(
        "--to",
        dest="target",
        required=True,
        metavar="URL",
        help="SQLAlchemy URL of the empty target database",
    )
    parser.add_argument("--batch", type=int, default=5000, help="rows per insert [5000]")
    args = parser.parse_args(argv)
    try:
        copy_store(args.source, args.target, batch=args.batch)
    except MigrationError as exc:
        print(f"migrate_db: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
