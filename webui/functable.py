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
How stacks' functions are numbered and filed is in webui.functable_numbering (the Python
loops, or the sampler's C extension); the index's saved form, in webui.functable_saved.
"""

from __future__ import annotations

import logging
import threading
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate

from collector.functions import FunctionSamples, count_frames
from collector.query import unknown_stack
from sampler.profile import SORT_SEPARATOR, sort_key, sort_keys_of_lines
from webui import functable_numbering as numbering
from webui.functable_saved import (
    SavedFunctions,
    check_saved,
    joined,
    saved_functions,
    saved_lists,
    split,
)

__all__ = ["FunctionIndex"]

_log = logging.getLogger(__name__)

# Reads the folded text of stacks one per line, and their ids in that order (Query.stack_lines).
LineReader = Callable[[list[int]], tuple[list[int], str]]
# Gives the sort keys of the stacks of some ids that it knows, and their ids (StackIndex.keys_of).
KeyReader = Callable[[list[int]], tuple[list[int], list[str]]]
# A window holding at least 1/_DENSE of the known stacks is laid out over all of them.
_DENSE = 8
_STACK_BYTES = 120  # estimated per stack beyond 4 bytes a frame: its ordinal, its arrays
_FRAME_BYTES = 8  # each frame is in two arrays: the stack's and the function's


class FunctionIndex:
    """The functions of every stack read so far, by stack and by function; thread-safe.

    Bounded by ``max_bytes`` (estimated): past it, it starts over with the window at hand.
    """

    def __init__(
        self,
        read_lines: LineReader,
        *,
        max_bytes: int = 300_000_000,
        known_keys: KeyReader | None = None,
    ) -> None:
        self.read_lines = read_lines
        # The stack index's keys, read before the store: a table after a view, or warming
        # functions after stacks, reads no text twice (100 MB for 200,000 stacks).
        self.known_keys = known_keys
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        # Counts changes (stacks numbered, a start over): a saved copy is current while this
        # has not moved (webui.indexfile).
        self.generation = 0
        # Reads saved functions to load before numbering any stack (see defer_load), and
        # the share of the bound they may take.
        self._pending: tuple[Callable[[], SavedFunctions | None], float] | None = None
        self.loaded = 0  # stacks whose functions were loaded rather than numbered
        self.native = numbering.native_functions()  # None: the Python loops (tests set it so)
        self._clear()

    def _clear(self) -> None:
        self._ordinals: dict[int, int] = {}  # stack id -> ordinal
        self._functions: list[array[int]] = []  # ordinal -> its distinct functions, leaf first
        self._numbers: dict[str, int] = {}  # function name (escaped) -> number
        self._names: list[str] = []  # number -> name
        self._stacks_of: list[array[int]] = []  # number -> ordinals of the stacks holding it
        self._leaf_of: list[array[int]] = []  # number -> ordinals of the stacks it ends
        self._bytes = 0
        self.generation += 1

    def __len__(self) -> int:
        return len(self._ordinals)

    def table(
        self,
        counts: Mapping[int, int],
        *,
        limit: int | None = None,
        match: Callable[[str], bool] | None = None,
    ) -> FunctionSamples:
        """Counts each function's self and total samples in a window (counts by stack id).

        With a ``limit``, totals are given only for the functions that can rank among the
        top ``limit`` by self samples then total (what webui.model.top_functions shows).
        With ``match`` (told an escaped name), only the functions it accepts are counted,
        every one of them with its total: a search finds callers with no self samples too.
        """
        ids, values = list(counts), list(counts.values())
        if values and min(values) <= 0:
            ids = [sid for sid, count in counts.items() if count > 0]
            values = [counts[sid] for sid in ids]
        with self._lock:
            if self._pending is not None:
                self._load_pending()
            try:
                return self._table(ids, values, limit, match)
            except IndexError:
                if not self.loaded:
                    raise
                # Only loaded arrays can point past the end (their checks are not exhaustive:
                # see _load): numbered anew from the text.
                _log.warning("the saved function index did not hold together: numbering anew")
                self._clear()
                self.loaded = 0
                return self._table(ids, values, limit, match)

    def _table(
        self,
        ids: list[int],
        values: list[int],
        limit: int | None,
        match: Callable[[str], bool] | None,
    ) -> FunctionSamples:
        ordinals = list(map(self._ordinals.get, ids))
        if None in ordinals:
            self._learn(ids)
            ordinals = list(map(self._ordinals.__getitem__, ids))
        if len(ids) * _DENSE < len(self._ordinals):
            return self._by_stack(ordinals, values, match)
        return self._by_function(ordinals, values, limit, match)

    def warm(self, ids: Sequence[int], *, share: float = 0.8) -> bool:
        """Reads and numbers the stacks it lacks, in the order given, as far as they fit in
        ``share`` of the bound (never starting over); tells whether they all did."""
        with self._lock:
            if self._pending is not None:
                self._load_pending()
            found, texts = self._read(ids)
            room = share * self.max_bytes - self._bytes
            fitting = 0
            for text in texts:
                room -= _STACK_BYTES + _FRAME_BYTES * (text.count(SORT_SEPARATOR) + 1)
                if room < 0:
                    break
                fitting += 1
            self._add(found[:fitting], texts[:fitting])
            return fitting == len(found)

    def defer_load(self, read: Callable[[], SavedFunctions | None], share: float) -> None:
        """Has the first table or warm-up to come load saved functions (``read()``, None if
        there are none) into ``share`` of the bound before numbering any stack: a load takes
        a fraction of numbering, and done then, it takes nothing from a view's graph."""
        with self._lock:
            self._pending = (read, share)

    def _load_pending(self) -> int:
        pending, self._pending = self._pending, None
        if pending is None:
            return 0
        read, share = pending
        saved = read()
        if saved is None:
            return 0
        try:
            return self._load(saved, share)
        except (ValueError, IndexError) as exc:  # a file that does not hold together
            _log.warning("could not load the saved function index (numbering anew): %s", exc)
            return 0

    def saved_form(self) -> SavedFunctions:
        """Returns what load() takes. Stacks the store did not have (named by a placeholder)
        are left out, and then so are the lists of stacks by function (load rebuilds them)."""
        with self._lock:  # the lists only grow, and the stacks' arrays never change
            ids = list(self._ordinals)  # in the order of their ordinals
            functions = list(self._functions)
            names = list(self._names)
            # The functions' arrays do grow: copied whole, here.
            by_function = [joined(self._stacks_of), array("i", map(len, self._stacks_of))]
            by_function += [joined(self._leaf_of), array("i", map(len, self._leaf_of))]
        return saved_functions(ids, functions, names, by_function)

    def load(self, saved: SavedFunctions, *, share: float = 0.8) -> int:
        """Adds saved functions (see saved_form) to an empty index, as many stacks as fit in
        ``share`` of the bound; returns how many. Raises ValueError if they do not hold
        together (then nothing is added)."""
        with self._lock:
            return self._load(saved, share)

    def _load(self, saved: SavedFunctions, share: float) -> int:
        ids, lengths, numbers, names = saved.ids, saved.lengths, saved.numbers, saved.names
        if self._ordinals:
            return 0
        check_saved(saved)
        ends = list(accumulate(lengths))
        fit = bisect_right(
            range(1, len(ids) + 1),
            share * self.max_bytes,
            key=lambda n: _STACK_BYTES * n + _FRAME_BYTES * ends[n - 1],
        )
        try:
            self._names = list(names)
            self._numbers = dict(zip(names, range(len(names)), strict=True))
            self._functions = split(numbers, ends[:fit])
            if fit == len(ids) and len(saved.stack_counts) == len(names):
                # The saved lists of stacks by function, as they were.
                self._stacks_of, self._leaf_of = saved_lists(saved)
                self._ordinals = dict(zip(ids, range(len(ids)), strict=True))
                self._bytes = _STACK_BYTES * len(ids) + _FRAME_BYTES * len(numbers)
                self.generation += 1
            else:  # filed anew: some did not fit, or the lists were not saved
                self._stacks_of = [array("i") for _ in names]
                self._leaf_of = [array("i") for _ in names]
                self._file(ids[:fit], 0)
        except BaseException:
            self._clear()
            raise
        self.loaded = fit
        return fit

    def _learn(self, ids: Sequence[int]) -> None:
        found, texts = self._read(ids)
        if self._add(found, texts) > self.max_bytes:
            self._clear()  # start over with this window's stacks
            self._add(*self._read(ids))

    def _read(self, ids: Sequence[int]) -> tuple[list[int], list[str]]:
        """Returns the stacks of ``ids`` it lacks, in the order given, and their sort keys
        (frames joined by SORT_SEPARATOR): from the stack index where it knows them, else
        read from the store (stacks the store lacks named by a placeholder)."""
        known = self._ordinals
        new = list(dict.fromkeys(sid for sid in ids if sid not in known))
        if not new:
            return [], []
        keys: dict[int, str] = {}
        if self.known_keys is not None:
            keys.update(zip(*self.known_keys(new), strict=True))
        rest = [sid for sid in new if sid not in keys] if keys else new
        if rest:
            found, lines = self.read_lines(rest)
            keys.update(zip(found, sort_keys_of_lines(lines, len(found)), strict=True))
        if len(keys) == len(new):
            return new, list(map(keys.__getitem__, new))
        return new, [keys[sid] if sid in keys else sort_key(unknown_stack(sid)) for sid in new]

    def _add(self, found: list[int], texts: list[str]) -> int:
        """Numbers stacks (their sort keys) and their functions; returns the estimated bytes
        held then."""
        first = len(self._functions)
        try:
            numbering.number_stacks(
                self.native,
                texts,
                self._numbers,
                self._names,
                self._functions,
                self._stacks_of,
                self._leaf_of,
            )
        except BaseException:
            del self._functions[first:]  # numbered, never filed: ordinals without ids
            raise
        return self._file(found, first)

    def _file(self, found: list[int], first: int) -> int:
        """Files the stacks numbered from ordinal ``first`` on (their ids ``found``) under
        their functions; returns the estimated bytes held then."""
        added = self._functions[first:]
        self._ordinals.update(zip(found, range(first, len(self._functions)), strict=True))
        numbering.file_stacks(self.native, added, first, self._stacks_of, self._leaf_of)
        self._bytes += _STACK_BYTES * len(added) + _FRAME_BYTES * sum(map(len, added))
        self.generation += 1
        return self._bytes

    def _by_stack(
        self, ordinals: list[int], values: list[int], match: Callable[[str], bool] | None
    ) -> FunctionSamples:
        """Counts a small window's functions stack by stack."""
        counted = count_frames([self._functions[o] for o in ordinals], values)
        self_counts, totals = counted.self_counts, counted.totals
        if match is not None:
            names = self._names
            totals = {n: c for n, c in totals.items() if match(names[n])}
            self_counts = {n: c for n, c in self_counts.items() if n in totals}
        return self._named(self_counts, totals, counted.total)

    def _by_function(
        self,
        ordinals: list[int],
        values: list[int],
        limit: int | None,
        match: Callable[[str], bool] | None,
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
        candidates: Iterable[int]
        if match is not None:
            candidates = [n for n, name in enumerate(self._names) if name and match(name)]
            self_counts = {n: self_counts[n] for n in candidates if n in self_counts}
        elif limit is not None and len(self_counts) > limit:
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
