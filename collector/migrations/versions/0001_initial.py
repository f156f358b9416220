"""Initial schema: stacks, label sets, series, samples of every tier, rollup state, cursors.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Creates every table; on PostgreSQL samples is partitioned by tier, then by time."""
    op.create_table(
        "stacks",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("folded", sa.Text, nullable=False),
    )
    op.create_table(
        "label_sets",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("labels", sa.Text, nullable=False),
    )
    op.create_table(
        "label_pairs",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value", sa.Text, primary_key=True),
        sa.Column("label_set_id", sa.BigInteger, primary_key=True, autoincrement=False),
    )
    op.create_table(
        "series",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("service", sa.Text, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("instance", sa.Text, nullable=False),
        sa.Column("label_set_id", sa.BigInteger, nullable=False),
        sa.Column("first_bucket", sa.BigInteger, nullable=False),
        sa.Column("last_bucket", sa.BigInteger, nullable=False),
    )
    op.create_index("series_by_last_bucket", "series", ["last_bucket"])
    if op.get_bind().dialect.name == "postgresql":
        # Partitioned by tier (LIST on width), each tier by time (RANGE on bucket); the tier
        # and time partitions are created ahead by the store, and retention drops them whole.
        op.execute(
            "CREATE TABLE samples ("
            " width integer NOT NULL, bucket bigint NOT NULL,"
            " series_id bigint NOT NULL, stack_id bigint NOT NULL, count bigint NOT NULL,"
            " PRIMARY KEY (width, bucket, series_id, stack_id)"
            ") PARTITION BY LIST (width)"
        )
    else:
        # WITHOUT ROWID clusters the rows by (width, bucket, ...): a time window is one range scan.
        op.create_table(
            "samples",
            sa.Column("width", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("bucket", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("series_id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("stack_id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("count", sa.BigInteger, nullable=False),
            sqlite_with_rowid=False,
        )
    op.create_table(
        "tiers",
        sa.Column("width", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("rolled_to", sa.BigInteger, nullable=False),
        sa.Column("kept_from", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "cursor_targets",
        sa.Column("target", sa.Text, primary_key=True),
        sa.Column("instance", sa.Text, nullable=False),
    )
    op.create_table(
        "cursor_label_sets",
        sa.Column("target", sa.Text, primary_key=True),
        sa.Column("label_index", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("label_set_id", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "cursor_entries",
        sa.Column("target", sa.Text, primary_key=True),
        sa.Column("label_index", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("stack_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("count", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    """Drops every table (and with it every partition)."""
    for table in (
        "cursor_entries",
        "cursor_label_sets",
        "cursor_targets",
        "tiers",
        "samples",
        "series",
        "label_pairs",
        "label_sets",
        "stacks",
    ):
        op.drop_table(table)
