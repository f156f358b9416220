"""A profile: sample counts per folded stack, with what one sample stands for.

The interval travels with the counts from the sampler to the screen, so every room turns
counts into seconds the same way: ``seconds = count * interval``, of CPU time in ``cpu`` mode
and of wall-clock time in ``wall`` mode (docs/wire-format.md, Units).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from .counts import Counts, filter_stacks, merge, rescale, subtract
from .folded import format_folded, parse_folded
from .tree import Node, build_tree

__all__ = ["DEFAULT_INTERVAL", "MODES", "Profile"]

MODES = ("cpu", "wall")
# The sampler's default: 100 samples a second.
DEFAULT_INTERVAL = 0.01


class Profile:
    """Samples per folded stack (``counts``), each standing for ``interval`` seconds of
    ``mode`` time. Operations return new profiles; the counts given are not copied."""

    __slots__ = ("counts", "interval", "mode")

    def __init__(
        self,
        counts: Mapping[str, int] | None = None,
        *,
        interval: float = DEFAULT_INTERVAL,
        mode: str = "cpu",
    ) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)):
            raise TypeError(f"interval must be a number of seconds, not {interval!r:.40}")
        if not (math.isfinite(interval) and interval > 0):
            raise ValueError(f"interval must be a positive number of seconds, not {interval}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r:.20}")
        self.counts: Mapping[str, int] = {} if counts is None else counts
        self.interval = float(interval)
        self.mode = mode

    def __repr__(self) -> str:
        return (
            f"Profile({len(self.counts)} stacks, {self.total} samples, "
            f"interval={self.interval}, mode={self.mode!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Profile):
            return NotImplemented
        return (
            self.interval == other.interval
            and self.mode == other.mode
            and _positive(self.counts) == _positive(other.counts)
        )

    __hash__ = None  # type: ignore[assignment]  # holds a mutable mapping

    @property
    def total(self) -> int:
        """All samples."""
        return sum(count for count in self.counts.values() if count > 0)

    @property
    def seconds(self) -> float:
        """The time all samples stand for."""
        return self.total * self.interval

    def seconds_of(self, count: float) -> float:
        """The time ``count`` samples of this profile stand for."""
        return count * self.interval

    def merge(self, *others: Profile) -> Profile:
        """Returns this profile and ``others`` summed, counted at the finest interval of them
        all (a coarser profile's counts are scaled to it, rounded). Raises ValueError when
        their modes differ: CPU and wall-clock time never add up."""
        profiles = (self, *others)
        _same_mode(profiles)
        interval = min(p.interval for p in profiles)
        return Profile(
            merge(p._counts_at(interval) for p in profiles), interval=interval, mode=self.mode
        )

    def subtract(self, before: Profile) -> Profile:
        """Returns what this profile gained over ``before`` (both cumulative), never negative,
        at this profile's interval."""
        _same_mode((self, before))
        return Profile(
            subtract(self.counts, before._counts_at(self.interval)),
            interval=self.interval,
            mode=self.mode,
        )

    def filter(self, keep: Callable[[str], bool]) -> Profile:
        """Returns the stacks (folded text) for which ``keep`` is true."""
        return Profile(filter_stacks(self.counts, keep), interval=self.interval, mode=self.mode)

    def tree(self, root_name: str = "all") -> Node:
        """Returns the call tree of the counts."""
        return build_tree(self.counts, root_name)

    def folded(self) -> str:
        """Returns the counts as folded-stack text (sorted; counts, not seconds)."""
        return format_folded(self.counts)

    @classmethod
    def parse(cls, text: str, *, interval: float = DEFAULT_INTERVAL, mode: str = "cpu") -> Profile:
        """Reads folded-stack text (see parse_folded)."""
        return cls(parse_folded(text), interval=interval, mode=mode)

    def _counts_at(self, interval: float) -> Mapping[str, int]:
        if interval == self.interval:
            return self.counts
        return rescale(self.counts, self.interval / interval)


def _same_mode(profiles: tuple[Profile, ...]) -> None:
    modes = {p.mode for p in profiles}
    if len(modes) > 1:
        raise ValueError("cpu and wall profiles never add up: their samples measure other times")


def _positive(counts: Mapping[str, int]) -> Counts:
    return {stack: count for stack, count in counts.items() if count > 0}
