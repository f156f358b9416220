"""The tables, as SQLAlchemy Core objects the store and the query module build statements from.

The migrations under collector/migrations create these tables; this module only describes
them. Ids are 64-bit hashes computed by the writer (see rows.py), so there are no sequences
and no foreign keys to slow bulk inserts down.
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = [
    "cursor_entries",
    "cursor_label_sets",
    "cursor_targets",
    "label_pairs",
    "label_sets",
    "metadata",
    "samples",
    "series",
    "stacks",
    "tiers",
]

metadata = sa.MetaData()

stacks = sa.Table(
    "stacks",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("folded", sa.Text, nullable=False),
)

label_sets = sa.Table(
    "label_sets",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("labels", sa.Text, nullable=False),  # canonical JSON object
)

# One row per (label set, key): lets a filter on label values run as SQL.
label_pairs = sa.Table(
    "label_pairs",
    metadata,
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("value", sa.Text, primary_key=True),
    sa.Column("label_set_id", sa.BigInteger, primary_key=True, autoincrement=False),
)

# A series is everything a sample is keyed by except time and stack.
series = sa.Table(
    "series",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("mode", sa.String(8), nullable=False),
    sa.Column("service", sa.Text, nullable=False),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("instance", sa.Text, nullable=False),
    sa.Column("label_set_id", sa.BigInteger, nullable=False),
    sa.Column("first_bucket", sa.BigInteger, nullable=False),
    sa.Column("last_bucket", sa.BigInteger, nullable=False),
)

# Samples of every resolution; `width` is the bucket width in seconds of the row's tier.
samples = sa.Table(
    "samples",
    metadata,
    sa.Column("width", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("bucket", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("series_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("stack_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("count", sa.BigInteger, nullable=False),
)

# Rollup state per tier: rows are complete for buckets in [kept_from, rolled_to).
tiers = sa.Table(
    "tiers",
    metadata,
    sa.Column("width", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("rolled_to", sa.BigInteger, nullable=False),
    sa.Column("kept_from", sa.BigInteger, nullable=False),
)

cursor_targets = sa.Table(
    "cursor_targets",
    metadata,
    sa.Column("target", sa.Text, primary_key=True),
    sa.Column("instance", sa.Text, nullable=False),
)

cursor_label_sets = sa.Table(
    "cursor_label_sets",
    metadata,
    sa.Column("target", sa.Text, primary_key=True),
    sa.Column("label_index", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("label_set_id", sa.BigInteger, nullable=False),
)

cursor_entries = sa.Table(
    "cursor_entries",
    metadata,
    sa.Column("target", sa.Text, primary_key=True),
    sa.Column("label_index", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("stack_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("count", sa.BigInteger, nullable=False),
)
