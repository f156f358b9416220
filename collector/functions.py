"""Per-function statistics of a merged profile: self and total samples of every frame.

Pure module: no I/O.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import add, itemgetter, mul

from sampler.profile import split_frames

__all__ = ["FunctionSamples", "FunctionStat", "count_frames", "function_stats"]


@dataclass(frozen=True)
class FunctionStat:
    """One frame name's samples: as the leaf (self) and anywhere on the stack (total)."""

    name: str
    self_count: int
    total: int


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
        frames = [tuple(dict.fromkeys(reversed(split_frames(stack)))) for stack, _ in stacks]
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


def function_stats(profile: Mapping[str, int], limit: int | None = None) -> list[FunctionStat]:
    """Returns frames by self samples then total, counting a frame once per stack for total.

    A recursive function appears several times on one stack; its total counts that stack's
    samples once, so no function's total exceeds the profile's total. An empty frame name
    (the empty stack, or ``a;;b``) is no function: it is left out.
    """
    samples = FunctionSamples.of(profile)
    self_counts = samples.self_counts
    stats = [FunctionStat(name, self_counts.get(name, 0), t) for name, t in samples.totals.items()]
    stats.sort(key=lambda s: (-s.self_count, -s.total, s.name))
    return stats if limit is None else stats[:limit]
