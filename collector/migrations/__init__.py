"""Alembic migrations of the collector's schema, run by Store.migrate()."""
