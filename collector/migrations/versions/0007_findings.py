"""Findings: the regressions the scheduled comparison found (issue 15, collector/findings.py).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Creates findings."""
    op.create_table(
        "findings",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("found_at", sa.Float, nullable=False),
        sa.Column("service", sa.Text, nullable=False),
        sa.Column("function", sa.Text, nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("a_share", sa.Float, nullable=False),
        sa.Column("b_share", sa.Float, nullable=False),
        sa.Column("change", sa.Float, nullable=False),
        sa.Column("ci_low", sa.Float),
        sa.Column("ci_high", sa.Float),
        sa.Column("q", sa.Float),
        sa.Column("compared", sa.Text, nullable=False),
        sa.Column("a_from", sa.BigInteger, nullable=False),
        sa.Column("a_to", sa.BigInteger, nullable=False),
        sa.Column("b_from", sa.BigInteger, nullable=False),
        sa.Column("b_to", sa.BigInteger, nullable=False),
        sa.Column("a_label", sa.Text, nullable=False),
        sa.Column("b_label", sa.Text, nullable=False),
        sa.Column("link", sa.Text, nullable=False),
        sa.Column("sent", sa.Integer, nullable=False),
    )
    op.create_index("findings_by_time", "findings", ["found_at"])


def downgrade() -> None:
    """Not supported: restore the backup taken before upgrading (docs/operations.md)."""
    raise NotImplementedError("downgrades across schema revisions are not supported")
