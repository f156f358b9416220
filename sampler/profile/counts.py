"""Sample counts per folded stack: summing, subtracting and filtering them.

Every profile operation of the three rooms is one of these (the call tree's too, see
tree.py), so each is written once. Counts are plain mappings from a folded stack to a number
of samples; a stack with no samples is left out of every result.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

__all__ = ["Counts", "filter_stacks", "merge", "rescale", "subtract"]

Counts = dict[str, int]


def merge(profiles: Iterable[Mapping[str, int]]) -> Counts:
    """Sums several profiles into one."""
    total: Counts = {}
    for profile in profiles:
        if not total:
            total.update(profile)
            continue
        get = total.get
        for stack, count in profile.items():
            total[stack] = get(stack, 0) + count
    return {stack: count for stack, count in total.items() if count > 0}


def subtract(after: Mapping[str, int], before: Mapping[str, int]) -> Counts:
    """Returns what ``after`` gained over ``before`` (both cumulative); never negative."""
    get = before.get
    delta: Counts = {}
    for stack, count in after.items():
        gained = count - get(stack, 0)
        if gained > 0:
            delta[stack] = gained
    return delta


def filter_stacks(counts: Mapping[str, int], keep: Callable[[str], bool]) -> Counts:
    """Returns the stacks with samples for which ``keep(stack)`` is true."""
    return {stack: count for stack, count in counts.items() if count > 0 and keep(stack)}


def rescale(counts: Mapping[str, int], factor: float) -> Counts:
    """Returns counts multiplied by ``factor``, rounded: samples of one interval counted in
    another (``factor`` = old interval / new interval)."""
    if factor == 1:
        return {stack: count for stack, count in counts.items() if count > 0}
    scaled = ((stack, round(count * factor)) for stack, count in counts.items())
    return {stack: count for stack, count in scaled if count > 0}
