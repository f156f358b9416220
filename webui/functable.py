"""Function tables of large windows: for each function, the stacks it appears in.

Counting a window's functions frame by frame costs ~7 million steps for 200,000 stacks of
35 frames (0.6 s or more), whether the table shows 200 rows or all of them. This index
numbers every stack it has read once ("ordinal") and keeps, per function, the ordinals of
the stacks holding it (once per stack, so a recursive function counts once in a total) and
of those where it is the leaf. A window's counts laid out by ordinal then give any
function's self and total samples with one pass over its own list. For a table of the top
``limit`` functions (by self, then total), totals are summed only for the functions that can
be in it: a few hundred lists instead of every frame of every stack.

Small windows (a few stacks against a large index) are counted stack by stack as before.
"""

from __future__ import annotations

import threading
from array import array
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from itertools import chain, repeat
from operator import itemgetter

from collector.functions import FunctionSamples, count_frames
from sampler.profile import SEPARATOR

__all__ = ["FunctionIndex"]

# Reads the folded text of stacks one per line, and their ids in that order (Query.stack_lines).
LineReader = Callable[[list[int]], tuple[list[int], str]]
# A window holding at least 1/_DENSE of the known stacks is laid out over all of them.
_DENSE = 8
_STACK_BYTES = 120  # estimated per stack beyond 4 bytes a frame: its ordinal, its arrays
_FRAME_BYTES = 8  # each frame is in two arrays: the stack's and the function's


class FunctionIndex:
    """The functions of every stack read so far, by stack and by function; thread-safe.

    Bounded by ``max_bytes`` (estimated): past it, it starts over with the window at hand.
    """

    def __init__(self, read_lines: LineReader, *, max_bytes: int = 300_000_000) -> None:
        self.read_lines = read_lines
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        self._ordinals: dict[int, int] = {}  # stack id -> ordinal
        self._functions: list[array[int]] = []  # ordinal -> its distinct functions, leaf first
        self._numbers: dict[str, int] = {}  # function name (escaped) -> number
        self._names: list[str] = []  # number -> name
        self._stacks_of: list[array[int]] = []  # number -> ordinals of the stacks holding it
        self._leaf_of: list[array[int]] = []  # number -> ordinals of the stacks it ends
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._ordinals)

    def table(self, counts: Mapping[int, int], *, limit: int | None = None) -> FunctionSamples:
        """Counts each function's self and total samples in a window (counts by stack id).

        With a ``limit``, totals are given only for the functions that can rank among the
        top ``limit`` by self samples then total (what webui.model.top_functions shows).
        """
        ids, values = list(counts), list(counts.values())
        if values and min(values) <= 0:
            ids = [sid for sid, count in counts.items() if count > 0]
            values = [counts[sid] for sid in ids]
        with self._lock:
            ordinals = list(map(self._ordinals.get, ids))
            if None in ordinals:
                self._learn(ids)
                ordinals = list(map(self._ordinals.__getitem__, ids))
            if len(ids) * _DENSE < len(self._ordinals):
                return self._by_stack(ordinals, values)
            return self._by_function(ordinals, values, limit)

    def warm(self, ids: Sequence[int], *, share: float = 0.8) -> bool:
        """Reads and numbers the stacks it lacks, in the order given, as far as they fit in
        ``share`` of the bound (never starting over); tells whether they all did."""
        with self._lock:
            found, texts = self._read(ids)
            room = share * self.max_bytes - self._bytes
            fitting = 0
            for text in texts:
                room -= _STACK_BYTES + _FRAME_BYTES * (text.count(";") + 1)
                if room < 0:
                    break
                fitting += 1
            self._add(found[:fitting], texts[:fitting])
            return fitting == len(found)

    def _learn(self, ids: Sequence[int]) -> None:
        found, texts = self._read(ids)
        if self._add(found, texts) > self.max_bytes:
            self._clear()  # start over with this window's stacks
            self._add(*self._read(ids))

    def _read(self, ids: Sequence[int]) -> tuple[list[int], list[str]]:
        """Reads the text of the stacks of ``ids`` it lacks."""
        known = self._ordinals
        new = [sid for sid in ids if sid not in known]
        if not new:
            return [], []
        new = list(dict.fromkeys(new))
        found, lines = self.read_lines(new)
        texts = lines.split("\n") if found else []
        missing = sorted(set(new) - set(found))
        return found + missing, texts + [f"[unknown stack {sid}]" for sid in missing]

    def _add(self, found: list[int], texts: list[str]) -> int:
        """Numbers stacks and their functions; returns the estimated bytes held then.

        Written for speed (a warm-up adds 200,000 stacks of 35 frames): the loops over
        frames are builtins (map, chain), each stack's frames are looked up at once.
        """
        numbers, names = self._numbers, self._names
        stacks_of, leaf_of, functions = self._stacks_of, self._leaf_of, self._functions
        first = len(functions)
        for text in texts:
            parts = text.split(SEPARATOR)
            parts.reverse()
            distinct = dict.fromkeys(parts)
            if not distinct.keys() <= numbers.keys():
                for name in distinct:
                    if name not in numbers:
                        numbers[name] = len(names)
                        names.append(name)
                        stacks_of.append(array("i"))
                        leaf_of.append(array("i"))
            functions.append(array("i", map(numbers.__getitem__, distinct)))
        added = functions[first:]
        ordinals = range(first, len(functions))
        self._ordinals.update(zip(found, ordinals, strict=True))
        lengths = list(map(len, added))
        deque(
            map(
                array.append,
                map(stacks_of.__getitem__, chain.from_iterable(added)),
                chain.from_iterable(map(repeat, ordinals, lengths)),
            ),
            maxlen=0,
        )
        leaves = map(leaf_of.__getitem__, map(itemgetter(0), added))
        deque(map(array.append, leaves, ordinals), maxlen=0)
        self._bytes += _STACK_BYTES * len(added) + _FRAME_BYTES * sum(lengths)
        return self._bytes

    def _by_stack(self, ordinals: list[int], values: list[int]) -> FunctionSamples:
        """Counts a small window's functions stack by stack."""
        counted = count_frames([self._functions[o] for o in ordinals], values)
        return self._named(counted.self_counts, counted.totals, counted.total)

    def _by_function(
        self, ordinals: list[int], values: list[int], limit: int | None
    ) -> FunctionSamples:
        """Counts a large window's functions function by function, over its counts laid out
        by ordinal."""
        dense = [0] * len(self._functions)
        deque(map(dense.__setitem__, ordinals, values), maxlen=0)
        at = dense.__getitem__
        self_counts = {
            number: total
            for number, leaves in enumerate(self._leaf_of)
            if leaves and (total := sum(map(at, leaves)))
        }
        self_counts.pop(self._numbers.get("", -1), None)  # the empty stack: no function
        if limit is not None and len(self_counts) > limit:
            # The limit-th largest self count: a function with less cannot rank among the top.
            threshold = sorted(self_counts.values(), reverse=True)[limit - 1]
            candidates = [n for n, count in self_counts.items() if count >= threshold]
        else:
            candidates = range(len(self._names))
        totals = {}
        for number in candidates:
            total = sum(map(at, self._stacks_of[number]))
            if total:
                totals[number] = total
        return self._named(self_counts, totals, sum(values))

    def _named(self, self_counts: dict, totals: dict, total: int) -> FunctionSamples:
        names = self._names
        named_self = {names[n]: c for n, c in self_counts.items() if names[n]}
        named_totals = {names[n]: c for n, c in totals.items() if names[n]}
        return FunctionSamples(named_self, named_totals, total)
