"""Fleet tiers: every instance of a service summed, one row per bucket (collector/store/fleet.py).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24

Adds each series' fleet series (series.fleet_id, and the fleet_series they name), the
fleet_samples rows and the fleet_tiers state. The rows are folded by the next rollup run from
the instance tiers, so a database from before keeps answering every window meanwhile.
"""

from __future__ import annotations

import hashlib
import json

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


# collector.store.ids as of this revision: ids never change once stored.
INSTANCE_LABELS = ("pod", "node")


def _hash64(text: str) -> int:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _fleet_id(mode: str, service: str, labels_id: int, interval: float) -> int:
    return _hash64("\x00".join(("fleet", mode, service, str(labels_id), repr(float(interval)))))


def _fleet_label_sets(conn: sa.Connection) -> dict[int, int]:
    """Returns, per label set, the label set its fleet series keeps (without the labels
    naming an instance), storing those that are new."""
    kept: dict[int, int] = {}
    new: dict[int, dict[str, str]] = {}
    for lid, text in conn.execute(sa.text("SELECT id, labels FROM label_sets")):
        labels = json.loads(text)
        if not any(key in labels for key in INSTANCE_LABELS):
            kept[lid] = lid
            continue
        reduced = {k: v for k, v in sorted(labels.items()) if k not in INSTANCE_LABELS}
        reduced_text = json.dumps(reduced, ensure_ascii=False, separators=(",", ":"))
        kept[lid] = _hash64("labels\x00" + reduced_text)
        new[kept[lid]] = reduced
    stored = set(kept.values()) & set(conn.execute(sa.text("SELECT id FROM label_sets")).scalars())
    for lid, labels in new.items():
        if lid in stored:
            continue
        text = json.dumps(labels, ensure_ascii=False, separators=(",", ":"))
        conn.execute(
            sa.text("INSERT INTO label_sets (id, labels) VALUES (:i, :t)"), {"i": lid, "t": text}
        )
        for key, value in labels.items():
            conn.execute(
                sa.text("INSERT INTO label_pairs (key, value, label_set_id) VALUES (:k, :v, :i)"),
                {"k": key, "v": value, "i": lid},
            )
    return kept


def upgrade() -> None:
    """Creates the fleet tables and names every stored series' fleet series."""
    op.create_table(
        "fleet_series",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("mode", sa.String(8), nullable=False),
        sa.Column("service", sa.Text, nullable=False),
        sa.Column("label_set_id", sa.BigInteger, nullable=False),
        sa.Column("interval", sa.Float, nullable=False),
        sa.Column("first_bucket", sa.BigInteger, nullable=False),
        sa.Column("last_bucket", sa.BigInteger, nullable=False),
    )
    op.create_index("fleet_series_by_last_bucket", "fleet_series", ["last_bucket"])
    op.create_table(
        "fleet_samples",
        sa.Column("width", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("bucket", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("fleet_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("total", sa.BigInteger, nullable=False),
        sa.Column("stack_ids", sa.LargeBinary, nullable=False),
        sa.Column("counts", sa.LargeBinary, nullable=False),
        sqlite_with_rowid=False,
    )
    if op.get_bind().dialect.name == "postgresql":
        # Stack ids are random 64-bit hashes: compressing them only costs time.
        op.execute("ALTER TABLE fleet_samples ALTER COLUMN stack_ids SET STORAGE EXTERNAL")
    op.create_table(
        "fleet_tiers",
        sa.Column("width", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("rolled_to", sa.BigInteger, nullable=False),
        sa.Column("kept_from", sa.BigInteger, nullable=False),
    )
    op.add_column(
        "series", sa.Column("fleet_id", sa.BigInteger, nullable=False, server_default="0")
    )
    conn = op.get_bind()
    tables = sa.MetaData()
    series = sa.Table("series", tables, autoload_with=conn)
    kept = _fleet_label_sets(conn)
    fleets: dict[int, dict] = {}
    updates = []
    for sid, mode, service, labels_id, interval, first, last in conn.execute(
        sa.select(
            series.c.id,
            series.c.mode,
            series.c.service,
            series.c.label_set_id,
            series.c.interval,
            series.c.first_bucket,
            series.c.last_bucket,
        )
    ):
        labels_id = kept.get(labels_id, labels_id)
        fid = _fleet_id(mode, service, labels_id, interval)
        updates.append({"sid": sid, "fid": fid})
        known = fleets.get(fid)
        if known is None:
            fleets[fid] = {
                "id": fid,
                "mode": mode,
                "service": service,
                "label_set_id": labels_id,
                "interval": interval,
                "first_bucket": first,
                "last_bucket": last,
            }
        else:
            known["first_bucket"] = min(known["first_bucket"], first)
            known["last_bucket"] = max(known["last_bucket"], last)
    if updates:
        conn.execute(
            series.update()
            .where(series.c.id == sa.bindparam("sid"))
            .values(fleet_id=sa.bindparam("fid")),
            updates,
        )
    if fleets:
        fleet_series = sa.table(
            "fleet_series", *(sa.column(k) for k in next(iter(fleets.values())))
        )
        conn.execute(fleet_series.insert(), list(fleets.values()))


def downgrade() -> None:
    """Drops the fleet tables and series.fleet_id."""
    with op.batch_alter_table("series") as batch:
        batch.drop_column("fleet_id")
    for table in ("fleet_tiers", "fleet_samples", "fleet_series"):
        op.drop_table(table)
