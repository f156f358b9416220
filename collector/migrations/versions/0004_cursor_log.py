"""Cursors as a log per target: one row per write holding the counts that changed, packed.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

Replaces cursor_entries (one row per target, label set and stack, upserted at every poll:
as much work as writing the samples) with cursor_log (collector/store/cursors.py). Each
target's entries become its first log row.
"""

from __future__ import annotations

import sys
import zlib
from array import array

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _pack(values: list[int], code: str, compress: bool = False) -> bytes:
    # collector.store.packing.pack as of this revision: little-endian, deflated counts.
    packed = array(code, values)
    if sys.byteorder == "big":
        packed.byteswap()
    return zlib.compress(packed.tobytes(), 1) if compress else packed.tobytes()


def upgrade() -> None:
    """Creates cursor_log from cursor_entries, and drops cursor_entries."""
    op.create_table(
        "cursor_log",
        sa.Column("target", sa.Text, primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("label_indexes", sa.LargeBinary, nullable=False),
        sa.Column("stack_ids", sa.LargeBinary, nullable=False),
        sa.Column("counts", sa.LargeBinary, nullable=False),
    )
    conn = op.get_bind()
    entries: dict[str, tuple[list[int], list[int], list[int]]] = {}
    for target, index, stack, count in conn.execute(
        sa.text("SELECT target, label_index, stack_id, count FROM cursor_entries")
    ):
        columns = entries.setdefault(target, ([], [], []))
        columns[0].append(index)
        columns[1].append(stack)
        columns[2].append(count)
    log = sa.Table("cursor_log", sa.MetaData(), autoload_with=conn)
    rows = [
        {
            "target": target,
            "seq": 1,
            "label_indexes": _pack(indexes, "i"),
            "stack_ids": _pack(ids, "q"),
            "counts": _pack(counts, "q", compress=True),
        }
        for target, (indexes, ids, counts) in sorted(entries.items())
    ]
    if rows:
        conn.execute(log.insert(), rows)
    op.drop_table("cursor_entries")


def downgrade() -> None:
    """Not supported: restore the backup taken before upgrading (docs/operations.md)."""
    raise NotImplementedError("downgrades across schema revisions are not supported")
