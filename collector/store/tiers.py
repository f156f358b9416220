"""Resolution tiers and the plan that reads a time window from them.

Pure module: no I/O. Samples are stored at several resolutions ("tiers"): the finest has the
collector's bucket width; each coarser tier is materialised from the one before it as soon
as its buckets are complete, and each tier keeps its rows for a while (the finest 1 day, the
10-minute tier 7 days, the hourly tier until retention, by default). Every tier therefore
holds the same samples, at its own width, over the time it covers, and a window is answered
by cutting it into disjoint segments, each read from the coarsest tier covering it exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "DAY",
    "DEFAULT_ROLLUPS",
    "Segment",
    "Tier",
    "TierState",
    "build_tiers",
    "plan",
]

DAY = 86400
# (width, after): samples older than `after` seconds are kept only at `width` or coarser.
DEFAULT_ROLLUPS: tuple[tuple[int, int], ...] = ((600, DAY), (3600, 7 * DAY))
FAR_FUTURE = 2**62


@dataclass(frozen=True)
class Tier:
    """One resolution: its bucket width and how long its rows are kept (None: until retention)."""

    width: int
    keep: int | None


@dataclass(frozen=True)
class TierState:
    """What one tier holds: complete rows for buckets in [kept_from, rolled_to)."""

    width: int
    kept_from: int
    rolled_to: int


@dataclass(frozen=True)
class Segment:
    """Part of a window read from one tier: rows of `width` with bucket start in [start, end)."""

    width: int
    start: int
    end: int


def build_tiers(bucket_seconds: int, rollups: Sequence[tuple[int, int]]) -> tuple[Tier, ...]:
    """Returns the tiers for a bucket width and (width, after) rollups; raises ValueError if inconsistent."""
    if bucket_seconds <= 0:
        raise ValueError(f"bucket width {bucket_seconds} must be positive")
    widths = [bucket_seconds]
    keeps: list[int | None] = []
    previous_after = 0
    for width, after in sorted(rollups):
        if width % widths[-1]:
            raise ValueError(f"rollup width {width} is not a multiple of {widths[-1]}")
        if after <= previous_after:
            raise ValueError(
                f"rollup ages must grow with width, got {after} after {previous_after}"
            )
        widths.append(width)
        keeps.append(after)
        previous_after = after
    keeps.append(None)
    return tuple(Tier(width, keep) for width, keep in zip(widths, keeps, strict=True))


def _align_up(value: int, width: int) -> int:
    return -(-value // width) * width


def _align_down(value: int, width: int) -> int:
    return value // width * width


def plan(
    start: int, end: int, states: Sequence[TierState], *, max_width: int | None = None
) -> list[Segment]:
    """Cuts [start, end) into disjoint segments, each read from the coarsest tier that covers it.

    `states` runs from the finest tier to the coarsest; the finest is taken to cover up to
    now. Tiers wider than `max_width` are used only where no narrower tier covers. A piece
    no tier covers exactly (its finer rows are gone) is read from the finest tier holding
    it, counting each row by its bucket start. Because tier widths divide each other and
    every `kept_from` is aligned to the coarsest width, no row straddles two segments, so
    no sample is counted twice.
    """
    if end <= start:
        return []
    covered = [
        TierState(s.width, s.kept_from, FAR_FUTURE if i == 0 else s.rolled_to)
        for i, s in enumerate(states)
    ]
    narrow = [s for s in covered if max_width is None or s.width <= max_width]
    wide = [s for s in covered if max_width is not None and s.width > max_width]
    preference = narrow[::-1] + wide
    segments = _cover(start, end, preference, 0, covered)
    return _merge_adjacent(sorted(segments, key=lambda seg: seg.start))


def _cover(
    start: int, end: int, preference: Sequence[TierState], i: int, finest_first: Sequence[TierState]
) -> list[Segment]:
    if end <= start:
        return []
    if i == len(preference):
        return _fallback(start, end, finest_first)
    state = preference[i]
    low = _align_up(max(start, state.kept_from), state.width)
    high = _align_down(min(end, state.rolled_to), state.width)
    if high <= low:
        return _cover(start, end, preference, i + 1, finest_first)
    return (
        _cover(start, low, preference, i + 1, finest_first)
        + [Segment(state.width, low, high)]
        + _cover(high, end, preference, i + 1, finest_first)
    )


def _fallback(start: int, end: int, finest_first: Sequence[TierState]) -> list[Segment]:
    """Reads a piece no tier covers exactly from the finest tier whose span overlaps it."""
    for state in finest_first:
        if max(start, state.kept_from) < min(end, state.rolled_to):
            return [Segment(state.width, start, end)]
    return []


def _merge_adjacent(segments: list[Segment]) -> list[Segment]:
    merged: list[Segment] = []
    for seg in segments:
        if merged and merged[-1].width == seg.width and merged[-1].end == seg.start:
            merged[-1] = Segment(seg.width, merged[-1].start, seg.end)
        else:
            merged.append(seg)
    return merged
