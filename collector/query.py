"""Reads for the web UI: merged profiles, timelines, top functions and filter values of a window.

Windows are half-open [start, end) in epoch seconds. Each window is cut into segments read
from the coarsest stored resolution covering them exactly (collector.store.tiers.plan); a
stored row counts in a window when its bucket start lies in it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import sqlalchemy as sa

from collector.functions import FunctionStat, function_stats
from collector.store import schema
from collector.store.engines.base import translate_errors
from collector.store.errors import InvalidQuery
from collector.store.rows import MODES
from collector.store.store import Store
from collector.store.tiers import Segment, plan
from sampler.profile import Node, build_tree

__all__ = ["Filters", "FunctionStat", "Query"]

_STACK_CACHE_LIMIT = 1_000_000


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


def _check_window(start: object, end: object) -> tuple[int, int]:
    for name, value in (("start", start), ("end", end)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidQuery(f"{name} must be integer epoch seconds, got {value!r:.40}")
    assert isinstance(start, int) and isinstance(end, int)
    if end < start:
        raise InvalidQuery(f"window end {end} is before its start {start}")
    return start, end


def _check_filters(filters: Filters) -> Filters:
    if not isinstance(filters, Filters):
        raise InvalidQuery(f"expected Filters, got {type(filters).__name__}")
    if filters.mode not in MODES:
        raise InvalidQuery(f"mode {filters.mode!r:.20} is not one of {MODES}")
    return filters


class Query:
    """Answers questions about stored samples; never writes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._stacks: dict[int, str] = {}  # stack ids are hashes of their text: never stale

    def plan(self, start: int, end: int, *, max_width: int | None = None) -> list[Segment]:
        """Returns the segments a window is read from (see collector.store.tiers.plan)."""
        start, end = _check_window(start, end)
        with translate_errors("planning a query"), self.store.engine.read_transaction() as conn:
            return plan(start, end, self.store.tier_states(conn), max_width=max_width)

    def resolution(self, start: int, end: int) -> int:
        """Returns the coarsest bucket width at which this window's samples are still kept.

        That is the finest detail a timeline of the window can show: 60 s for recent windows,
        3600 s for an hour-aligned window older than the 10-minute tier's 7 days. A merged
        profile may read pre-aggregated coarser rows for buckets fully inside the window,
        which gives the same counts faster.
        """
        segments = self.plan(start, end, max_width=self.store.tiers[0].width)
        return max((s.width for s in segments), default=self.store.tiers[0].width)

    def profile(self, start: int, end: int, filters: Filters = Filters()) -> dict[str, int]:
        """Returns the merged folded counts of the samples matching `filters` in [start, end)."""
        totals = self.profile_ids(start, end, filters)
        names = self.stack_names(totals)
        return {names[sid]: count for sid, count in totals.items()}

    def profile_ids(self, start: int, end: int, filters: Filters = Filters()) -> dict[int, int]:
        """Returns the merged counts by stack id (see stack_names) of the samples matching
        `filters` in [start, end); stacks whose samples sum to zero or less are left out."""
        start, end = _check_window(start, end)
        filters = _check_filters(filters)
        totals: dict[int, int] = {}
        with translate_errors("reading a profile"), self.store.engine.read_transaction() as conn:
            segments = plan(start, end, self.store.tier_states(conn))
            series = self._series_ids(filters)
            alone = self._single_series_span(conn, series)
            for seg in segments:
                where = [*self._segment_where(seg), schema.samples.c.series_id.in_(series)]
                # One bucket of one series holds each stack once: nothing to merge.
                merge = alone is None or _buckets_in(seg, *alone) > 1
                ids, counts = self.store.engine.stack_counts(conn, where, merge=merge)
                _add_counts(totals, ids, counts)
        if totals and min(totals.values()) <= 0:
            totals = {sid: count for sid, count in totals.items() if count > 0}
        return totals

    def stack_names(self, ids: Iterable[int]) -> dict[int, str]:
        """Returns the folded text of stacks by id (remembered, up to a million stacks; the
        web UI reads large windows with stack_lines and keeps its own)."""
        with translate_errors("reading stack names"), self.store.engine.read_transaction() as conn:
            return self._stack_names(conn, ids)

    def stack_lines(self, ids: Iterable[int]) -> tuple[list[int], str]:
        """Returns the folded text of stacks one per line, and their ids in the same order
        (see Engine.stack_lines); ids not stored are left out, and each comes once."""
        with translate_errors("reading stack text"), self.store.engine.read_transaction() as conn:
            return self.store.engine.stack_lines(conn, list(dict.fromkeys(ids)))

    def recent_stacks(self, start: int, end: int) -> list[int]:
        """Returns the ids of every stack with samples in [start, end), whatever its series,
        the most recently sampled first."""
        start, end = _check_window(start, end)
        s = schema.samples
        last: dict[int, int] = {}
        with (
            translate_errors("reading recent stacks"),
            self.store.engine.read_transaction() as conn,
        ):
            for seg in plan(start, end, self.store.tier_states(conn)):
                stmt = (
                    sa.select(s.c.stack_id, sa.func.max(s.c.bucket))
                    .where(*self._segment_where(seg))
                    .group_by(s.c.stack_id)
                )
                for sid, bucket in conn.execute(stmt):
                    if bucket > last.get(sid, bucket - 1):
                        last[sid] = bucket
        return sorted(last, key=last.__getitem__, reverse=True)

    def tree(self, start: int, end: int, filters: Filters = Filters()) -> Node:
        """Returns the call tree of the merged profile (sampler.profile.Node; to_dict() for d3)."""
        return build_tree(self.profile(start, end, filters))

    def timeline(
        self, start: int, end: int, filters: Filters = Filters(), step: int | None = None
    ) -> list[tuple[int, int]]:
        """Returns (bucket start, samples) of non-empty buckets, finest stored or per `step` seconds."""
        start, end = _check_window(start, end)
        filters = _check_filters(filters)
        if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step <= 0):
            raise InvalidQuery(f"step must be a positive number of seconds, got {step!r:.20}")
        max_width = step if step is not None else self.store.tiers[0].width
        points: dict[int, int] = {}
        with translate_errors("reading a timeline"), self.store.engine.read_transaction() as conn:
            segments = plan(start, end, self.store.tier_states(conn), max_width=max_width)
            series = self._series_ids(filters)
            for seg in segments:
                s = schema.samples
                stmt = (
                    sa.select(s.c.bucket, sa.func.sum(s.c.count))
                    .where(*self._segment_where(seg), s.c.series_id.in_(series))
                    .group_by(s.c.bucket)
                )
                for bucket, count in conn.execute(stmt):
                    key = bucket if step is None else bucket - bucket % step
                    points[key] = points.get(key, 0) + int(count)
        return sorted(points.items())

    def top_functions(
        self, start: int, end: int, filters: Filters = Filters(), limit: int = 50
    ) -> list[FunctionStat]:
        """Returns the frames with the most self samples in the window, with their total samples."""
        return function_stats(self.profile(start, end, filters), limit)

    def label_values(
        self, start: int, end: int, filters: Filters = Filters()
    ) -> dict[str, list[str]]:
        """Returns the values of service, host, instance and every label key seen in the window.

        The values offered for one key honour the filters on every other key, so a filter
        dropdown keeps listing the alternatives to its own selection.
        """
        start, end = _check_window(start, end)
        filters = _check_filters(filters)
        sr, ls = schema.series, schema.label_sets
        stmt = (
            sa.select(sr.c.service, sr.c.host, sr.c.instance, ls.c.labels)
            .join(ls, ls.c.id == sr.c.label_set_id)
            .where(
                sr.c.mode == filters.mode,
                sr.c.first_bucket < end,
                sr.c.last_bucket + self.store.bucket_seconds > start,
            )
        )
        with translate_errors("reading label values"), self.store.engine.read_transaction() as conn:
            rows = [
                ({"service": svc, "host": host, "instance": inst}, json.loads(labels))
                for svc, host, inst, labels in conn.execute(stmt)
            ]
        return _values_by_key(rows, filters)

    # Helpers ---------------------------------------------------------------------------------

    def _segment_where(self, seg: Segment) -> list[sa.ColumnElement[bool]]:
        s = schema.samples
        return [s.c.width == seg.width, s.c.bucket >= seg.start, s.c.bucket < seg.end]

    def _series_ids(self, filters: Filters) -> sa.Select:
        sr, lp = schema.series, schema.label_pairs
        where = [sr.c.mode == filters.mode]
        for column, values in (
            (sr.c.service, filters.services),
            (sr.c.host, filters.hosts),
            (sr.c.instance, filters.instances),
        ):
            if values:
                where.append(column.in_(list(values)))
        for key, values in filters.label_groups().items():
            matching = sa.select(lp.c.label_set_id).where(lp.c.key == key, lp.c.value.in_(values))
            where.append(sr.c.label_set_id.in_(matching))
        return sa.select(sr.c.id).where(*where)

    def _single_series_span(self, conn: sa.Connection, series: sa.Select) -> tuple[int, int] | None:
        """Returns the first and last bucket of the only series matching, if one does."""
        sr = schema.series
        span = series.with_only_columns(sr.c.first_bucket, sr.c.last_bucket).limit(2)
        rows = conn.execute(span).all()
        return (rows[0][0], rows[0][1]) if len(rows) == 1 else None

    def _stack_names(self, conn: sa.Connection, ids: Iterable[int]) -> dict[int, str]:
        wanted = list(ids)
        known = self._stacks
        if len(known) + len(wanted) > _STACK_CACHE_LIMIT:
            self._stacks = known = {}  # replaced, not cleared: other threads may be reading it
        known.update(self.store.engine.stack_texts(conn, [s for s in wanted if s not in known]))
        # Entries are never removed from `known` (the cache is replaced whole), so this is safe
        # while other threads add to it.
        return {sid: known[sid] if sid in known else f"[unknown stack {sid}]" for sid in wanted}


def _values_by_key(
    rows: list[tuple[dict[str, str], dict[str, str]]], filters: Filters
) -> dict[str, list[str]]:
    """Collects each key's values over the rows that pass the filters on the other keys."""
    wanted: dict[str, set[str]] = {}
    for key, values in (
        ("service", filters.services),
        ("host", filters.hosts),
        ("instance", filters.instances),
    ):
        if values:
            wanted[key] = set(values)
    label_filter = {k: set(v) for k, v in filters.label_groups().items()}

    def passes(columns: dict[str, str], labels: dict[str, str], skip: str) -> bool:
        for key, accepted in wanted.items():
            if key != skip and columns[key] not in accepted:
                return False
        for key, accepted in label_filter.items():
            if key != skip and labels.get(key) not in accepted:
                return False
        return True

    result: dict[str, set[str]] = {"service": set(), "host": set(), "instance": set()}
    for columns, labels in rows:
        for key, value in [*columns.items(), *labels.items()]:
            if passes(columns, labels, key):
                result.setdefault(key, set()).add(value)
    return {key: sorted(values) for key, values in result.items()}


def _buckets_in(seg: Segment, first: int, last: int) -> int:
    """Returns how many of the segment's buckets may hold rows of a series whose finest
    buckets run from ``first`` to ``last``."""
    start = max(seg.start, first - first % seg.width)
    end = min(seg.end, last + 1)
    return max(0, -(-end // seg.width) - -(-start // seg.width))


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
