"""Function tables of a profile, and functions ranked by how their share changed.

Frames are counted by collector.functions (count_frames), shared with the collector's own
queries.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from collector.functions import FunctionSamples
from sampler.profile import Profile, unescape_frame

__all__ = [
    "FunctionChange",
    "FunctionSamples",
    "rank_changes",
    "top_functions",
]


def _samples(counts: Mapping[str, int] | Profile | FunctionSamples) -> FunctionSamples:
    if isinstance(counts, FunctionSamples):
        return counts
    return FunctionSamples.of(counts.counts if isinstance(counts, Profile) else counts)


def top_functions(
    counts: Mapping[str, int] | Profile | FunctionSamples,
    *,
    limit: int = 100,
    interval: float | None = None,
) -> list[dict[str, Any]]:
    """Returns the functions with the most self samples (then total), with their shares.

    Names are unescaped for display; a recursive function counts once per stack in its total.
    ``counts`` are folded counts, a Profile, or their frames counted already (StackIndex does
    it faster). With an ``interval`` (a Profile's, unless given), each row also has its
    ``self_seconds`` and ``total_seconds``.
    """
    if interval is None and isinstance(counts, Profile):
        interval = counts.interval
    samples = _samples(counts)
    grand_total = samples.total
    scale = 1.0 / grand_total if grand_total else 0.0
    self_counts, totals = samples.self_counts, samples.totals
    top = heapq.nsmallest(
        limit, totals, key=lambda name: (-self_counts.get(name, 0), -totals[name], name)
    )
    rows = [
        {
            "name": unescape_frame(name),
            "self": self_counts.get(name, 0),
            "total": totals[name],
            "self_share": self_counts.get(name, 0) * scale,
            "total_share": totals[name] * scale,
        }
        for name in top
    ]
    if interval is not None:
        for row in rows:
            row["self_seconds"] = row["self"] * interval
            row["total_seconds"] = row["total"] * interval
    return rows


@dataclass(frozen=True)
class FunctionChange:
    """A function's self and total share on both sides of a comparison (shares are 0..1)."""

    name: str
    self_a: float
    self_b: float
    total_a: float
    total_b: float

    @property
    def self_delta(self) -> float:
        """Change of the self share from A to B; positive means more time in B."""
        return self.self_b - self.self_a

    @property
    def total_delta(self) -> float:
        """Change of the total share from A to B."""
        return self.total_b - self.total_a

    def to_dict(self) -> dict[str, Any]:
        """Renders the change for JSON."""
        return {**asdict(self), "self_delta": self.self_delta, "total_delta": self.total_delta}


def rank_changes(
    counts_a: Mapping[str, int] | Profile | FunctionSamples,
    counts_b: Mapping[str, int] | Profile | FunctionSamples,
    *,
    limit: int = 100,
    order: str = "self",
) -> list[FunctionChange]:
    """Ranks functions by how much their share changed from A to B, largest change first.

    Each side is normalised to its own total. ``order`` is ``"self"`` (change of self share,
    ties broken by the total share) or ``"total"``.
    """
    if order not in ("self", "total"):
        raise ValueError(f"order must be 'self' or 'total', not {order!r}")
    sides = []
    for counts in (counts_a, counts_b):
        samples = _samples(counts)
        scale = 1.0 / samples.total if samples.total else 0.0
        self_counts = samples.self_counts
        sides.append(
            {
                name: (self_counts.get(name, 0) * scale, t * scale)
                for name, t in samples.totals.items()
            }
        )
    a, b = sides
    changes = [
        FunctionChange(unescape_frame(name), *_pair(a, b, name)) for name in a.keys() | b.keys()
    ]
    if order == "self":
        changes.sort(key=lambda c: (-abs(c.self_delta), -abs(c.total_delta), c.name))
    else:
        changes.sort(key=lambda c: (-abs(c.total_delta), -abs(c.self_delta), c.name))
    return changes[:limit]


def _pair(a: dict, b: dict, name: str) -> tuple[float, float, float, float]:
    self_a, total_a = a.get(name, (0.0, 0.0))
    self_b, total_b = b.get(name, (0.0, 0.0))
    return self_a, self_b, total_a, total_b
