"""The tables, as SQLAlchemy Core objects the store and the query module build statements from.

The migrations under collector/migrations create these tables; this module only describes
them. Ids are 64-bit hashes computed by the writer (see rows.py), so there are no sequences
and no foreign keys to slow bulk inserts down.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

__all__ = [
    "cursor_label_sets",
    "cursor_log",
    "cursor_targets",
    "fleet_samples",
    "fleet_series",
    "findings",
    "fleet_tiers",
    "label_pairs",
    "label_sets",
    "metadata",
    "request_buckets",
    "request_fleet",
    "samples",
    "series",
    "stacks",
    "stall_events",
    "tiers",
]

metadata = sa.MetaData()


def _key(*names: str) -> list[sa.Column]:
    """Primary key columns of 64-bit integers the writer computes (no sequences)."""
    return [sa.Column(n, sa.BigInteger, primary_key=True, autoincrement=False) for n in names]


def _text_key(*names: str) -> list[sa.Column]:
    """Primary key columns of text."""
    return [sa.Column(n, sa.Text, primary_key=True) for n in names]


def _not_null(**types: Any) -> list[sa.Column]:
    """NOT NULL columns of these names and types, in this order (most columns are)."""
    return [sa.Column(name, type_, nullable=False) for name, type_ in types.items()]


stacks = sa.Table("stacks", metadata, *_key("id"), *_not_null(folded=sa.Text))

label_sets = sa.Table(
    "label_sets",
    metadata,
    *_key("id"),
    *_not_null(labels=sa.Text),  # canonical JSON object
)

# One row per (label set, key): lets a filter on label values run as SQL.
label_pairs = sa.Table(
    "label_pairs",
    metadata,
    *_text_key("key", "value"),
    *_key("label_set_id"),
)


def _series(name: str, **types: Any) -> sa.Table:
    """A series table: its id, mode and service, NOT NULL columns of ``types``, its label set,
    the first and last bucket it has rows in and its sampling interval (seconds one sample
    stands for)."""
    return sa.Table(
        name,
        metadata,
        *_key("id"),
        *_not_null(mode=sa.String(8), service=sa.Text, **types, label_set_id=sa.BigInteger),
        *_not_null(first_bucket=sa.BigInteger, last_bucket=sa.BigInteger, interval=sa.Float),
    )


# A series is everything a sample is keyed by except time and stack.
series = _series(
    "series",
    host=sa.Text,
    instance=sa.Text,
    fleet_id=sa.BigInteger,  # its fleet series
)
# A fleet series is a series without host and instance: the fleet tiers' key.
fleet_series = _series("fleet_series")


def _width() -> sa.Column:
    """The first primary key column of a tier's rows: its bucket width in seconds."""
    return sa.Column("width", sa.Integer, primary_key=True, autoincrement=False)


# One row per fleet tier, bucket and fleet series: every stack's count as packed arrays
# (collector/store/fleet.py), and their total (what a timeline reads).
fleet_samples = sa.Table(
    "fleet_samples",
    metadata,
    _width(),
    *_key("bucket", "fleet_id"),
    *_not_null(total=sa.BigInteger, stack_ids=sa.LargeBinary, counts=sa.LargeBinary),
)


def _tier_states(name: str) -> sa.Table:
    """A tier state table: the rows of each width are complete in [kept_from, rolled_to)."""
    return sa.Table(
        name, metadata, _width(), *_not_null(rolled_to=sa.BigInteger, kept_from=sa.BigInteger)
    )


fleet_tiers = _tier_states("fleet_tiers")  # the fleet tiers' folds

# Samples of every resolution; `width` is the bucket width in seconds of the row's tier.
samples = sa.Table(
    "samples",
    metadata,
    _width(),
    *_key("bucket", "series_id", "stack_id"),
    *_not_null(count=sa.BigInteger),
)

tiers = _tier_states("tiers")  # the instance tiers' rollups

cursor_targets = sa.Table(
    "cursor_targets",
    metadata,
    *_text_key("target"),
    *_not_null(instance=sa.Text),
)

cursor_label_sets = sa.Table(
    "cursor_label_sets",
    metadata,
    *_text_key("target"),
    sa.Column("label_index", sa.Integer, primary_key=True, autoincrement=False),
    *_not_null(label_set_id=sa.BigInteger),
)

# Each target's cursor as a log: every write appends the counts that changed, as packed
# arrays (label set index, stack id, cumulative count); every few writes the writer folds a
# target's log into one row. Loading replays it in `seq` order.
cursor_log = sa.Table(
    "cursor_log",
    metadata,
    *_text_key("target"),
    *_key("seq"),
    *_not_null(label_indexes=sa.LargeBinary, stack_ids=sa.LargeBinary, counts=sa.LargeBinary),
)

# The worst cases the sampler serves (collector/worst.py, migration 0006): each stall once, with
# its stacks as JSON; per minute, instance and route, what its requests added to its sketches.
stall_events = sa.Table(
    "stall_events",
    metadata,
    *_key("id"),
    *_not_null(start=sa.Float, duration=sa.Float),
    *_not_null(service=sa.Text, host=sa.Text, instance=sa.Text),
    *_not_null(kind=sa.String(16), thread=sa.Text, what=sa.Text, stacks=sa.Text),
)

request_buckets = sa.Table(
    "request_buckets",
    metadata,
    *_key("bucket"),
    *_text_key("instance", "route"),
    *_not_null(service=sa.Text, host=sa.Text),
    *_not_null(count=sa.BigInteger, errors=sa.BigInteger, sketches=sa.Text, slow=sa.Text),
)

# The same per service and route, every instance and host merged, at each of the widths of
# collector.worst_rows.FLEET_WIDTHS (migration 0008): what a window reads when no host or instance
# is asked for, its whole days by the day, and so on down to its minutes.
request_fleet = sa.Table(
    "request_fleet",
    metadata,
    *_key("width", "bucket"),
    *_text_key("service", "route"),
    *_not_null(count=sa.BigInteger, errors=sa.BigInteger, sketches=sa.Text, slow=sa.Text),
)

# The regressions the scheduled comparison found (collector/findings.py, migration 0007).
findings = sa.Table(
    "findings",
    metadata,
    *_key("id"),
    *_not_null(found_at=sa.Float, service=sa.Text, function=sa.Text, kind=sa.String(8)),
    *_not_null(a_share=sa.Float, b_share=sa.Float, change=sa.Float),
    sa.Column("ci_low", sa.Float),
    sa.Column("ci_high", sa.Float),
    sa.Column("q", sa.Float),
    *_not_null(compared=sa.Text),
    *_not_null(a_from=sa.BigInteger, a_to=sa.BigInteger, b_from=sa.BigInteger, b_to=sa.BigInteger),
    *_not_null(a_label=sa.Text, b_label=sa.Text, link=sa.Text, sent=sa.Integer),
)
