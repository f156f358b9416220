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
from typing import Any, NamedTuple

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
# A stored document counts at most this many values, every one in its bins or its zero count
# (pack_sketch checks both): a field holds at most a document's count, and a sum of documents
# stays under 2**64 (no field carries into the next) for 65,536 documents of the most.
MAX_COUNT = 2**48
_MAX_SUM = 2**64 - 1


def pack_sketch(sketch: Sketch) -> dict[str, Any]:
    """The stored document of ``sketch``; SketchError if it is not of the store's alpha and
    min_value, holds a bin past MAX_VALUE, or its counts do not add up (or past MAX_COUNT)."""
    if sketch.alpha != ALPHA or sketch.min_value != MIN_VALUE:
        raise SketchError(
            f"the store keeps sketches of alpha {ALPHA} and min_value {MIN_VALUE}, "
            f"not {sketch.alpha} and {sketch.min_value}"
        )
    binned = sum(sketch.bins.values())
    if not 0 <= sketch.zero or binned + sketch.zero != sketch.count or sketch.count > MAX_COUNT:
        raise SketchError(
            f"a sketch's count {sketch.count} is not its bins' {binned} and zero's "
            f"{sketch.zero}, or is over {MAX_COUNT}"
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

    __slots__ = ("zero", "count", "sum", "max", "_start", "_fields", "_values")

    def __init__(self) -> None:
        self.zero = self.count = 0
        self.sum = self.max = 0.0
        self._start: int | None = None  # the bin index of the lowest field of _fields
        self._fields = 0
        self._values = 0  # what the fields can hold at the most: the documents' values

    def add(self, data: dict[str, Any]) -> None:
        """Adds a stored document; SketchError if it is not one (nothing is added then)."""
        read = _read(data)
        self.check(read)
        self.add_read(read)

    def check(self, read: _Read) -> None:
        """SketchError if adding a document ``_read`` returned could carry a field into the
        next: every field holds at most its documents' values, so they must stay under 2**64."""
        if self._values + read.values > _MAX_SUM:
            raise SketchError(f"sketches of more than {_MAX_SUM} values in all")

    def add_read(self, read: _Read) -> None:
        """Adds a document ``_read`` returned and ``check`` let pass."""
        if read.fields:
            start = read.start
            if self._start is None:
                self._start = start
            elif start < self._start:
                self._fields <<= (self._start - start) * _FIELD_BITS
                self._start = start
            self._fields += read.fields << ((start - self._start) * _FIELD_BITS)
        self._values += read.values
        self.zero += read.zero
        self.count += read.count
        self.sum += read.sum
        self.max = max(self.max, read.max)

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


class _Read(NamedTuple):
    start: int  # the bin index of the lowest field
    fields: int  # the counts, a 64-bit field each
    values: int  # what one field can hold at the most
    zero: int
    count: int
    sum: float
    max: float


def _read(data: dict[str, Any]) -> _Read:
    # A stored document, checked: a row of a database someone else can write to must not make
    # this process build an endless integer.
    try:
        if float(data["alpha"]) != ALPHA or float(data["min_value"]) != MIN_VALUE:
            raise SketchError("cannot merge a sketch of another alpha or min_value")
        zero, count = data["zero"], data["count"]
        if type(zero) is not int or type(count) is not int or not 0 <= count <= MAX_COUNT:
            raise SketchError(f"counts must be whole numbers up to {MAX_COUNT}")
        if "packed" in data:
            # Written by pack_sketch, which checked that the bins hold the count at the most.
            start, fields = _unpack(data["start"], data["packed"])
            values = count
        else:
            start, fields, binned = _pairs(data["bins"])
            values = max(count, binned)
        return _Read(start, fields, values, zero, count, float(data["sum"]), float(data["max"]))
    except (KeyError, TypeError, ValueError, OverflowError, zlib.error) as exc:
        if isinstance(exc, SketchError):
            raise
        raise SketchError(f"not a stored sketch document: {exc!r}") from None


def _unpack(start: Any, packed: str) -> tuple[int, int]:
    if type(start) is not int or not LOWEST_INDEX <= start <= HIGHEST_INDEX:
        raise SketchError(f"a packed sketch's start must be in [{LOWEST_INDEX}, {HIGHEST_INDEX}]")
    most = (HIGHEST_INDEX - start + 1) * _FIELD_BITS // 8
    inflate = zlib.decompressobj()
    raw = inflate.decompress(base64.b64decode(packed, validate=True), most)
    if inflate.unconsumed_tail or not inflate.eof or len(raw) % 8:
        raise SketchError("a packed sketch's counts run past its last bin or are cut short")
    return start, int.from_bytes(raw, "little")


def _pairs(pairs: list[list[int]]) -> tuple[int, int, int]:
    # A document stored before packing: its bins as [index, count] pairs, indices as its poll
    # left them (then unchecked: one out of range counts in the nearest bin kept now).
    bins: dict[int, int] = {}
    for index, count in pairs:
        if type(index) is not int or type(count) is not int or not 0 <= count <= MAX_COUNT:
            raise SketchError(f"a bin must be two whole numbers, got {[index, count]}")
        index = min(max(index, LOWEST_INDEX), HIGHEST_INDEX)
        bins[index] = bins.get(index, 0) + count
    start, raw = _counts_bytes(bins)
    return start, int.from_bytes(raw, "little"), sum(bins.values())


def _counts_bytes(bins: dict[int, int]) -> tuple[int, bytes]:
    # The lowest index and the counts from it on, 64-bit little-endian.
    start, end = min(bins, default=0), max(bins, default=-1)
    if bins and (start < LOWEST_INDEX or end > HIGHEST_INDEX):
        raise SketchError(f"a bin index out of [{LOWEST_INDEX}, {HIGHEST_INDEX}]: {start}, {end}")
    if any(not 0 <= count <= MAX_COUNT for count in bins.values()):
        raise SketchError(f"a bin count out of [0, {MAX_COUNT}]")
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
        count, errors = int(row["count"]), int(row["errors"])
        documents = json.loads(row["sketches"])
        slow = json.loads(row["slow"])
        slow_count, slow_stacks, slowest = int(slow["count"]), slow["stacks"], slow["slowest"]
        read = {name: _read(documents[name]) for name in SKETCHES}
        for name in SKETCHES:  # all checked before anything is added
            self.sums[name].check(read[name])
        for name in SKETCHES:
            self.sums[name].add_read(read[name])
        self.count += count
        self.errors += errors
        self.slow_count += slow_count
        stacks = self.stacks
        for stack, weight in slow_stacks.items():
            stacks[stack] = stacks.get(stack, 0) + weight
        self.slowest = sorted(self.slowest + slowest, key=lambda r: -r["duration"])[:5]
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
