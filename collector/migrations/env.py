"""Alembic environment: runs on the connection Store.migrate() passes in, never from alembic.ini."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "run migrations with collector.store.Store(url).migrate() or `fleetflame migrate`, "
        "not the alembic command line"
    )
context.configure(connection=connection, target_metadata=None, transaction_per_migration=False)
with context.begin_transaction():
    context.run_migrations()
