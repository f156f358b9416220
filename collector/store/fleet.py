"""Fleet tiers: the samples of every instance of a service summed, one row per bucket.

A fleet series is a series without its host and instance: (mode, service, label set,
interval). For each fleet tier (width) and bucket, one row per fleet series holds the
bucket's counts of every stack as two packed arrays (stack ids, and their counts
compressed), with their total. A window of the whole fleet then reads a few dozen rows
whatever the fleet's size, and sums their arrays: about 0.1 us a stack, where SQLite groups
rows at about 0.4 us each (and a month of a 50-instance fleet is tens of millions of them).

Rows are folded from the instance tier of the same width (the finest from the collector's
minute rows) or from the next finer fleet tier, as soon as their buckets are complete, by
the rollup job; rows written late, for a bucket a fleet tier has folded already, are added
to its row in the writer's transaction (read, add, write back), as the instance tiers do.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from itertools import pairwise
from typing import TYPE_CHECKING

import sqlalchemy as sa

from collector.store import schema
from collector.store.packing import pack, unpack
from collector.store.tiers import ChunkPace, Tier, TierState
from sampler.profile import align_down, align_up

if TYPE_CHECKING:
    from collector.store.store import Store

__all__ = [
    "add_late",
    "decode",
    "decode_ids",
    "encode",
    "expire",
    "fleet_states",
    "fold",
    "remove_before",
    "sum_rows",
]

GRACE_BUCKETS = 2  # as the instance rollups: the last poll of a bucket has normally come


def encode(counts: Mapping[int, int]) -> tuple[bytes, bytes, int]:
    """Returns the packed stack ids (sorted), their packed and compressed counts, and the
    total of the counts."""
    ids = sorted(counts)
    values = list(map(counts.__getitem__, ids))
    return pack(ids), pack(values, compress=True), sum(values)


def decode(packed_ids: bytes, packed_counts: bytes) -> tuple[array[int], array[int]]:
    """Returns the stack ids and counts of a fleet row."""
    return unpack(packed_ids), unpack(packed_counts, compressed=True)


def decode_ids(packed_ids: bytes) -> array[int]:
    """Returns the stack ids of a fleet row."""
    return unpack(packed_ids)


def sum_rows(totals: dict[int, int], rows: Iterable[tuple[bytes, bytes]]) -> None:
    """Adds the counts of fleet rows (packed ids, packed counts) to ``totals`` by stack id."""
    for packed_ids, packed_counts in rows:
        ids, counts = decode(packed_ids, packed_counts)
        if not totals:
            totals.update(zip(ids, counts, strict=True))
            continue
        get = totals.get
        for sid, count in zip(ids, counts, strict=True):
            totals[sid] = get(sid, 0) + count


def fleet_states(store: Store, conn: sa.Connection, *, lock: str | None = None) -> list[TierState]:
    """Returns the fleet tiers' states, finest first; `lock` is "share" or "update"."""
    ft = schema.fleet_tiers
    stmt = sa.select(ft.c.width, ft.c.kept_from, ft.c.rolled_to)
    if lock is not None:
        stmt = stmt.with_for_update(read=lock == "share")
    stored = {w: (k, r) for w, k, r in conn.execute(stmt.order_by(ft.c.width))}
    return [TierState(t.width, *stored.get(t.width, (0, 0)), True) for t in store.fleet_tiers]


# Folding ----------------------------------------------------------------------------------


def fold(store: Store, now: int) -> None:
    """Folds every fleet tier up to date, finest first."""
    for i, tier in enumerate(store.fleet_tiers):
        finer = store.fleet_tiers[i - 1] if i else None
        pace = ChunkPace()
        while _fold_chunk(store, tier, finer, now, pace):
            pass


def _fold_chunk(store: Store, tier: Tier, finer: Tier | None, now: int, pace: ChunkPace) -> bool:
    """Folds the next chunk of a fleet tier; returns False when it is up to date."""
    with store.engine.write_transaction() as conn:
        states = {s.width: s for s in fleet_states(store, conn, lock="update")}
        state = states[tier.width]
        sources = _sources(store, conn, tier, states.get(finer.width) if finer else None, now)
        if state.rolled_to > state.kept_from:
            start = state.rolled_to
        else:  # empty (new, or a database from before fleet tiers): start where a source does
            begins = [low for low, high, _ in sources if low < high]
            if not begins:
                return False
            start = max(state.rolled_to, align_up(min(begins), max(tier.width, store.coarsest)))
        source = next(((lo, hi, src) for lo, hi, src in sources if lo <= start < hi), None)
        if source is None:
            return False
        _low, high, from_fleet = source
        first = _first_bucket(conn, tier.width, from_fleet, finer, start, high)
        if first is None:
            end = high  # nothing stored there: just move the watermark
        else:
            chunk = pace.span(_chunk(tier.width, from_fleet))
            end = min(high, align_down(first, tier.width) + chunk)
            if from_fleet:
                assert finer is not None
                sums = _sums_of_fleet(conn, finer.width, tier.width, start, end)
            else:
                sums = _sums_of_instances(conn, tier.width, start, end)
            _insert(conn, tier.width, sums)
            pace.done(sum(map(len, sums.values())))
        kept_from = state.kept_from if state.rolled_to > state.kept_from else start
        conn.execute(
            sa.update(schema.fleet_tiers)
            .where(schema.fleet_tiers.c.width == tier.width)
            .values(rolled_to=end, kept_from=kept_from)
        )
    return True


def _sources(
    store: Store, conn: sa.Connection, tier: Tier, finer: TierState | None, now: int
) -> list[tuple[int, int, bool]]:
    """Returns what a fleet tier can be folded from, preferred first: (from, to, whether it
    is the finer fleet tier) for the finer fleet tier and the instance tier of its width."""
    complete = align_down(now - GRACE_BUCKETS * store.bucket_seconds, tier.width)
    sources = []
    if finer is not None:
        high = min(complete, align_down(finer.rolled_to, tier.width))
        sources.append((finer.kept_from, high, True))
    instance = {s.width: s for s in store.tier_states(conn)}
    mirror = instance.get(tier.width)
    if mirror is not None:
        finest = tier.width == store.tiers[0].width
        high = complete if finest else min(complete, align_down(mirror.rolled_to, tier.width))
        sources.append((mirror.kept_from, high, False))
    return sources


def _first_bucket(
    conn: sa.Connection, width: int, from_fleet: bool, finer: Tier | None, start: int, end: int
) -> int | None:
    """Returns the first bucket in [start, end) of a source, or None when it has none."""
    table = schema.fleet_samples if from_fleet else schema.samples
    source_width = finer.width if from_fleet and finer is not None else width
    first = conn.execute(
        sa.select(sa.func.min(table.c.bucket)).where(
            table.c.width == source_width, table.c.bucket >= start, table.c.bucket < end
        )
    ).scalar()
    return None if first is None else int(first)


def _chunk(width: int, from_fleet: bool) -> int:
    """The least seconds folded per transaction: ten buckets of instance rows (ten minutes of
    the minute rows: what a rollup run every 5 minutes finds), six hours of finer fleet rows;
    more while a backlog's chunks come back small (see ChunkPace)."""
    if from_fleet:
        return max(width, 6 * 3600)
    return width * 10


def _insert(conn: sa.Connection, width: int, sums: dict[tuple[int, int], dict[int, int]]) -> None:
    rows = []
    for (bucket, fleet), counts in sorted(sums.items()):
        packed_ids, packed_counts, total = encode(counts)
        rows.append(
            {
                "width": width,
                "bucket": bucket,
                "fleet_id": fleet,
                "total": total,
                "stack_ids": packed_ids,
                "counts": packed_counts,
            }
        )
    if rows:
        conn.execute(sa.insert(schema.fleet_samples), rows)


def _sums_of_instances(
    conn: sa.Connection, width: int, start: int, end: int
) -> dict[tuple[int, int], dict[int, int]]:
    """Sums the instance rows of tier ``width`` in [start, end) by (bucket, fleet series):
    the database groups them, so what comes back is as many rows as the fleet rows hold,
    however many instances there are."""
    s, sr = schema.samples, schema.series
    stmt = (
        sa.select(s.c.bucket, sr.c.fleet_id, s.c.stack_id, sa.func.sum(s.c["count"]))
        .join(sr, sr.c.id == s.c.series_id)
        .where(s.c.width == width, s.c.bucket >= start, s.c.bucket < end)
        .group_by(s.c.bucket, sr.c.fleet_id, s.c.stack_id)
    )
    sums: dict[tuple[int, int], dict[int, int]] = {}
    result = conn.execute(stmt).cursor
    while rows := result.fetchmany(50_000):
        for bucket, fleet, stack, count in rows:
            key = (bucket, fleet)
            counts = sums.get(key)
            if counts is None:
                counts = sums[key] = {}
            counts[stack] = int(count)
    return sums


def _sums_of_fleet(
    conn: sa.Connection, finer: int, width: int, start: int, end: int
) -> dict[tuple[int, int], dict[int, int]]:
    """Sums the rows of the finer fleet tier in [start, end) by (bucket, fleet series)."""
    f = schema.fleet_samples
    stmt = sa.select(f.c.bucket, f.c.fleet_id, f.c.stack_ids, f.c.counts).where(
        f.c.width == finer, f.c.bucket >= start, f.c.bucket < end
    )
    sums: dict[tuple[int, int], dict[int, int]] = {}
    for bucket, fleet, packed_ids, packed_counts in conn.execute(stmt):
        counts = sums.setdefault((align_down(bucket, width), fleet), {})
        sum_rows(counts, [(packed_ids, packed_counts)])
    return sums


# Late rows and expiry ---------------------------------------------------------------------


def add_late(
    conn: sa.Connection,
    states: list[TierState],
    samples: Iterable[tuple[tuple[int, int, int], int]],
    fleet_of: Mapping[int, int],
) -> None:
    """Adds (bucket, series, stack) counts to the fleet rows of every tier that has folded
    their bucket already, reading each row, adding, and writing it back."""
    changes: dict[tuple[int, int, int], dict[int, int]] = {}
    for (bucket, series, stack), count in samples:
        for state in states:
            if bucket < state.rolled_to:
                key = (state.width, align_down(bucket, state.width), fleet_of[series])
                counts = changes.setdefault(key, {})
                counts[stack] = counts.get(stack, 0) + count
    f = schema.fleet_samples
    for (width, bucket, fleet), added in sorted(changes.items()):
        where = (f.c.width == width, f.c.bucket == bucket, f.c.fleet_id == fleet)
        stored = conn.execute(
            sa.select(f.c.stack_ids, f.c.counts).where(*where).with_for_update()
        ).first()
        counts: dict[int, int] = {}
        if stored is not None:
            sum_rows(counts, [stored])
        for stack, count in added.items():
            counts[stack] = counts.get(stack, 0) + count
        packed_ids, packed_counts, total = encode(counts)
        values = {"total": total, "stack_ids": packed_ids, "counts": packed_counts}
        if stored is None:
            conn.execute(sa.insert(f).values(width=width, bucket=bucket, fleet_id=fleet, **values))
        else:
            conn.execute(sa.update(f).where(*where).values(**values))


def expire(store: Store, now: int) -> None:
    """Removes the rows of each fleet tier kept for a while that are older than that, once
    the next fleet tier has folded them."""
    coarsest = store.tiers[-1].width
    for tier, coarser in pairwise(store.fleet_tiers):
        if tier.keep is None:
            continue
        with store.engine.write_transaction() as conn:
            states = {s.width: s for s in fleet_states(store, conn, lock="update")}
            cutoff = align_down(min(now - tier.keep, states[coarser.width].rolled_to), coarsest)
            remove_before(conn, states[tier.width], cutoff)


def remove_before(conn: sa.Connection, state: TierState, cutoff: int) -> None:
    """Removes a fleet tier's rows of buckets before ``cutoff`` and moves its kept_from."""
    if cutoff <= state.kept_from:
        return
    f, ft = schema.fleet_samples, schema.fleet_tiers
    conn.execute(sa.delete(f).where(f.c.width == state.width, f.c.bucket < cutoff))
    values = {"kept_from": cutoff}
    if state.rolled_to < cutoff:  # nothing folded there: nothing to keep either
        values["rolled_to"] = cutoff
    conn.execute(sa.update(ft).where(ft.c.width == state.width).values(**values))
