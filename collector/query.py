"""Reads for the web UI: merged profiles, timelines, top functions and filter values of a window.

Windows are half-open [start, end) in epoch seconds. Each window is cut into segments read
from the coarsest stored resolution covering them exactly (collector.store.tiers.plan); a
stored row counts in a window when its bucket start lies in it. Without a host or instance
filter, the fleet tiers answer (one packed row per service, label set and bucket, see
collector/store/fleet.py), so a month of a large fleet reads a few hundred rows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import sqlalchemy as sa

from collector.functions import FunctionStat, function_stats
from collector.store import schema
from collector.store.engines.base import translate_errors
from collector.store.errors import InvalidQuery
from collector.store.reads import (
    Filters,
    check_filters,
    check_window,
    merge_intervals,
    read_counts,
    read_points,
    read_recent,
    series_groups,
)
from collector.store.store import Store
from collector.store.tiers import Segment, TierState, plan
from sampler.profile import DEFAULT_INTERVAL, Node, Profile, build_tree, rescale

__all__ = ["Filters", "FunctionStat", "Query", "StackCounts", "unknown_stack"]

_STACK_CACHE_LIMIT = 1_000_000
# Stacks read in two halves at once, on two connections, from this many on (where the engine
# reads them outside the interpreter, and with two cores): 200,000 stacks from SQLite ~0.42 s in
# one read, ~0.36 s in two.
_HALVES_FROM = 50_000
EVERYTHING = Filters()  # no filter: every series of a mode (cpu)


def unknown_stack(stack_id: int) -> str:
    """The name shown for a stack id the store has no text for (one frame)."""
    return f"[unknown stack {stack_id}]"


@dataclass(frozen=True)
class StackCounts:
    """The merged samples of a window by stack id, and the seconds one of them stands for.

    ``intervals`` are the sampling intervals of the series read: with several, the counts
    of the coarser ones were scaled to the finest (``interval``), so that every count
    stands for the same time (rounded per stack).
    """

    counts: dict[int, int]
    interval: float
    intervals: tuple[float, ...] = ()


class Query:
    """Answers questions about stored samples; never writes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._stacks: dict[int, str] = {}  # stack ids are hashes of their text: never stale

    def _states(self, conn: sa.Connection, filters: Filters | None = None) -> list[TierState]:
        if filters is None or filters.fleet_wide:
            return self.store.all_tier_states(conn)
        return self.store.tier_states(conn)

    def plan(
        self,
        start: int,
        end: int,
        *,
        max_width: int | None = None,
        filters: Filters | None = None,
    ) -> list[Segment]:
        """Returns the segments a window is read from (see collector.store.tiers.plan)."""
        start, end = check_window(start, end)
        with translate_errors("planning a query"), self.store.engine.read_transaction() as conn:
            return plan(start, end, self._states(conn, filters), max_width=max_width)

    def resolution(self, start: int, end: int) -> int:
        """Returns the coarsest bucket width at which this window's samples are still kept.

        That is the finest detail a timeline of the window can show: 60 s for recent windows,
        3600 s for an hour-aligned window older than the 10-minute tier's 7 days. A merged
        profile may read pre-aggregated coarser rows for buckets fully inside the window,
        which gives the same counts faster.
        """
        segments = self.plan(start, end, max_width=self.store.tiers[0].width, filters=Filters())
        return max((s.width for s in segments), default=self.store.tiers[0].width)

    def profile(self, start: int, end: int, filters: Filters = EVERYTHING) -> dict[str, int]:
        """Returns the merged folded counts of the samples matching `filters` in [start, end)."""
        totals = self.profile_ids(start, end, filters)
        names = self.stack_names(totals)
        return {names[sid]: count for sid, count in totals.items()}

    def read(self, start: int, end: int, filters: Filters = EVERYTHING) -> Profile:
        """Returns the merged profile of [start, end): folded counts with their interval."""
        counts = self.stack_counts(start, end, filters)
        names = self.stack_names(counts.counts)
        return Profile(
            {names[sid]: count for sid, count in counts.counts.items()},
            interval=counts.interval,
            mode=filters.mode,
        )

    def profile_ids(self, start: int, end: int, filters: Filters = EVERYTHING) -> dict[int, int]:
        """Returns the merged counts by stack id (see stack_names) of the samples matching
        `filters` in [start, end); stacks whose samples sum to zero or less are left out."""
        return self.stack_counts(start, end, filters).counts

    def stack_counts(self, start: int, end: int, filters: Filters = EVERYTHING) -> StackCounts:
        """Returns the merged counts by stack id of a window, with their sampling interval."""
        start, end = check_window(start, end)
        filters = check_filters(filters)
        by_interval: dict[float, dict[int, int]] = {}
        with translate_errors("reading a profile"), self.store.engine.read_transaction() as conn:
            segments = plan(start, end, self._states(conn, filters))
            for group in series_groups(conn, filters):
                counts = read_counts(self.store.engine, conn, segments, group)
                if counts and min(counts.values()) <= 0:
                    counts = {sid: count for sid, count in counts.items() if count > 0}
                if counts:  # a group with no samples here must not set the window's interval
                    by_interval[group.interval] = counts
        totals, interval = merge_intervals(by_interval)
        return StackCounts(totals, interval, tuple(sorted(by_interval)))

    def replicate_counts(
        self, start: int, end: int, filters: Filters, step: int
    ) -> dict[tuple[str, int], dict[int, int]]:
        """Returns the counts by stack id of each instance in each ``step`` of [start, end)
        (keyed by instance and the step's start): the replicates of a comparison, one grouped
        query a stored resolution. Read from the instance tiers only (the fleet tiers have no
        instance), the coarsest no wider than ``step`` where it covers; where only a wider one
        does (its finer rows expired), each of its buckets counts in the step it starts in.
        Counts are samples of the finest interval read, as stack_counts counts them: a 20 ms
        instance's samples count twice beside 10 ms ones."""
        start, end = check_window(start, end)
        filters = check_filters(filters)
        s, sr = schema.samples, schema.series
        by_interval: dict[float, dict[tuple[str, int], dict[int, int]]] = {}
        with translate_errors("reading replicates"), self.store.engine.read_transaction() as conn:
            # Rollups no wider than a step where they cover: fewer rows, the same replicates.
            segments = plan(start, end, self.store.tier_states(conn), max_width=step)
            for group in series_groups(conn, filters):
                out = by_interval.setdefault(group.interval, {})
                for seg in segments:
                    index = ((s.c.bucket - start) // step).label("step")
                    stmt = (
                        sa.select(sr.c.instance, index, s.c.stack_id, sa.func.sum(s.c["count"]))
                        .join_from(s, sr, s.c.series_id == sr.c.id)
                        .where(
                            s.c.width == seg.width,
                            s.c.bucket >= seg.start,
                            s.c.bucket < seg.end,
                            s.c.series_id.in_(group.series),
                        )
                        .group_by(sr.c.instance, index, s.c.stack_id)
                    )
                    for instance, k, stack, count in conn.execute(stmt):
                        counts = out.setdefault((instance, start + int(k) * step), {})
                        counts[stack] = counts.get(stack, 0) + int(count)
        read = {interval: out for interval, out in by_interval.items() if out}
        finest = min(read, default=DEFAULT_INTERVAL)
        merged: dict[tuple[str, int], dict[int, int]] = {}
        for interval, out in read.items():
            for key, counts in out.items():
                scaled = rescale(counts, interval / finest)  # type: ignore[arg-type]
                into = merged.setdefault(key, {})
                for sid, count in scaled.items():
                    into[sid] = into.get(sid, 0) + count  # type: ignore[call-overload]
        return merged

    def stack_names(self, ids: Iterable[int]) -> dict[int, str]:
        """Returns the folded text of stacks by id (remembered, up to a million stacks; the
        web UI reads large windows with stack_lines and keeps its own)."""
        with translate_errors("reading stack names"), self.store.engine.read_transaction() as conn:
            return self._stack_names(conn, ids)

    def stack_lines(self, ids: Iterable[int]) -> tuple[list[int], str]:
        """Returns the folded text of stacks one per line, and their ids in the same order
        (see Engine.stack_lines); ids not stored are left out, and each comes once. They are
        asked for in id order, so the store finds them in its primary key's order, reading each
        page once (SQLite: 200,000 stacks in ~0.2 s against ~0.4 s in the order of a window).
        Many are read in two halves at once (see _HALVES_FROM)."""
        # dict.fromkeys keeps their order: a window's ids come in id order mostly, and sorting
        # them is then one pass (a set's order cost ~60 ms for 200,000).
        wanted = sorted(dict.fromkeys(ids))
        halves = self.store.engine.reads_lines_in_halves() and (os.cpu_count() or 1) > 1
        if len(wanted) < _HALVES_FROM or not halves:
            return self._stack_lines(wanted)
        half = len(wanted) // 2
        try:
            pool = ThreadPoolExecutor(1, thread_name_prefix="fleetflame-stack-lines")
            first = pool.submit(self._stack_lines, wanted[:half])
        except RuntimeError:  # the interpreter is shutting down: no new threads
            return self._stack_lines(wanted)
        with pool:
            found, lines = self._stack_lines(wanted[half:])
            first_found, first_lines = first.result()
        if not first_found:
            return found, lines
        if not found:
            return first_found, first_lines
        return first_found + found, f"{first_lines}\n{lines}"

    def _stack_lines(self, ids: list[int]) -> tuple[list[int], str]:
        with translate_errors("reading stack text"), self.store.engine.read_transaction() as conn:
            return self.store.engine.stack_lines(conn, ids)

    def recent_stacks(self, start: int, end: int) -> list[int]:
        """Returns the ids of every stack with samples in [start, end), whatever its series,
        the most recently sampled first."""
        start, end = check_window(start, end)
        with (
            translate_errors("reading recent stacks"),
            self.store.engine.read_transaction() as conn,
        ):
            last = read_recent(conn, plan(start, end, self._states(conn)))
        return sorted(last, key=last.__getitem__, reverse=True)

    def tree(self, start: int, end: int, filters: Filters = EVERYTHING) -> Node:
        """Returns the call tree of the merged profile (sampler.profile.Node; to_dict() for d3)."""
        return build_tree(self.profile(start, end, filters))

    def timeline(
        self, start: int, end: int, filters: Filters = EVERYTHING, step: int | None = None
    ) -> list[tuple[int, int]]:
        """Returns (bucket start, samples) of non-empty buckets, finest stored or per `step`
        seconds; samples of several intervals are counted at the finest (as stack_counts)."""
        return self.timeline_at(start, end, filters, step)[0]

    def timeline_at(
        self,
        start: int,
        end: int,
        filters: Filters = EVERYTHING,
        step: int | None = None,
        interval: float | None = None,
    ) -> tuple[list[tuple[int, int]], float]:
        """Returns the timeline (see timeline) counted in samples of ``interval`` (by default
        the finest of the window's samples), and that interval: the lines of a split counted
        in the unsplit timeline's samples add up to it."""
        start, end = check_window(start, end)
        filters = check_filters(filters)
        if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step <= 0):
            raise InvalidQuery(f"step must be a positive number of seconds, got {step!r:.20}")
        max_width = step if step is not None else self.store.tiers[0].width
        by_interval: dict[float, dict[int, int]] = {}
        with translate_errors("reading a timeline"), self.store.engine.read_transaction() as conn:
            segments = plan(start, end, self._states(conn, filters), max_width=max_width)
            for group in series_groups(conn, filters):
                points = read_points(conn, segments, group, step)
                if points:  # as in stack_counts: only samples of the window set its interval
                    by_interval[group.interval] = points
        unit = interval if interval is not None else min(by_interval, default=DEFAULT_INTERVAL)
        merged: dict[int, int] = {}
        for group_interval, counts in by_interval.items():
            for bucket, count in rescale(counts, group_interval / unit).items():  # type: ignore[arg-type]
                merged[bucket] = merged.get(bucket, 0) + count  # type: ignore[call-overload]
        return sorted(merged.items()), unit

    def top_functions(
        self, start: int, end: int, filters: Filters = EVERYTHING, limit: int = 50
    ) -> list[FunctionStat]:
        """Returns the frames with the most self samples in the window, with their total samples."""
        return function_stats(self.profile(start, end, filters), limit)

    def label_values(
        self, start: int, end: int, filters: Filters = EVERYTHING
    ) -> dict[str, list[str]]:
        """Returns the values of service, host, instance and every label key seen in the window.

        The values offered for one key honour the filters on every other key, so a filter
        dropdown keeps listing the alternatives to its own selection.
        """
        start, end = check_window(start, end)
        filters = check_filters(filters)
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

    # Helpers -------------------------------------------------------------------------------------

    def _stack_names(self, conn: sa.Connection, ids: Iterable[int]) -> dict[int, str]:
        wanted = list(ids)
        known = self._stacks
        if len(known) + len(wanted) > _STACK_CACHE_LIMIT:
            self._stacks = known = {}  # replaced, not cleared: other threads may be reading it
        known.update(self.store.engine.stack_texts(conn, [s for s in wanted if s not in known]))
        # Entries are never removed from `known` (the cache is replaced whole), so this is safe
        # while other threads add to it.
        return {sid: known[sid] if sid in known else unknown_stack(sid) for sid in wanted}


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
