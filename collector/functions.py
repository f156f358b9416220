"""Per-function statistics of a merged profile: self and total samples of every frame.

Pure module: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["FunctionStat", "function_stats"]


@dataclass(frozen=True)
class FunctionStat:
    """One frame name's samples: as the leaf (self) and anywhere on the stack (total)."""

    name: str
    self_count: int
    total: int


def function_stats(profile: Mapping[str, int], limit: int | None = None) -> list[FunctionStat]:
    """Returns frames by self samples then total, counting a frame once per stack for total.

    A recursive function appears several times on one stack; its total counts that stack's
    samples once, so no function's total exceeds the profile's total.
    """
    self_counts: dict[str, int] = {}
    totals: dict[str, int] = {}
    for stack, count in profile.items():
        if count <= 0:
            continue
        frames = stack.split(";")
        leaf = frames[-1]
        self_counts[leaf] = self_counts.get(leaf, 0) + count
        for frame in set(frames):
            totals[frame] = totals.get(frame, 0) + count
    stats = [FunctionStat(name, self_counts.get(name, 0), total) for name, total in totals.items()]
    stats.sort(key=lambda s: (-s.self_count, -s.total, s.name))
    return stats if limit is None else stats[:limit]
