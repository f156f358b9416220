"""Function tables of a profile, and functions ranked by how their share changed."""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import repeat
from operator import add, itemgetter, mul
from typing import Any

from sampler.profile import unescape_frame

__all__ = [
    "FunctionChange",
    "FunctionSamples",
    "count_frames",
    "rank_changes",
    "top_functions",
]


@dataclass(frozen=True)
class FunctionSamples:
    """Each frame's self and total samples in a profile (escaped names), and its total."""

    self_counts: dict[str, int]
    totals: dict[str, int]
    total: int

    @classmethod
    def of(cls, counts: Mapping[str, int]) -> FunctionSamples:
        """Counts the frames of a profile of folded counts."""
        stacks = [(stack, count) for stack, count in counts.items() if count > 0]
        frames = [tuple(dict.fromkeys(reversed(stack.split(";")))) for stack, _ in stacks]
        return count_frames(frames, [count for _, count in stacks])


def count_frames(frames: Sequence[tuple[str, ...]], counts: Sequence[int]) -> FunctionSamples:
    """Counts self and total samples per frame, given each stack's distinct frames (leaf first,
    so a recursive function counts once per stack in its total) and its positive count. The
    empty stack, ``("",)``, has no frame: its samples count in the total only.

    Stacks are grouped by count so that frames are counted inside Counter (C code) and weighed
    once per distinct frame of a group: profiles have few distinct counts.
    """
    order = sorted(range(len(counts)), key=counts.__getitem__)
    in_order = list(map(frames.__getitem__, order))
    self_counts: dict[str, int] = {}
    totals: dict[str, int] = {}
    start = 0
    for count, group in itertools.groupby(map(counts.__getitem__, order)):
        end = start + len(list(group))
        stacks = in_order[start:end]
        start = end
        _add_times(self_counts, Counter(map(itemgetter(0), stacks)), count)
        _add_times(totals, Counter(itertools.chain.from_iterable(stacks)), count)
    self_counts.pop("", None)
    totals.pop("", None)
    return FunctionSamples(self_counts, totals, sum(counts))


def _add_times(into: dict[str, int], seen: Mapping[str, int], times: int) -> None:
    """Adds ``times`` each of ``seen``'s counts to ``into``, in builtins only: this runs for
    every distinct frame of every group, a million times for a window of 200,000 stacks."""
    names = list(seen)
    values = seen.values() if times == 1 else map(mul, seen.values(), repeat(times))
    into.update(zip(names, map(add, map(into.get, names, repeat(0)), values), strict=True))


def _samples(counts: Mapping[str, int] | FunctionSamples) -> FunctionSamples:
    return counts if isinstance(counts, FunctionSamples) else FunctionSamples.of(counts)


def top_functions(
    counts: Mapping[str, int] | FunctionSamples, *, limit: int = 100
) -> list[dict[str, Any]]:
    """Returns the functions with the most self samples (then total), with their shares.

    Names are unescaped for display; a recursive function counts once per stack in its total.
    ``counts`` are folded counts, or their frames counted already (StackIndex does it faster).
    """
    samples = _samples(counts)
    grand_total = samples.total
    scale = 1.0 / grand_total if grand_total else 0.0
    self_counts, totals = samples.self_counts, samples.totals
    top = heapq.nsmallest(
        limit, totals, key=lambda name: (-self_counts.get(name, 0), -totals[name], name)
    )
    return [
        {
            "name": unescape_frame(name),
            "self": self_counts.get(name, 0),
            "total": totals[name],
            "self_share": self_counts.get(name, 0) * scale,
            "total_share": totals[name] * scale,
        }
        for name in top
    ]


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
    counts_a: Mapping[str, int] | FunctionSamples,
    counts_b: Mapping[str, int] | FunctionSamples,
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
