"""What the poller hands to the store, how it is validated, and the ids derived from it.

Pure module: no I/O. Every id is a signed 64-bit BLAKE2b hash of a canonical text, so the
writer knows the id of a stack, label set or series without asking the database, and two
collectors sharing one database agree on every id.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from collector.store.errors import InvalidRow

__all__ = [
    "MODES",
    "Batch",
    "Cursor",
    "CursorUpdate",
    "IdCache",
    "Limits",
    "SampleRow",
    "label_set_id",
    "labels_text",
    "prepare_batch",
    "series_id",
    "stack_id",
]

MODES = ("cpu", "wall")


@dataclass(frozen=True)
class SampleRow:
    """Samples of one stack, from one instance and label set, in one time bucket."""

    bucket: int
    mode: str
    service: str
    host: str
    instance: str
    labels: Mapping[str, str]
    stack: str
    count: int


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
    """Bounds on what the store accepts; anything outside raises InvalidRow."""

    max_count: int = 10**9  # samples of one stack in one bucket; more is a broken or hostile target
    max_cumulative: int = 2**62  # a cursor's cumulative count; leaves BIGINT headroom for sums
    max_name: int = 256  # service, host, instance, target, label key
    max_label_value: int = 1024
    max_labels: int = 64
    max_stack: int = 65536  # characters in one folded stack
    max_bucket: int = 2**40


# PostgreSQL text cannot hold NUL, and neither text nor UTF-8 can hold a lone surrogate.
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")
# Folded stacks are escaped by the sampler (docs/wire-format.md): no control characters.
_STACK_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def _hash64(text: str) -> int:
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def stack_id(stack: str) -> int:
    """Returns the id of a folded stack: a signed 64-bit hash of its text."""
    return _hash64(stack)


def labels_text(labels: Mapping[str, str]) -> str:
    """Returns the canonical JSON text of a label set (sorted keys, no spaces)."""
    return json.dumps(dict(sorted(labels.items())), ensure_ascii=False, separators=(",", ":"))


def label_set_id(text: str) -> int:
    """Returns the id of a label set from its canonical text."""
    return _hash64("labels\x00" + text)


def series_id(mode: str, service: str, host: str, instance: str, labels_id: int) -> int:
    """Returns the id of a series; NUL cannot occur in the parts, so it separates them."""
    return _hash64("\x00".join(("series", mode, service, host, instance, str(labels_id))))


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
    if not isinstance(stack, str):
        raise InvalidRow(f"stack must be a string, got {type(stack).__name__}", index=index)
    if not stack:
        raise InvalidRow("stack is empty", index=index)
    if len(stack) > limits.max_stack:
        raise InvalidRow(f"stack is {len(stack)} characters, limit {limits.max_stack}", index=index)
    if _STACK_FORBIDDEN.search(stack):
        raise InvalidRow(f"stack {stack[:40]!r} holds a control character", index=index)
    if stack.startswith(";") or stack.endswith(";") or ";;" in stack:
        raise InvalidRow(f"stack {stack[:40]!r} has an empty frame", index=index)
    return stack


@dataclass
class Batch:
    """A validated write: what the dialect writer inserts, all keyed by id."""

    stacks: dict[int, str] = field(default_factory=dict)
    label_sets: dict[int, str] = field(default_factory=dict)
    # series id -> (mode, service, host, instance, label set id)
    series: dict[int, tuple[str, str, str, str, int]] = field(default_factory=dict)
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
    entries: list[tuple[int, int, int]]  # (label set index, stack id, count)
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
        self.series: dict[tuple[str, str, str, str, int], int] = {}

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

    def series_of(self, row: SampleRow, labels_id: int, limits: Limits, index: int) -> int:
        """Returns the id of a row's series, validating its names the first time."""
        key = (row.mode, row.service, row.host, row.instance, labels_id)
        try:
            sid = self.series.get(key)
        except TypeError:  # an unhashable name: let the checks below say what is wrong
            sid = None
        if sid is None:
            if row.mode not in MODES:
                raise InvalidRow(f"mode {str(row.mode)[:20]!r} is not one of {MODES}", index=index)
            _check_name(row.service, "service", limits.max_name, index)
            _check_name(row.host, "host", limits.max_name, index)
            _check_name(row.instance, "instance", limits.max_name, index)
            sid = series_id(row.mode, row.service, row.host, row.instance, labels_id)
            if len(self.series) >= self.limit:
                self.series.clear()
            self.series[key] = sid
        return sid


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
    label_cache: dict[int, tuple[object, int]] = {}
    max_count, max_bucket = limits.max_count, limits.max_bucket
    samples = batch.samples
    for index, row in enumerate(rows):
        if type(row) is not SampleRow:
            raise InvalidRow(f"expected a SampleRow, got {type(row).__name__}", index=index)
        bucket, count = row.bucket, row.count
        if type(bucket) is not int or not 0 <= bucket <= max_bucket:
            _check_int(bucket, "bucket", 0, max_bucket, index)
        if bucket % bucket_seconds:
            raise InvalidRow(f"bucket {bucket} is not a multiple of {bucket_seconds}", index=index)
        if type(count) is not int or not 0 < count <= max_count:
            _check_int(count, "count", 1, max_count, index)
        # Rows of one poll share a label mapping object: validate and hash it once.
        cached = label_cache.get(id(row.labels))
        if cached is None or cached[0] is not row.labels:
            text = _check_labels(row.labels, limits, index)
            labels_id = _add_label_set(batch, text)
            label_cache[id(row.labels)] = (row.labels, labels_id)
        else:
            labels_id = cached[1]
        sid = cache.series_of(row, labels_id, limits, index)
        span = batch.series_buckets.get(sid)
        if span is None:
            batch.series[sid] = (row.mode, row.service, row.host, row.instance, labels_id)
            batch.series_buckets[sid] = (bucket, bucket)
        elif not span[0] <= bucket <= span[1]:
            batch.series_buckets[sid] = (min(span[0], bucket), max(span[1], bucket))
        stack, kid = cache.stack(row.stack, limits, index)
        batch.stacks[kid] = stack
        key = (bucket, sid, kid)
        total = samples.get(key, 0) + count
        if total > max_count:
            raise InvalidRow(f"count {total} for one stack and bucket is absurd", index=index)
        samples[key] = total
    for index, update in enumerate(cursors):
        batch.cursors.append(_prepare_cursor(batch, update, limits, index, cache))
    return batch


def _prepare_cursor(
    batch: Batch, update: CursorUpdate, limits: Limits, index: int, cache: IdCache
) -> PreparedCursor:
    if not isinstance(update, CursorUpdate):
        raise InvalidRow(f"expected a CursorUpdate, got {type(update).__name__}", index=index)
    target = _check_name(update.target, "cursor target", limits.max_name, index)
    instance = _check_name(update.instance, "cursor instance", limits.max_name, index)
    if not isinstance(update.replaced, bool):
        raise InvalidRow("cursor replaced must be a bool", index=index)
    entries = []
    for key, count in update.counts.items():
        if not isinstance(key, tuple) or len(key) != 2:
            raise InvalidRow(f"cursor key {key!r:.60} is not (label set, stack)", index=index)
        label_index = key[0]
        if type(label_index) is not int or not 0 <= label_index < 2**31:
            _check_int(label_index, "cursor label set index", 0, 2**31 - 1, index)
        if type(count) is not int or not 0 <= count <= limits.max_cumulative:
            _check_int(count, "cursor count", 0, limits.max_cumulative, index)
        stack, kid = cache.stack(key[1], limits, index)
        batch.stacks[kid] = stack
        entries.append((label_index, kid, count))
    label_sets = []
    for label_index, labels in update.label_sets.items():
        label_index = _check_int(label_index, "cursor label set index", 0, 2**31 - 1, index)
        text = _check_labels(labels, limits, index)
        label_sets.append((label_index, _add_label_set(batch, text)))
    return PreparedCursor(target, instance, update.replaced, entries, label_sets)
