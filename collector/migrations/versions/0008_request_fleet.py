"""Request figures of the fleet: per service and route, every instance's merged, by the day,
the hour, ten minutes and the minute.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25

request_fleet is what /api/requests reads when no host or instance is asked for: a window's
whole days by the day, and so on down to the minutes of its edges, so a month of a fleet is a
few thousand rows, not millions (collector/worst_rows.py writes it with request_buckets). Filled
here from the minute rows kept.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

CHUNK = 10_000


def upgrade() -> None:
    """Creates request_fleet and fills it from request_buckets."""
    from collector.worst_rows import add_fleet_rows

    op.create_table(
        "request_fleet",
        sa.Column("width", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("bucket", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("service", sa.Text, primary_key=True),
        sa.Column("route", sa.Text, primary_key=True),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.Column("errors", sa.BigInteger, nullable=False),
        sa.Column("sketches", sa.Text, nullable=False),
        sa.Column("slow", sa.Text, nullable=False),
    )
    conn = op.get_bind()
    minutes = sa.table(
        "request_buckets",
        *(
            sa.column(name)
            for name in ("bucket", "instance", "route", "service", "count", "errors")
        ),
        sa.column("sketches"),
        sa.column("slow"),
    )
    order = (minutes.c.bucket, minutes.c.instance, minutes.c.route)
    after: tuple = ()
    while True:
        query = sa.select(minutes).order_by(*order).limit(CHUNK)
        if after:
            query = query.where(sa.tuple_(*order) > sa.tuple_(*map(sa.literal, after)))
        rows = [dict(row) for row in conn.execute(query).mappings()]
        if not rows:
            break
        add_fleet_rows(conn, rows)
        last = rows[-1]
        after = (last["bucket"], last["instance"], last["route"])


def downgrade() -> None:
    """Not supported: restore the backup taken before upgrading (docs/operations.md)."""
    raise NotImplementedError("downgrades across schema revisions are not supported")
