"""What a query reads: the series a filter selects, and the rows of each segment of a window.

collector/query.py cuts a window into segments (tiers.plan) and asks this module for each
one: instance segments are grouped in SQL; fleet segments are summed from their packed rows
(fleet.py). Series are read per sampling interval, so that counts of series sampled at
different rates are made comparable before they are added up (see merge_intervals).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from collector.store import fleet, schema
from collector.store.engines.base import Engine
from collector.store.errors import InvalidQuery
from collector.store.ids import INSTANCE_LABELS
from collector.store.rows import MODES
from collector.store.tiers import Segment
from sampler.profile import DEFAULT_INTERVAL, align_down, buckets_in, rescale

__all__ = [
    "Filters",
    "SeriesGroup",
    "buckets_of_series",
    "check_filters",
    "check_window",
    "merge_intervals",
    "read_counts",
    "read_points",
    "read_recent",
    "series_groups",
]


@dataclass(frozen=True)
class Filters:
    """Which samples a query reads: values of one key are OR-ed, different keys AND-ed."""

    mode: str = "cpu"
    services: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    instances: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    def label_groups(self) -> dict[str, list[str]]:
        """Returns the label filter as key -> accepted values."""
        groups: dict[str, list[str]] = {}
        for key, value in self.labels:
            groups.setdefault(key, []).append(value)
        return groups

    @property
    def fleet_wide(self) -> bool:
        """Whether the fleet tiers can answer: they have no host, no instance, and none of
        the labels that name an instance (ids.INSTANCE_LABELS)."""
        return not (
            self.hosts or self.instances or any(k in INSTANCE_LABELS for k, _ in self.labels)
        )


def check_window(start: object, end: object) -> tuple[int, int]:
    """Returns a valid window's ends; raises InvalidQuery."""
    for name, value in (("start", start), ("end", end)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidQuery(f"{name} must be integer epoch seconds, got {value!r:.40}")
    assert isinstance(start, int) and isinstance(end, int)
    if end < start:
        raise InvalidQuery(f"window end {end} is before its start {start}")
    return start, end


def check_filters(filters: Filters) -> Filters:
    """Returns valid filters; raises InvalidQuery."""
    if not isinstance(filters, Filters):
        raise InvalidQuery(f"expected Filters, got {type(filters).__name__}")
    if filters.mode not in MODES:
        raise InvalidQuery(f"mode {filters.mode!r:.20} is not one of {MODES}")
    return filters


@dataclass(frozen=True)
class SeriesGroup:
    """The series (and fleet series) a filter selects that share one sampling interval."""

    interval: float
    series: sa.Select  # ids of series
    fleets: sa.Select  # ids of fleet series


def _where(table: sa.Table, filters: Filters, interval: float | None) -> list:
    lp = schema.label_pairs
    where = [table.c.mode == filters.mode]
    columns = {"service": filters.services}
    if table is schema.series:
        columns.update(host=filters.hosts, instance=filters.instances)
    for column, values in columns.items():
        if values:
            where.append(table.c[column].in_(list(values)))
    for key, values in filters.label_groups().items():
        matching = sa.select(lp.c.label_set_id).where(lp.c.key == key, lp.c.value.in_(values))
        where.append(table.c.label_set_id.in_(matching))
    if interval is not None:
        where.append(table.c.interval == interval)
    return where


def series_groups(conn: sa.Connection, filters: Filters) -> list[SeriesGroup]:
    """Returns the selected series, one group per sampling interval among them (none when no
    series matches)."""
    sr, fs = schema.series, schema.fleet_series
    intervals = sorted(
        conn.execute(sa.select(sr.c.interval).where(*_where(sr, filters, None)).distinct())
        .scalars()
        .all()
    )
    # With one interval, the queries need no condition on it.
    single = len(intervals) == 1
    return [
        SeriesGroup(
            interval,
            sa.select(sr.c.id).where(*_where(sr, filters, None if single else interval)),
            sa.select(fs.c.id).where(*_where(fs, filters, None if single else interval)),
        )
        for interval in intervals
    ]


def _instance_where(seg: Segment) -> list:
    s = schema.samples
    return [s.c.width == seg.width, s.c.bucket >= seg.start, s.c.bucket < seg.end]


def read_counts(
    engine: Engine, conn: sa.Connection, segments: Sequence[Segment], group: SeriesGroup
) -> dict[int, int]:
    """Returns the counts by stack id of a group's samples in the segments."""
    totals: dict[int, int] = {}
    f = schema.fleet_samples
    alone = _single_series_span(conn, group.series)
    for seg in segments:
        if seg.fleet:
            stmt = sa.select(f.c.stack_ids, f.c.counts).where(
                f.c.width == seg.width,
                f.c.bucket >= seg.start,
                f.c.bucket < seg.end,
                f.c.fleet_id.in_(group.fleets),
            )
            fleet.sum_rows(totals, conn.execute(stmt).cursor.fetchall())
            continue
        where = [*_instance_where(seg), schema.samples.c.series_id.in_(group.series)]
        # One bucket of one series holds each stack once: nothing to merge.
        merge = alone is None or buckets_of_series(seg, *alone) > 1
        ids, counts = engine.stack_counts(conn, where, merge=merge)
        _add_counts(totals, ids, counts)
    return totals


def read_points(
    conn: sa.Connection, segments: Sequence[Segment], group: SeriesGroup, step: int | None
) -> dict[int, int]:
    """Returns a group's samples per bucket (per ``step`` seconds when given)."""
    s, f = schema.samples, schema.fleet_samples
    points: dict[int, int] = {}
    for seg in segments:
        if seg.fleet:
            stmt = sa.select(f.c.bucket, sa.func.sum(f.c.total)).where(
                f.c.width == seg.width,
                f.c.bucket >= seg.start,
                f.c.bucket < seg.end,
                f.c.fleet_id.in_(group.fleets),
            )
            stmt = stmt.group_by(f.c.bucket)
        else:
            stmt = (
                sa.select(s.c.bucket, sa.func.sum(s.c["count"]))
                .where(*_instance_where(seg), s.c.series_id.in_(group.series))
                .group_by(s.c.bucket)
            )
        for bucket, count in conn.execute(stmt):
            key = bucket if step is None else align_down(bucket, step)
            points[key] = points.get(key, 0) + int(count)
    return points


def read_recent(conn: sa.Connection, segments: Sequence[Segment]) -> dict[int, int]:
    """Returns the last bucket each stack has samples in, over every series."""
    s, f = schema.samples, schema.fleet_samples
    last: dict[int, int] = {}
    for seg in segments:
        if seg.fleet:
            stmt = sa.select(f.c.bucket, f.c.stack_ids).where(
                f.c.width == seg.width, f.c.bucket >= seg.start, f.c.bucket < seg.end
            )
            for bucket, packed_ids in conn.execute(stmt.order_by(f.c.bucket)):
                last.update(dict.fromkeys(fleet.decode_ids(bytes(packed_ids)), bucket))
            continue
        stmt = (
            sa.select(s.c.stack_id, sa.func.max(s.c.bucket))
            .where(*_instance_where(seg))
            .group_by(s.c.stack_id)
        )
        for sid, bucket in conn.execute(stmt):
            if bucket > last.get(sid, bucket - 1):
                last[sid] = bucket
    return last


def merge_intervals(by_interval: dict[float, dict[int, int]]) -> tuple[dict[int, int], float]:
    """Adds up counts of several sampling intervals, counted at the finest of them: the
    samples of a coarser interval stand for more time, so each is worth interval / finest
    samples of the finest (rounded per stack). Returns the counts and their interval."""
    if not by_interval:
        return {}, DEFAULT_INTERVAL
    finest = min(by_interval)
    if len(by_interval) == 1:
        return by_interval[finest], finest
    totals: dict[int, int] = {}
    for interval, counts in by_interval.items():
        for sid, count in rescale(counts, interval / finest).items():  # type: ignore[arg-type]
            totals[sid] = totals.get(sid, 0) + count  # type: ignore[call-overload]
    return totals, finest


def buckets_of_series(seg: Segment, first: int, last: int) -> int:
    """Returns how many of the segment's buckets may hold rows of a series whose finest
    buckets run from ``first`` to ``last``."""
    return buckets_in(
        max(seg.start, align_down(first, seg.width)), min(seg.end, last + 1), seg.width
    )


def _single_series_span(conn: sa.Connection, series: sa.Select) -> tuple[int, int] | None:
    """Returns the first and last bucket of the only series matching, if one does."""
    sr = schema.series
    span = series.with_only_columns(sr.c.first_bucket, sr.c.last_bucket).limit(2)
    rows = conn.execute(span).all()
    return (rows[0][0], rows[0][1]) if len(rows) == 1 else None


def _add_counts(totals: dict[int, int], ids: list[int], counts: list[int]) -> None:
    """Adds counts to ``totals`` by stack id."""
    if not totals:
        totals.update(zip(ids, counts, strict=True))
        if len(totals) == len(ids):
            return
        totals.clear()  # an id came twice: add them up below
    get = totals.get
    for stack_id, count in zip(ids, counts, strict=True):
        totals[stack_id] = get(stack_id, 0) + count
