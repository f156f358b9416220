"""Resolution tiers and the plan that reads a time window from them.

Pure module: no I/O. Samples are stored at several resolutions ("tiers"): the finest has the
collector's bucket width; each coarser tier is materialised from the one before it as soon
as its buckets are complete, and each tier keeps its rows for a while (the finest 1 day, the
10-minute tier 7 days, the hourly tier until retention, by default). Every tier therefore
holds the same samples, at its own width, over the time it covers, and a window is answered
by cutting it into disjoint segments, each read from the coarsest tier covering it exactly.

Beside these instance tiers, fleet tiers hold the same samples without the host and instance
(one row per fleet series and bucket, see fleet.py), at the same widths and two coarser ones
(6 hours and a day). A read with no host or instance filter prefers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sampler.profile import align_down, align_up

__all__ = [
    "DAY",
    "ChunkPace",
    "DEFAULT_ROLLUPS",
    "FLEET_WIDTHS",
    "Segment",
    "Tier",
    "TierState",
    "build_fleet_tiers",
    "build_tiers",
    "plan",
]

DAY = 86400
# (width, after): samples older than `after` seconds are kept only at `width` or coarser.
DEFAULT_ROLLUPS: tuple[tuple[int, int], ...] = ((600, DAY), (3600, 7 * DAY))
# Fleet tiers coarser than every instance tier, kept until retention: long windows read
# a few of their rows instead of one per hour.
FLEET_WIDTHS = (6 * 3600, DAY)
FAR_FUTURE = 2**62


class ChunkPace:
    """How much time the next chunk of a rollup covers, as a multiple of its least span.

    A rollup commits a chunk at a time (a small transaction each). Its least span suits the
    usual run, every few minutes; a backlog (days of a sparse fleet, a collector that was
    down, a database from before a tier) would then take thousands of transactions. So the
    span doubles after a chunk of few rows, up to ``most`` times the least, and halves after
    one of many. It learns from chunks done: where dense data follows a sparse stretch, one
    chunk may hold up to ``most`` times what the least span would.
    """

    def __init__(self, rows: int = 50_000, most: int = 16) -> None:
        self.rows = rows
        self.most = most
        self.factor = 1

    def span(self, least: int) -> int:
        """The next chunk's span: ``least`` (a multiple of the tier's width) times the factor."""
        return least * self.factor

    def done(self, rows: int) -> None:
        """Takes the number of rows the last chunk wrote (negative: unknown, nothing learned)."""
        if rows < 0:
            return
        if rows < self.rows // 4:
            self.factor = min(self.factor * 2, self.most)
        elif rows > self.rows:
            self.factor = max(self.factor // 2, 1)


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
    fleet: bool = False  # a fleet tier (no host or instance), else an instance tier


@dataclass(frozen=True)
class Segment:
    """Part of a window read from one tier: rows of `width` with bucket start in [start, end)."""

    width: int
    start: int
    end: int
    fleet: bool = False


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


def build_fleet_tiers(tiers: Sequence[Tier]) -> tuple[Tier, ...]:
    """Returns the fleet tiers mirroring instance ``tiers``: the same widths, each kept as
    long, then the FLEET_WIDTHS that are multiples of the coarsest, kept until retention."""
    extra = []
    for width in FLEET_WIDTHS:
        if width > (extra or tiers)[-1].width and width % (extra or tiers)[-1].width == 0:
            extra.append(Tier(width, None))
    return (*tiers, *extra)


def plan(
    start: int, end: int, states: Sequence[TierState], *, max_width: int | None = None
) -> list[Segment]:
    """Cuts [start, end) into disjoint segments, each read from the coarsest tier that covers it.

    `states` holds the instance tiers from the finest to the coarsest, the finest taken to
    cover up to now, and may hold fleet tiers (finest first too): where they cover, they are
    preferred to instance tiers. Tiers wider than `max_width` are used only where no
    narrower tier covers. A piece no tier covers exactly (its finer rows are gone) is read
    from the finest tier holding it, counting each row by its bucket start. Because tier
    widths divide each other and every `kept_from` is aligned to the coarsest instance
    width, no row straddles two segments, so no sample is counted twice.
    """
    if end <= start:
        return []
    instance = [s for s in states if not s.fleet]
    fleet = [s for s in states if s.fleet]
    instance[0] = TierState(instance[0].width, instance[0].kept_from, FAR_FUTURE)

    def narrow(s: TierState) -> bool:
        return max_width is None or s.width <= max_width

    # The coarsest narrow tiers first; past max_width, the least wide first.
    preference = [s for s in fleet[::-1] if narrow(s)] + [s for s in instance[::-1] if narrow(s)]
    preference += [s for s in fleet if not narrow(s)] + [s for s in instance if not narrow(s)]
    finest_first = sorted(fleet + instance, key=lambda s: (s.width, not s.fleet))
    segments = _cover(start, end, preference, 0, finest_first)
    return _merge_adjacent(sorted(segments, key=lambda seg: seg.start))


def _cover(
    start: int, end: int, preference: Sequence[TierState], i: int, finest_first: Sequence[TierState]
) -> list[Segment]:
    if end <= start:
        return []
    if i == len(preference):
        return _fallback(start, end, finest_first)
    state = preference[i]
    low = align_up(max(start, state.kept_from), state.width)
    high = align_down(min(end, state.rolled_to), state.width)
    if high <= low:
        return _cover(start, end, preference, i + 1, finest_first)
    return (
        _cover(start, low, preference, i + 1, finest_first)
        + [Segment(state.width, low, high, state.fleet)]
        + _cover(high, end, preference, i + 1, finest_first)
    )


def _fallback(start: int, end: int, finest_first: Sequence[TierState]) -> list[Segment]:
    """Reads a piece no tier covers exactly from the finest tier whose span overlaps it."""
    for state in finest_first:
        if max(start, state.kept_from) < min(end, state.rolled_to):
            return [Segment(state.width, start, end, state.fleet)]
    return []


def _merge_adjacent(segments: list[Segment]) -> list[Segment]:
    merged: list[Segment] = []
    for seg in segments:
        last = merged[-1] if merged else None
        if last and (last.width, last.fleet, last.end) == (seg.width, seg.fleet, seg.start):
            merged[-1] = Segment(seg.width, last.start, seg.end, seg.fleet)
        else:
            merged.append(seg)
    return merged
