"""A latency sketch: quantiles within a relative error, in bounded memory, mergeable.

DDSketch's scheme (Masson, Rim and Lee, VLDB 2019): a value ``x`` counts in the bin
``ceil(log(x) / log(gamma))`` with ``gamma = (1 + alpha) / (1 - alpha)``, so a bin holds the
values of ``(gamma**(i - 1), gamma**i]`` and its midpoint ``2 * gamma**i / (gamma + 1)`` is
within ``alpha`` of each of them, relatively. A quantile is the midpoint of the bin holding the
value of that rank, so it is within ``alpha`` of the exact one. Values under ``min_value`` count
as zero. At most ``max_bins`` bins are kept: past that the lowest are folded into the lowest
kept one (only the low quantiles lose their guarantee; at 1% from 1 us to a day of latency
takes 1,260 bins, under the default 2,048). The result depends only on the values added, never
on their order or on how they were split and merged, so merging two sketches gives the sketch
of the union.

Pure: no clock, no I/O, no lock (callers that share one serialize their adds).
"""

from __future__ import annotations

import math
from collections import Counter

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

ALPHA = 0.01
MIN_VALUE = 1e-6
MAX_BINS = 2048


class SketchError(ValueError):
    """Two sketches that cannot merge, or a document that is not a sketch."""


class Sketch:
    """Counts of values in log-spaced bins: quantiles within ``alpha``, relatively."""

    __slots__ = (
        "alpha",
        "min_value",
        "max_bins",
        "bins",
        "zero",
        "count",
        "sum",
        "max",
        "_log",
        "_gamma",
        "_scale",
    )

    def __init__(
        self, alpha: float = ALPHA, min_value: float = MIN_VALUE, max_bins: int = MAX_BINS
    ) -> None:
        if not 0.0 < alpha < 1.0 or min_value <= 0.0 or max_bins < 1:
            raise SketchError(
                f"alpha must be in (0, 1), min_value > 0 and max_bins >= 1, got "
                f"{alpha!r}, {min_value!r}, {max_bins!r}"
            )
        self.alpha = alpha
        self.min_value = min_value
        self.max_bins = max_bins
        self._gamma = (1.0 + alpha) / (1.0 - alpha)
        self._log = math.log(self._gamma)
        self._scale = 1.0 / self._log
        self.bins: dict[int, int] = {}
        self.zero = 0  # values under min_value (and negative ones)
        self.count = 0
        self.sum = 0.0
        self.max = 0.0

    def add(self, value: float, count: int = 1) -> None:
        """Counts ``value`` (``count`` times)."""
        self.count += count
        if value < self.min_value:
            self.zero += count
            return
        self.sum += value * count
        if value > self.max:
            self.max = value
        index = math.ceil(math.log(value) * self._scale)
        bins = self.bins
        if index in bins:
            bins[index] += count
        else:
            bins[index] = count
            if len(bins) > self.max_bins:
                self._collapse()

    def add_all(self, values: list[float]) -> None:
        """Counts each of ``values``: as ``add`` one by one, in one pass of C loops."""
        small = self.min_value
        kept = [value for value in values if value >= small]
        self.count += len(values)
        self.zero += len(values) - len(kept)
        if not kept:
            return
        self.sum += sum(kept)
        top = max(kept)
        if top > self.max:
            self.max = top
        bins = self.bins
        for index, count in Counter(
            map(math.ceil, map(self._scale.__mul__, map(math.log, kept)))
        ).items():
            bins[index] = bins.get(index, 0) + count
        if len(bins) > self.max_bins:
            self._collapse()

    @property
    def scale(self) -> float:
        """A value counts in bin ``ceil(log(value) * scale)``."""
        return self._scale

    def counted(self, count: int, zero: int, total: float, top: float) -> None:
        """Takes the figures of ``count`` values whose bins were counted into ``bins`` already
        (by the native recorder): how many were under ``min_value``, the others' sum and max."""
        self.count += count
        self.zero += zero
        if count > zero:
            self.sum += total
            if top > self.max:
                self.max = top
        if len(self.bins) > self.max_bins:
            self._collapse()

    def _collapse(self) -> None:
        """Folds the lowest bins into the lowest kept one until ``max_bins`` are left."""
        bins = self.bins
        order = sorted(bins)
        excess = len(order) - self.max_bins
        folded = sum(bins.pop(index) for index in order[:excess])
        bins[order[excess]] += folded

    def value_of(self, index: int) -> float:
        """The value a bin stands for: within ``alpha`` of every value it holds."""
        return 2.0 * math.exp(index * self._log) / (self._gamma + 1.0)

    def quantile(self, q: float, since: Sketch | None = None) -> float | None:
        """The value of rank ``q * (count - 1)`` (0 <= q <= 1), within ``alpha``; None if empty.

        With ``since``, an earlier copy of this sketch: of the values added after it."""
        bins, zero, count = self.bins, self.zero, self.count
        if since is not None:
            zero, count = zero - since.zero, count - since.count
        if count <= 0:
            return None
        rank = q * (count - 1)
        seen = zero
        if seen > rank:
            return 0.0
        if since is None:
            for index in sorted(bins):
                seen += bins[index]
                if seen > rank:
                    return self.value_of(index)
            return self.value_of(max(bins))
        # The bins' growth since the copy, walked in order without building it apart (the
        # recorder's p99 refresh, every 100 requests of a route): the bins that grew count.
        before = since.bins.get
        last = None
        for index in sorted(bins):
            grown = bins[index] - before(index, 0)
            if grown > 0:
                seen += grown
                if seen > rank:
                    return self.value_of(index)
                last = index
        if last is None:
            raise ValueError("max() arg is an empty sequence")  # as max() of no bins raised
        return self.value_of(last)

    def merge(self, other: Sketch) -> None:
        """Adds another sketch's counts to this one (same alpha and min_value)."""
        if other.alpha != self.alpha or other.min_value != self.min_value:
            raise SketchError(
                f"cannot merge a sketch of alpha {other.alpha} and min_value {other.min_value} "
                f"into one of {self.alpha} and {self.min_value}"
            )
        bins = self.bins
        for index, count in other.bins.items():
            bins[index] = bins.get(index, 0) + count
        if len(bins) > self.max_bins:
            self._collapse()
        self.zero += other.zero
        self.count += other.count
        self.sum += other.sum
        self.max = max(self.max, other.max)

    def copy(self) -> Sketch:
        """An independent copy."""
        twin = Sketch(self.alpha, self.min_value, self.max_bins)
        twin.merge(self)
        return twin

    def document(self) -> dict[str, Any]:
        """The sketch as JSON-ready data (docs/wire-format.md, ``/requests.json``)."""
        return {
            "alpha": self.alpha,
            "min_value": self.min_value,
            "count": self.count,
            "sum": self.sum,
            "max": self.max,
            "zero": self.zero,
            "bins": [[index, self.bins[index]] for index in sorted(self.bins)],
        }

    @classmethod
    def from_counts(
        cls, bins: dict[int, int], zero: int, count: int, total: float, top: float
    ) -> Sketch:
        """A sketch of the default alpha and min_value holding these counts, already checked
        (a store's merge); its lowest bins folded past ``MAX_BINS``."""
        sketch = cls()
        sketch.bins = bins
        sketch.zero, sketch.count, sketch.sum, sketch.max = zero, count, total, top
        if len(bins) > sketch.max_bins:
            sketch._collapse()
        return sketch

    @classmethod
    def from_document(cls, data: dict[str, Any], max_bins: int = MAX_BINS) -> Sketch:
        """Reads what ``document`` wrote; raises SketchError on anything else."""
        try:
            sketch = cls(float(data["alpha"]), float(data["min_value"]), max_bins)
            for index, count in data["bins"]:
                if not isinstance(index, int) or not isinstance(count, int) or count < 0:
                    raise SketchError(f"a bin must be two whole numbers, got {[index, count]}")
                sketch.bins[index] = sketch.bins.get(index, 0) + count
            sketch.zero = int(data["zero"])
            sketch.count = int(data["count"])
            sketch.sum = float(data["sum"])
            sketch.max = float(data["max"])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, SketchError):
                raise
            raise SketchError(f"not a sketch document: {exc!r}") from None
        if len(sketch.bins) > max_bins:
            sketch._collapse()
        return sketch
