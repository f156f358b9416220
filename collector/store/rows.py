"""What the poller hands to the store, how it is validated, and the ids derived from it.

Pure module: no I/O. The ids of stacks, label sets and series are hashes (ids.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from collector.store.errors import InvalidRow
from collector.store.ids import (
    fleet_id,
    fleet_labels,
    label_set_id,
    labels_text,
    series_id,
    stack_id,
)
from sampler.profile import DEFAULT_INTERVAL, LIMITS, MODES, stack_problem

__all__ = [
    "MODES",
    "Batch",
    "Cursor",
    "CursorUpdate",
    "IdCache",
    "Limits",
    "SampleRow",
    "SeriesKey",
    "fleet_id",
    "label_set_id",
    "labels_text",
    "prepare_batch",
    "series_id",
    "stack_id",
]

# The longest sampling interval accepted, in seconds (as the collector accepts documents).
MAX_INTERVAL = 60.0


@dataclass(frozen=True)
class SampleRow:
    """Samples of one stack, from one instance and label set, in one time bucket; each
    sample stands for ``interval`` seconds (the sampler's ``interval``)."""

    bucket: int
    mode: str
    service: str
    host: str
    instance: str
    labels: Mapping[str, str]
    stack: str
    count: int
    interval: float = DEFAULT_INTERVAL


@dataclass(frozen=True)
class CursorUpdate:
    """The cumulative counts the collector last saw from one target (changed keys only)."""

    target: str
    instance: str
    replaced: bool
    counts: Mapping[tuple[int, str], int]
    label_sets: Mapping[int, Mapping[str, str]] = field(default_factory=dict)


@dataclass
class Cursor:
    """The stored cumulative counts of one target, as loaded after a restart."""

    instance: str
    counts: dict[tuple[int, str], int] = field(default_factory=dict)
    label_sets: dict[int, dict[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Limits:
    """Bounds on what the store accepts; anything outside raises InvalidRow. Names, labels
    and stacks are bounded as the wire format bounds them (sampler.profile.LIMITS)."""

    max_count: int = LIMITS.max_delta  # samples of one stack in one bucket
    max_cumulative: int = LIMITS.max_count  # a cursor's cumulative count
    max_name: int = LIMITS.max_name  # service, host, instance, target, label key
    max_label_value: int = LIMITS.max_text
    max_labels: int = LIMITS.max_labels
    max_stack: int = LIMITS.max_stack  # characters in one folded stack
    max_bucket: int = 2**40


# PostgreSQL text cannot hold NUL, and neither text nor UTF-8 can hold a lone surrogate.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


def _check_name(value: object, what: str, limit: int, index: int | None) -> str:
    if not isinstance(value, str):
        raise InvalidRow(f"{what} must be a string, got {type(value).__name__}", index=index)
    if len(value) > limit:
        raise InvalidRow(f"{what} is {len(value)} characters, the limit is {limit}", index=index)
    if _UNSTORABLE.search(value):
        raise InvalidRow(f"{what} {value[:40]!r} holds NUL or a lone surrogate", index=index)
    return value


def _check_int(value: object, what: str, low: int, high: int, index: int | None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRow(f"{what} must be an integer, got {type(value).__name__}", index=index)
    if not low <= value <= high:
        raise InvalidRow(f"{what} {value} is outside [{low}, {high}]", index=index)
    return value


def _check_labels(labels: object, limits: Limits, index: int | None) -> str:
    if not isinstance(labels, Mapping):
        raise InvalidRow(f"labels must be a mapping, got {type(labels).__name__}", index=index)
    if len(labels) > limits.max_labels:
        raise InvalidRow(f"{len(labels)} labels, the limit is {limits.max_labels}", index=index)
    for key, value in labels.items():
        _check_name(key, "label key", limits.max_name, index)
        if not key:
            raise InvalidRow("a label key is empty", index=index)
        _check_name(value, f"label {key[:40]!r}", limits.max_label_value, index)
    return labels_text(labels)


def _check_stack(stack: object, limits: Limits, index: int | None) -> str:
    problem = stack_problem(stack, limits.max_stack)
    if problem is not None:
        raise InvalidRow(problem, index=index)
    return stack  # type: ignore[return-value]


def _check_interval(interval: object, index: int | None) -> float:
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        raise InvalidRow(f"interval must be a number, got {type(interval).__name__}", index=index)
    if not (math.isfinite(interval) and 0 < interval <= MAX_INTERVAL):
        raise InvalidRow(f"interval {interval} is outside (0, {MAX_INTERVAL:g}] s", index=index)
    return float(interval)


class SeriesKey(NamedTuple):
    """Everything a sample is keyed by except time and stack, and its fleet series."""

    mode: str
    service: str
    host: str
    instance: str
    labels_id: int
    interval: float
    fleet_id: int
    fleet_labels_id: int  # the labels its fleet series keeps (ids.fleet_labels)


@dataclass
class Batch:
    """A validated write: what the dialect writer inserts, all keyed by id."""

    stacks: dict[int, str] = field(default_factory=dict)
    label_sets: dict[int, str] = field(default_factory=dict)
    series: dict[int, SeriesKey] = field(default_factory=dict)
    series_buckets: dict[int, tuple[int, int]] = field(default_factory=dict)  # first, last bucket
    samples: dict[tuple[int, int, int], int] = field(
        default_factory=dict
    )  # (bucket, series, stack)
    cursors: list[PreparedCursor] = field(default_factory=list)


@dataclass
class PreparedCursor:
    """A validated cursor update with stack and label set ids resolved."""

    target: str
    instance: str
    replaced: bool
    label_indexes: list[int]  # the changed entries: label set index,
    stack_ids: list[int]  # stack id
    counts: list[int]  # and cumulative count, each entry at one position of the three
    label_sets: list[tuple[int, int]]  # (label set index, label set id)


def _add_label_set(batch: Batch, text: str) -> int:
    labels_id = label_set_id(text)
    batch.label_sets[labels_id] = text
    return labels_id


class IdCache:
    """Remembers stacks and series already validated and hashed, so steady polls skip the work."""

    def __init__(self, limit: int = 1_000_000) -> None:
        self.limit = limit
        self.stacks: dict[str, int] = {}
        self.series: dict[tuple[str, str, str, str, int, float], tuple[int, SeriesKey]] = {}

    def stack(self, stack: object, limits: Limits, index: int | None) -> tuple[str, int]:
        """Returns a valid stack and its id; raises InvalidRow."""
        sid = self.stacks.get(stack) if type(stack) is str else None  # noqa: E721
        if sid is None:
            stack = _check_stack(stack, limits, index)
            sid = stack_id(stack)
            if len(self.stacks) >= self.limit:
                self.stacks.clear()
            self.stacks[stack] = sid
        return stack, sid  # type: ignore[return-value]

    def series_of(
        self, row: SampleRow, labels_id: tuple[int, int], limits: Limits, index: int
    ) -> tuple[int, SeriesKey]:
        """Returns the id and key of a row's series (given its label set's id and its fleet
        label set's), validating its names the first time."""
        labels_id, fleet_labels_id = labels_id
        key = (row.mode, row.service, row.host, row.instance, labels_id, row.interval)
        try:
            found = self.series.get(key)
        except TypeError:  # an unhashable name: let the checks below say what is wrong
            found = None
        if found is None:
            if row.mode not in MODES:
                raise InvalidRow(f"mode {str(row.mode)[:20]!r} is not one of {MODES}", index=index)
            _check_name(row.service, "service", limits.max_name, index)
            _check_name(row.host, "host", limits.max_name, index)
            _check_name(row.instance, "instance", limits.max_name, index)
            interval = _check_interval(row.interval, index)
            found = (
                series_id(row.mode, row.service, row.host, row.instance, labels_id, interval),
                SeriesKey(
                    row.mode,
                    row.service,
                    row.host,
                    row.instance,
                    labels_id,
                    interval,
                    fleet_id(row.mode, row.service, fleet_labels_id, interval),
                    fleet_labels_id,
                ),
            )
            if len(self.series) >= self.limit:
                self.series.clear()
            self.series[key] = found
        return found


def prepare_batch(
    rows: Iterable[SampleRow],
    cursors: Iterable[CursorUpdate],
    *,
    bucket_seconds: int,
    limits: Limits,
    cache: IdCache | None = None,
) -> Batch:
    """Validates rows and cursor updates and groups them by id; raises InvalidRow on the first bad one."""
    cache = cache or IdCache()
    batch = Batch()
    _prepare_rows(batch, rows, bucket_seconds, limits, cache)
    for index, update in enumerate(cursors):
        batch.cursors.append(_prepare_cursor(batch, update, limits, index, cache))
    return batch


def _prepare_rows(
    batch: Batch, rows: Iterable[SampleRow], bucket_seconds: int, limits: Limits, cache: IdCache
) -> None:
    """Adds rows to the batch. Written for speed: this runs for every row of every poll, and
    a poll's rows come grouped by series, so a row of the series before skips its lookups."""
    max_count, max_bucket = limits.max_count, limits.max_bucket
    samples, stacks, known = batch.samples, batch.stacks, cache.stacks
    label_cache: dict[int, tuple[object, tuple[int, int]]] = {}
    last: tuple[object, ...] = ()
    sid = first = final = 0
    for index, row in enumerate(rows):
        if type(row) is not SampleRow:
            raise InvalidRow(f"expected a SampleRow, got {type(row).__name__}", index=index)
        bucket, count = row.bucket, row.count
        if type(bucket) is not int or not 0 <= bucket <= max_bucket or bucket % bucket_seconds:
            _check_bucket(bucket, bucket_seconds, max_bucket, index)
        if type(count) is not int or not 0 < count <= max_count:
            _check_int(count, "count", 1, max_count, index)
        context = (row.labels, row.mode, row.service, row.host, row.instance, row.interval)
        if context != last or not first <= bucket <= final:
            if sid:
                batch.series_buckets[sid] = (first, final)
            sid = _series(batch, cache, row, label_cache, limits, index)
            first, final = batch.series_buckets.get(sid, (bucket, bucket))
            first, final, last = min(first, bucket), max(final, bucket), context
        stack = row.stack
        kid = known.get(stack) if type(stack) is str else None  # noqa: E721
        if kid is None:
            stack, kid = cache.stack(stack, limits, index)
        stacks[kid] = stack
        key = (bucket, sid, kid)
        total = samples.get(key)
        if total is None:
            samples[key] = count
        elif total + count > max_count:
            raise InvalidRow(
                f"count {total + count} for one stack and bucket is absurd", index=index
            )
        else:
            samples[key] = total + count
    if sid:
        batch.series_buckets[sid] = (first, final)


def _series(
    batch: Batch,
    cache: IdCache,
    row: SampleRow,
    label_cache: dict[int, tuple[object, tuple[int, int]]],
    limits: Limits,
    index: int,
) -> int:
    # Rows of one poll share a label mapping object: validate and hash it once.
    cached = label_cache.get(id(row.labels))
    if cached is None or cached[0] is not row.labels:
        text = _check_labels(row.labels, limits, index)
        labels_id = _add_label_set(batch, text)
        kept = fleet_labels(row.labels)  # type: ignore[arg-type]
        fleet_labels_id = (
            labels_id if kept is row.labels else _add_label_set(batch, labels_text(kept))
        )
        ids = (labels_id, fleet_labels_id)
        label_cache[id(row.labels)] = (row.labels, ids)
    else:
        ids = cached[1]
    sid, key = cache.series_of(row, ids, limits, index)
    batch.series[sid] = key
    return sid


def _check_bucket(bucket: object, width: int, max_bucket: int, index: int) -> None:
    _check_int(bucket, "bucket", 0, max_bucket, index)
    if bucket % width:  # type: ignore[operator]
        raise InvalidRow(f"bucket {bucket} is not a multiple of {width}", index=index)


def _prepare_cursor(
    batch: Batch, update: CursorUpdate, limits: Limits, index: int, cache: IdCache
) -> PreparedCursor:
    if not isinstance(update, CursorUpdate):
        raise InvalidRow(f"expected a CursorUpdate, got {type(update).__name__}", index=index)
    target = _check_name(update.target, "cursor target", limits.max_name, index)
    instance = _check_name(update.instance, "cursor instance", limits.max_name, index)
    if not isinstance(update.replaced, bool):
        raise InvalidRow("cursor replaced must be a bool", index=index)
    indexes: list[int] = []
    ids: list[int] = []
    counts: list[int] = []
    known, stacks, max_count = cache.stacks, batch.stacks, limits.max_cumulative
    for key, count in update.counts.items():
        if not isinstance(key, tuple) or len(key) != 2:
            raise InvalidRow(f"cursor key {key!r:.60} is not (label set, stack)", index=index)
        label_index, stack = key
        if type(label_index) is not int or not 0 <= label_index < 2**31:
            _check_int(label_index, "cursor label set index", 0, 2**31 - 1, index)
        if type(count) is not int or not 0 <= count <= max_count:
            _check_int(count, "cursor count", 0, max_count, index)
        kid = known.get(stack) if type(stack) is str else None  # noqa: E721
        if kid is None:
            stack, kid = cache.stack(stack, limits, index)
        stacks[kid] = stack
        indexes.append(label_index)
        ids.append(kid)
        counts.append(count)
    label_sets = []
    for label_index, labels in update.label_sets.items():
        label_index = _check_int(label_index, "cursor label set index", 0, 2**31 - 1, index)
        text = _check_labels(labels, limits, index)
        label_sets.append((label_index, _add_label_set(batch, text)))
    return PreparedCursor(target, instance, update.replaced, indexes, ids, counts, label_sets)
