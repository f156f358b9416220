"""Request figures as the store keeps them: a row of request_buckets or request_fleet holds a
route's count, errors, sketches (JSON: latency, queue and total) and slow requests (JSON: how
many, the slowest 1%'s stacks, the five slowest).

A stored sketch carries its bins packed, not as the ``[index, count]`` pairs of the wire:
``start``, the lowest bin's index, and ``packed``, the counts of bins ``start``,
``start + 1``, ... as 64-bit little-endian integers, zlib-compressed, in base64 (~0.6 KB for
a route's ~300 bins from 1 ms to 2 s, where the pairs took ~3.4 KB). Merging the thousands of
rows of a month is then arithmetic: a document's counts read as one Python integer of 64-bit
fields, and adding two such integers (shifted so their starts line up) adds every bin at once,
with no loop over bins in Python. No field carries into the next: that would take 2**64 values
in one bin. Rows written before keep their pairs and merge as well.
"""

from __future__ import annotations

import base64
import json
import math
import sys
import zlib
from array import array
from typing import Any

from sampler._sketch import ALPHA, MIN_VALUE, Sketch, SketchError
from sampler.profile import OTHER

__all__ = ["SKETCHES", "RequestFigures", "SketchSum", "pack_sketch"]

SKETCHES = ("latency", "queue", "total")
# A stored bin stands for a value from MIN_VALUE to MAX_VALUE seconds (about 32 years): what
# lies outside comes from no sampler and would make a packed document as long as it likes.
MAX_VALUE = 1e9
_SCALE = 1.0 / math.log((1.0 + ALPHA) / (1.0 - ALPHA))
LOWEST_INDEX = math.floor(math.log(MIN_VALUE) * _SCALE)
HIGHEST_INDEX = math.ceil(math.log(MAX_VALUE) * _SCALE)
_FIELD_BITS = 64


def pack_sketch(sketch: Sketch) -> dict[str, Any]:
    """The stored document of ``sketch``; SketchError if it is not of the store's alpha and
    min_value or holds a bin past MAX_VALUE."""
    if sketch.alpha != ALPHA or sketch.min_value != MIN_VALUE:
        raise SketchError(
            f"the store keeps sketches of alpha {ALPHA} and min_value {MIN_VALUE}, "
            f"not {sketch.alpha} and {sketch.min_value}"
        )
    start, raw = _counts_bytes(sketch.bins)
    packed = base64.b64encode(zlib.compress(raw, 1)).decode("ascii")
    return {
        "alpha": sketch.alpha,
        "min_value": sketch.min_value,
        "count": sketch.count,
        "sum": sketch.sum,
        "max": sketch.max,
        "zero": sketch.zero,
        "start": start,
        "packed": packed,
    }


class SketchSum:
    """Stored sketch documents added up (packed or as pairs); ``sketch()`` is their merge."""

    __slots__ = ("zero", "count", "sum", "max", "_start", "_fields")

    def __init__(self) -> None:
        self.zero = self.count = 0
        self.sum = self.max = 0.0
        self._start: int | None = None  # the bin index of the lowest field of _fields
        self._fields = 0

    def add(self, data: dict[str, Any]) -> None:
        """Adds a stored document; SketchError if it is not one."""
        try:
            if float(data["alpha"]) != ALPHA or float(data["min_value"]) != MIN_VALUE:
                raise SketchError("cannot merge a sketch of another alpha or min_value")
            if "packed" in data:
                start = int(data["start"])
                raw = zlib.decompress(base64.b64decode(data["packed"]))
                fields = int.from_bytes(raw, "little")
            else:
                start, fields = self._pairs(data["bins"])
            zero, count = int(data["zero"]), int(data["count"])
            total, top = float(data["sum"]), float(data["max"])
        except (KeyError, TypeError, ValueError, zlib.error) as exc:
            if isinstance(exc, SketchError):
                raise
            raise SketchError(f"not a stored sketch document: {exc!r}") from None
        if fields:
            if self._start is None:
                self._start = start
            elif start < self._start:
                self._fields <<= (self._start - start) * _FIELD_BITS
                self._start = start
            self._fields += fields << ((start - self._start) * _FIELD_BITS)
        self.zero += zero
        self.count += count
        self.sum += total
        self.max = max(self.max, top)

    @staticmethod
    def _pairs(pairs: list[list[int]]) -> tuple[int, int]:
        # A document stored before packing: its bins as [index, count] pairs.
        bins: dict[int, int] = {}
        for index, count in pairs:
            bins[int(index)] = bins.get(int(index), 0) + int(count)
        start, raw = _counts_bytes(bins)
        return start, int.from_bytes(raw, "little")

    def sketch(self) -> Sketch:
        """The merged sketch (its lowest bins folded past ``MAX_BINS``, as a merge does)."""
        bins: dict[int, int] = {}
        if self._fields:
            counts = array("Q")
            size = (self._fields.bit_length() + _FIELD_BITS - 1) // _FIELD_BITS * 8
            counts.frombytes(self._fields.to_bytes(size, "little"))
            if sys.byteorder == "big":
                counts.byteswap()
            start = self._start or 0
            bins = {start + offset: n for offset, n in enumerate(counts) if n}
        return Sketch.from_counts(bins, self.zero, self.count, self.sum, self.max)


def _counts_bytes(bins: dict[int, int]) -> tuple[int, bytes]:
    # The lowest index and the counts from it on, 64-bit little-endian.
    start, end = min(bins, default=0), max(bins, default=-1)
    if bins and (start < LOWEST_INDEX or end > HIGHEST_INDEX):
        raise SketchError(f"a bin index out of [{LOWEST_INDEX}, {HIGHEST_INDEX}]: {start}, {end}")
    if any(not 0 <= count < 2**_FIELD_BITS for count in bins.values()):
        raise SketchError(f"a bin count out of [0, 2**{_FIELD_BITS})")
    counts = array("Q", (bins.get(index, 0) for index in range(start, end + 1)))
    if sys.byteorder == "big":
        counts.byteswap()
    return start, counts.tobytes()


class RequestFigures:
    """Request rows' figures added up: counts, sketches, the slowest 1%'s stacks and the
    slowest requests."""

    def __init__(self) -> None:
        self.count = self.errors = self.slow_count = 0
        self.sums = {name: SketchSum() for name in SKETCHES}
        self.stacks: dict[str, float] = {}
        self.slowest: list[dict] = []

    def add(self, row: Any) -> RequestFigures:
        """Adds a row as stored (its sketches and slow requests as JSON); None adds nothing."""
        if row is None:
            return self
        self.count += row["count"]
        self.errors += row["errors"]
        sketches = json.loads(row["sketches"])
        for name in SKETCHES:
            self.sums[name].add(sketches[name])
        slow = json.loads(row["slow"])
        self.slow_count += slow["count"]
        stacks = self.stacks
        for stack, weight in slow["stacks"].items():
            stacks[stack] = stacks.get(stack, 0) + weight
        self.slowest = sorted(self.slowest + slow["slowest"], key=lambda r: -r["duration"])[:5]
        return self

    def sketch(self, name: str) -> Sketch:
        """The merged sketch ``name`` (one of SKETCHES)."""
        return self.sums[name].sketch()

    def row(self, max_stacks: int | None = None) -> dict:
        """The figures as a row stores them; past ``max_stacks`` slow stacks, the lightest
        are summed under [other]."""
        stacks = self.stacks
        if max_stacks is not None and len(stacks) > max_stacks:
            other = stacks.get(OTHER, 0)
            ranked = sorted((i for i in stacks.items() if i[0] != OTHER), key=lambda i: -i[1])
            stacks = dict(ranked[: max_stacks - 1])
            stacks[OTHER] = other + sum(weight for _, weight in ranked[max_stacks - 1 :])
        slow = {"count": self.slow_count, "stacks": stacks, "slowest": self.slowest}
        sketches = {name: pack_sketch(self.sketch(name)) for name in SKETCHES}
        return {
            "count": self.count,
            "errors": self.errors,
            "sketches": json.dumps(sketches),
            "slow": json.dumps(slow),
        }
