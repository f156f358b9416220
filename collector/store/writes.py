"""The write transaction of a batch: its stacks, label sets, series and samples.

Samples go to the finest tier; a row for a bucket that a coarser tier (instance or fleet)
has rolled past already is added to that tier too, in the same transaction, so every tier
always holds the same samples. Rows are written sorted by key: every writer takes its row
locks in one order, so two collectors sharing a database cannot deadlock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlalchemy as sa

from collector.store import fleet, schema
from collector.store.errors import StackHashCollision
from collector.store.rows import Batch
from collector.store.tiers import FAR_FUTURE
from sampler.profile import align_down

if TYPE_CHECKING:
    from collector.store.store import Store

__all__ = ["Written", "write_batch"]

_CHUNK = 5000  # ids per IN (...) list: well under SQLite's bound-parameter limit
_KNOWN_STACKS_LIMIT = 2_000_000  # ids the writer remembers as stored (about 100 MB at most)
_RECENT_BUCKETS = 16  # buckets the writer remembers writing in


@dataclass
class Written:
    """What one writer knows is stored, so that its next writes skip it."""

    stacks: set[int] = field(default_factory=set)
    label_sets: set[int] = field(default_factory=set)
    series_spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # first, last bucket
    buckets: set[int] = field(default_factory=set)  # the last buckets it wrote samples in

    def remember(self, batch: Batch) -> None:
        """Records what a committed batch stored."""
        if len(self.stacks) > _KNOWN_STACKS_LIMIT:
            self.stacks.clear()
        self.stacks.update(batch.stacks)
        self.label_sets.update(batch.label_sets)
        for first, last in batch.series_buckets.values():
            self.buckets.update((first, last))
        if len(self.buckets) > _RECENT_BUCKETS:
            self.buckets = set(sorted(self.buckets)[-_RECENT_BUCKETS:])
        for sid, (first, last) in batch.series_buckets.items():
            known = self.series_spans.get(sid)
            if known is not None:
                first, last = min(first, known[0]), max(last, known[1])
            self.series_spans[sid] = (first, last)


def write_batch(store: Store, conn: sa.Connection, batch: Batch) -> None:
    """Writes a batch's stacks, label sets, series and samples, in every tier that has
    rolled past their buckets already."""
    # Shared lock on the rollup state: a rollup cannot move past a bucket while a row
    # for it is being written, so late rows land in every tier already rolled past them.
    states = store.tier_states(conn, lock="share")
    fleet_states = fleet.fleet_states(store, conn, lock="share")
    _insert_stacks(store, conn, batch.stacks)
    _insert_label_sets(store, conn, batch.label_sets)
    _upsert_series(store, conn, batch)
    keys = sorted(batch.samples)  # one lock order for every writer: no deadlocks
    counts = list(map(batch.samples.__getitem__, keys))
    # Buckets this writer has not written before hold no rows of its series, normally.
    new = not any(
        first <= bucket <= last
        for first, last in batch.series_buckets.values()
        for bucket in store.written.buckets
    )
    store.engine.add_samples(conn, store.tiers[0].width, keys, counts, new=new)
    rows = list(zip(keys, counts, strict=True))
    oldest = keys[0][0] if keys else FAR_FUTURE  # sorted by bucket first
    for state in states[1:]:
        if oldest >= state.rolled_to:
            continue
        late: dict[tuple[int, int, int], int] = {}
        for (bucket, series, stack), count in rows:
            if bucket < state.rolled_to:
                key = (align_down(bucket, state.width), series, stack)
                late[key] = late.get(key, 0) + count
        late_keys = sorted(late)
        store.engine.add_samples(conn, state.width, late_keys, list(map(late.get, late_keys)))
    if any(oldest < s.rolled_to for s in fleet_states):
        fleet_of = {sid: key.fleet_id for sid, key in batch.series.items()}
        fleet.add_late(conn, fleet_states, rows, fleet_of)


def _insert_stacks(store: Store, conn: sa.Connection, stacks: dict[int, str]) -> None:
    new = sorted(sid for sid in stacks if sid not in store.written.stacks)
    if not new:
        return
    store.engine.insert_ignore(conn, schema.stacks, [{"id": s, "folded": stacks[s]} for s in new])
    # Ids are 64-bit hashes: check that what is stored under each new id is this stack.
    for i in range(0, len(new), _CHUNK):
        chunk = new[i : i + _CHUNK]
        stored = conn.execute(
            sa.select(schema.stacks.c.id, schema.stacks.c.folded).where(
                schema.stacks.c.id.in_(chunk)
            )
        )
        for sid, folded in stored:
            if folded != stacks[sid]:
                raise StackHashCollision(
                    f"stacks {folded[:60]!r} and {stacks[sid][:60]!r} share id {sid}"
                )


def _insert_label_sets(store: Store, conn: sa.Connection, label_sets: dict[int, str]) -> None:
    new = sorted(lid for lid in label_sets if lid not in store.written.label_sets)
    if not new:
        return
    store.engine.insert_ignore(
        conn, schema.label_sets, [{"id": lid, "labels": label_sets[lid]} for lid in new]
    )
    pairs = [
        {"key": key, "value": value, "label_set_id": lid}
        for lid in new
        for key, value in json.loads(label_sets[lid]).items()
    ]
    store.engine.insert_ignore(conn, schema.label_pairs, pairs)


def _upsert_series(store: Store, conn: sa.Connection, batch: Batch) -> None:
    rows = []
    for sid, (first, last) in sorted(batch.series_buckets.items()):
        known = store.written.series_spans.get(sid)
        if known is not None and known[0] <= first and last <= known[1]:
            continue
        key = batch.series[sid]
        rows.append(
            {
                "id": sid,
                "mode": key.mode,
                "service": key.service,
                "host": key.host,
                "instance": key.instance,
                "label_set_id": key.labels_id,
                "interval": key.interval,
                "fleet_id": key.fleet_id,
                "first_bucket": first,
                "last_bucket": last,
            }
        )
    if not rows:
        return
    _upsert_spans(store, conn, schema.series, rows)
    fleets: dict[int, dict] = {}
    for row in rows:
        key = batch.series[row["id"]]
        found = fleets.get(key.fleet_id)
        if found is None:
            fleets[key.fleet_id] = {
                "id": key.fleet_id,
                "mode": key.mode,
                "service": key.service,
                "label_set_id": key.fleet_labels_id,
                "interval": key.interval,
                "first_bucket": row["first_bucket"],
                "last_bucket": row["last_bucket"],
            }
        else:
            found["first_bucket"] = min(found["first_bucket"], row["first_bucket"])
            found["last_bucket"] = max(found["last_bucket"], row["last_bucket"])
    _upsert_spans(store, conn, schema.fleet_series, [fleets[f] for f in sorted(fleets)])


def _upsert_spans(store: Store, conn: sa.Connection, table: sa.Table, rows: list[dict]) -> None:
    """Inserts series rows, or widens the first and last bucket of those stored."""
    stmt = store.engine.dialect_insert(table)
    new_first, new_last = stmt.excluded.first_bucket, stmt.excluded.last_bucket
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["id"],
            set_={
                "first_bucket": sa.case(
                    (new_first < table.c.first_bucket, new_first), else_=table.c.first_bucket
                ),
                "last_bucket": sa.case(
                    (new_last > table.c.last_bucket, new_last), else_=table.c.last_bucket
                ),
            },
        ),
        rows,
    )
