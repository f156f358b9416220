"""Worst cases: the stalls and per-route request figures the sampler serves (issue 16).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25

stall_events holds each stall once (keyed by a hash of its sampler instance and id) with its
stacks; request_buckets holds, per minute, service, instance and route, what the requests
that ended then added to the route's sketches and its slowest requests (collector/worst.py).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Creates stall_events and request_buckets."""
    op.create_table(
        "stall_events",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("start", sa.Float, nullable=False),
        sa.Column("duration", sa.Float, nullable=False),
        sa.Column("service", sa.Text, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("instance", sa.Text, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("thread", sa.Text, nullable=False),
        sa.Column("what", sa.Text, nullable=False),
        sa.Column("stacks", sa.Text, nullable=False),  # JSON: {"wall": {...}, "cpu": {...}}
    )
    op.create_index("stall_events_by_start", "stall_events", ["start"])
    op.create_table(
        "request_buckets",
        sa.Column("bucket", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("instance", sa.Text, primary_key=True),
        sa.Column("route", sa.Text, primary_key=True),
        sa.Column("service", sa.Text, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.Column("errors", sa.BigInteger, nullable=False),
        sa.Column("sketches", sa.Text, nullable=False),  # JSON: latency, queue, total deltas
        sa.Column("slow", sa.Text, nullable=False),  # JSON: slowest 1%'s count, stacks; slowest
    )


def downgrade() -> None:
    """Not supported: restore the backup taken before upgrading (docs/operations.md)."""
    raise NotImplementedError("downgrades across schema revisions are not supported")
