"""Scheduled maintenance: rolling samples up into coarser tiers, expiring tiers, retention.

Every step is idempotent and commits in small transactions that also advance the tier state
(`rolled_to`, `kept_from`), so a run killed half way is finished by the next one, and two
collectors running it at once serialise on the tier rows.
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

import sqlalchemy as sa

from collector.store import fleet, schema
from collector.store.tiers import FAR_FUTURE, ChunkPace, Tier
from sampler.profile import align_down, align_up

if TYPE_CHECKING:
    from collector.store.store import Store

__all__ = ["apply_retention", "rollup"]

# Rows of a coarse bucket are materialised this long after the bucket ends, so that the
# last poll of the bucket has normally been written (later rows are still handled).
GRACE_BUCKETS = 2
PARTITIONS_AHEAD = 86400  # seconds of future partitions created by each run

_ROLLUP = sa.text(
    "INSERT INTO samples (width, bucket, series_id, stack_id, count) "
    "SELECT CAST(:dst AS integer), bucket - bucket % CAST(:dst AS bigint), series_id, stack_id, "
    "SUM(count) FROM samples "
    "WHERE width = :src AND bucket >= :start AND bucket < :end "
    "GROUP BY 2, 3, 4 "
    "ON CONFLICT (width, bucket, series_id, stack_id) "
    "DO UPDATE SET count = samples.count + excluded.count"
)


def rollup(store: Store, now: int) -> None:
    """Rolls every tier up into the next, expires non-final tiers and creates partitions ahead."""
    _create_ahead(store, now)
    for source, target in pairwise(store.tiers):
        pace = ChunkPace()
        while _rollup_chunk(store, source, target, now, pace):
            pass
    fleet.fold(store, now)
    _expire_tiers(store, now)
    fleet.expire(store, now)
    store.engine.reclaim_space()
    for tier in store.tiers:  # the partitions being filled now, and the one just completed
        store.engine.analyze(tier.width, {now - 3600, now})


def _create_ahead(store: Store, now: int) -> None:
    for tier in store.tiers:
        step = min(tier.width, 21600)
        buckets = {align_down(t, tier.width) for t in range(now, now + PARTITIONS_AHEAD, step)}
        store.engine.ensure_partitions(tier.width, buckets)


def _rollup_chunk(store: Store, source: Tier, target: Tier, now: int, pace: ChunkPace) -> bool:
    """Materialises the next chunk of `target` from `source`; returns False when up to date."""
    engine = store.engine
    with engine.read_transaction() as conn:
        states = {s.width: s for s in store.tier_states(conn)}
        start = states[target.width].rolled_to
        limit = align_down(now - GRACE_BUCKETS * store.bucket_seconds, target.width)
        if source is not store.tiers[0]:
            limit = min(limit, align_down(states[source.width].rolled_to, target.width))
        if start >= limit:
            return False
        first = conn.execute(
            sa.select(sa.func.min(schema.samples.c.bucket)).where(
                schema.samples.c.width == source.width,
                schema.samples.c.bucket >= start,
                schema.samples.c.bucket < limit,
            )
        ).scalar()
    if first is None:
        end = limit  # nothing to roll up: just move the watermark
    else:
        chunk = pace.span(max(target.width, 3600))
        end = min(limit, align_down(first, target.width) + chunk)
        engine.ensure_partitions(
            target.width, set(range(align_down(first, target.width), end, target.width))
        )
    with engine.write_transaction() as conn:
        states = {s.width: s for s in store.tier_states(conn, lock="update")}
        if states[target.width].rolled_to != start:
            return True  # another collector moved it meanwhile: look again
        if first is not None:
            written = conn.execute(
                _ROLLUP, {"dst": target.width, "src": source.width, "start": start, "end": end}
            )
            pace.done(written.rowcount)
        conn.execute(
            sa.update(schema.tiers)
            .where(schema.tiers.c.width == target.width)
            .values(rolled_to=end)
        )
    return True


def _expire_tiers(store: Store, now: int) -> None:
    """Removes rows of each non-final tier older than it keeps them, once rolled up."""
    coarsest = store.coarsest
    for tier, coarser in pairwise(store.tiers):
        assert tier.keep is not None
        with store.engine.write_transaction() as conn:
            states = {s.width: s for s in store.tier_states(conn, lock="update")}
            folded = {s.width: s.rolled_to for s in fleet.fleet_states(store, conn)}
            # Never remove rows the next tier, or the fleet tier of this width, has not
            # absorbed yet; cut on the coarsest width so that no row of any tier straddles
            # the boundary (see tiers.plan).
            absorbed = min(states[coarser.width].rolled_to, folded.get(tier.width, FAR_FUTURE))
            cutoff = align_down(min(now - tier.keep, absorbed), coarsest)
            _expire(store, conn, tier.width, cutoff, states[tier.width].kept_from)


def _expire(store: Store, conn: sa.Connection, width: int, cutoff: int, kept_from: int) -> None:
    if cutoff <= kept_from:
        return
    complete_from = align_up(store.engine.expire(conn, width, cutoff), store.coarsest)
    if complete_from > kept_from:
        conn.execute(
            sa.update(schema.tiers)
            .where(schema.tiers.c.width == width)
            .values(kept_from=complete_from)
        )


def apply_retention(store: Store, now: int) -> None:
    """Removes samples of every tier older than the retention period, and series seen only before."""
    cutoff = align_down(now - store.retention_seconds, store.coarsest)
    with store.engine.write_transaction() as conn:
        states = {s.width: s for s in store.tier_states(conn, lock="update")}
        for tier in store.tiers:
            _expire(store, conn, tier.width, cutoff, states[tier.width].kept_from)
        for state in fleet.fleet_states(store, conn, lock="update"):
            fleet.remove_before(conn, state, cutoff)
        for table in (schema.series, schema.fleet_series):
            conn.execute(sa.delete(table).where(table.c.last_bucket < cutoff))
    store.engine.reclaim_space()
