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

import logging
import sys
import threading
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import accumulate, chain, compress, repeat
from operator import itemgetter
from typing import Any, NamedTuple

from collector.functions import FunctionSamples, count_frames
from collector.query import unknown_stack
from sampler.profile import SORT_SEPARATOR, sort_key, sort_keys_of_lines

__all__ = ["FunctionIndex", "SavedFunctions"]

_log = logging.getLogger(__name__)

# Reads the folded text of stacks one per line, and their ids in that order (Query.stack_lines).
LineReader = Callable[[list[int]], tuple[list[int], str]]
# Gives the sort keys of the stacks of some ids that it knows, and their ids (StackIndex.keys_of).
KeyReader = Callable[[list[int]], tuple[list[int], list[str]]]
# A window holding at least 1/_DENSE of the known stacks is laid out over all of them.
_DENSE = 8
_STACK_BYTES = 120  # estimated per stack beyond 4 bytes a frame: its ordinal, its arrays
_FRAME_BYTES = 8  # each frame is in two arrays: the stack's and the function's
# Characters of stacks numbered, and stacks filed, a call of the sampler's C extension (~10-30
# ms each): calls that short let other requests' threads in between. Filing makes an object per
# function a call.
_NATIVE_CHARS = 2_500_000
_FILE_CHUNK = 50_000


def _native_functions() -> Any:
    """The sampler's C extension, which numbers and files stacks ~5 times faster than the
    Python loops below (the same results: tests hold the two to them); None where it is not
    built."""
    try:
        from sampler import _native
    except ImportError:
        return None
    return _native if hasattr(_native, "file_functions") else None


class SavedFunctions(NamedTuple):
    """A function index as saved (FunctionIndex.saved_form): the stack ids in the order of
    their ordinals, the number of functions of each and their function numbers one after
    another, the functions' names by number; and by function, the ordinals of the stacks
    holding it and of those it ends, one after another, with their counts (empty when the
    load is to rebuild them)."""

    ids: list[int]
    lengths: array[int]
    numbers: array[int]
    names: list[str]
    stacks: array[int]
    stack_counts: array[int]
    leaves: array[int]
    leaf_counts: array[int]


def _negative(values: array[int]) -> bool:
    """Tells whether an array of 4-byte ints holds a negative one, from their sign bytes
    (~45 ms for 7 million, against ~180 ms for min())."""
    data = values.tobytes()
    signs = data[3::4] if sys.byteorder == "little" else data[::4]
    return bool(signs) and max(signs) >= 0x80


def _chunks(texts: list[str], chars: int) -> Iterator[list[str]]:
    """Cuts ``texts`` into runs of about ``chars`` characters (at least one text each)."""
    start = 0
    while start < len(texts):
        end, total = start, 0
        while end < len(texts) and (total < chars or end == start):
            total += len(texts[end])
            end += 1
        yield texts[start:end]
        start = end


def _joined(arrays: list[array[int]]) -> array[int]:
    """Returns one array holding these arrays of 4-byte ints one after another, joined as
    bytes: ~50x faster than an array made from their items (7 million for 200,000 stacks)."""
    joined = array("i")
    joined.frombytes(b"".join(map(array.tobytes, arrays)))
    return joined


def _split(values: array[int], ends: list[int]) -> list[array[int]]:
    """Cuts ``values`` into arrays ending at ``ends``."""
    return list(map(values.__getitem__, map(slice, [0, *ends], ends)))


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
        self.native = _native_functions()  # None: the Python loops (tests set it so)
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
            by_function = [_joined(self._stacks_of), array("i", map(len, self._stacks_of))]
            by_function += [_joined(self._leaf_of), array("i", map(len, self._leaf_of))]
        lengths = array("i", map(len, functions))
        # A placeholder is a stack's only function: only those stacks are looked at.
        alone = compress(range(len(functions)), map((1).__eq__, lengths))
        unknown = {o for o in alone if names[functions[o][0]] == unknown_stack(ids[o])}
        if unknown:
            kept = [o for o in range(len(ids)) if o not in unknown]
            ids = [ids[o] for o in kept]
            functions = [functions[o] for o in kept]
            lengths = array("i", map(len, functions))
            by_function = [array("i")] * 4  # their ordinals changed
        return SavedFunctions(ids, lengths, _joined(functions), names, *by_function)

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
        if len(lengths) != len(ids) or sum(lengths) != len(numbers):
            raise ValueError("saved functions: their counts do not add up")
        if lengths and min(lengths) < 1:
            raise ValueError("saved functions: a stack without a function")
        if len(set(names)) != len(names) or len(set(ids)) != len(ids):
            raise ValueError("saved functions: a name or a stack twice")
        # Numbers in range (what costs little to check; a number past the end that is left
        # raises IndexError in a table, which then numbers anew: see table).
        for values, end in (
            (saved.stack_counts, len(ids) + 1),
            (saved.leaf_counts, len(ids) + 1),
            (saved.leaves, len(ids)),
        ):
            if values and (min(values) < 0 or max(values) >= end):
                raise ValueError("saved functions: a number out of range")
        if _negative(numbers) or _negative(saved.stacks):
            raise ValueError("saved functions: a negative number")
        ends = list(accumulate(lengths))
        fit = bisect_right(
            range(1, len(ids) + 1),
            share * self.max_bytes,
            key=lambda n: _STACK_BYTES * n + _FRAME_BYTES * ends[n - 1],
        )
        try:
            self._names = list(names)
            self._numbers = dict(zip(names, range(len(names)), strict=True))
            self._functions = _split(numbers, ends[:fit])
            if fit == len(ids) and len(saved.stack_counts) == len(names):
                self._file_saved(ids, saved)
            else:  # filed anew: some did not fit, or the lists were not saved
                self._stacks_of = [array("i") for _ in names]
                self._leaf_of = [array("i") for _ in names]
                self._file(ids[:fit], 0)
        except BaseException:
            self._clear()
            raise
        self.loaded = fit
        return fit

    def _file_saved(self, ids: list[int], saved: SavedFunctions) -> None:
        """Takes the saved lists of stacks by function, as they were."""
        if sum(saved.stack_counts) != len(saved.stacks) or sum(saved.leaf_counts) != len(
            saved.leaves
        ):
            raise ValueError("saved functions: their stacks do not add up")
        self._stacks_of = _split(saved.stacks, list(accumulate(saved.stack_counts)))
        self._leaf_of = _split(saved.leaves, list(accumulate(saved.leaf_counts)))
        self._ordinals = dict(zip(ids, range(len(ids)), strict=True))
        self._bytes = _STACK_BYTES * len(ids) + _FRAME_BYTES * len(saved.numbers)
        self.generation += 1

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
            if self.native is not None:
                self._number_in_c(texts)
            else:
                self._number(texts)
        except BaseException:
            del self._functions[first:]  # numbered, never filed: ordinals without ids
            raise
        return self._file(found, first)

    def _number(self, texts: list[str]) -> None:
        """Numbers the stacks' functions (the Python path). Written for speed (a warm-up adds
        200,000 stacks of 35 frames): the loops over frames are builtins (map, chain), each
        stack's frames are looked up at once."""
        numbers, names = self._numbers, self._names
        stacks_of, leaf_of, functions = self._stacks_of, self._leaf_of, self._functions
        for text in texts:
            parts = text.split(SORT_SEPARATOR)
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

    def _number_in_c(self, texts: list[str]) -> None:
        """Numbers the stacks' functions as _number does, in the sampler's C extension."""
        names = self._names
        try:
            for chunk in _chunks(texts, _NATIVE_CHARS):
                packed = self.native.number_functions(chunk, SORT_SEPARATOR, self._numbers, names)
                self._functions.extend(map(array, repeat("i"), packed))
        finally:
            for _ in range(len(names) - len(self._stacks_of)):  # the names numbered
                self._stacks_of.append(array("i"))
                self._leaf_of.append(array("i"))

    def _file(self, found: list[int], first: int) -> int:
        """Files the stacks numbered from ordinal ``first`` on (their ids ``found``) under
        their functions; returns the estimated bytes held then."""
        stacks_of, leaf_of = self._stacks_of, self._leaf_of
        added = self._functions[first:]
        ordinals = range(first, len(self._functions))
        self._ordinals.update(zip(found, ordinals, strict=True))
        lengths = list(map(len, added))
        if self.native is not None:
            for i in range(0, len(added), _FILE_CHUNK):
                holding, ending = self.native.file_functions(
                    added[i : i + _FILE_CHUNK], first + i, len(stacks_of)
                )
                for number, packed in holding.items():
                    stacks_of[number].frombytes(packed)
                for number, packed in ending.items():
                    leaf_of[number].frombytes(packed)
        else:
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
