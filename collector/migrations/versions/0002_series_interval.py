"""The sampling interval of every series: seconds one sample stands for.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24

Series stored before it was carried are the sampler's default, 100 samples a second.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Adds series.interval (seconds, 0.01 for the series stored so far)."""
    op.add_column("series", sa.Column("interval", sa.Float, nullable=False, server_default="0.01"))


def downgrade() -> None:
    """Drops series.interval."""
    with op.batch_alter_table("series") as batch:
        batch.drop_column("interval")
