"""The sort order of every stack the web UI has read, kept between requests.

Pruning a profile into a call tree needs its stacks sorted (see sampler.profile.SortedStacks), and
sorting 200,000 stacks of folded text takes most of a second: the text is ~100 MB. Stack ids
never change meaning (they are hashes of the text), so the index sorts each stack once, when
it is first read, and a window's stacks are then put in order by sorting small integers.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate, compress, repeat
from operator import itemgetter

from collector.functions import FunctionSamples, count_frames
from collector.query import unknown_stack
from sampler.profile import (
    SORT_SEPARATOR,
    Bounds,
    SortedStacks,
    folded_of,
    sort_key,
)

from .linesort import in_order, keys_in_order, merged, spread

__all__ = ["StackIndex"]

# Reads the folded text of stacks, one per line, and their ids in the same order (ids it does
# not know may be left out): see collector's Query.stack_lines.
LineReader = Callable[[list[int]], tuple[list[int], str]]
# A window holding at least 1/_SPREAD of the known stacks is put in order by spreading its
# counts over all of them, which costs less than sorting it.
_SPREAD = 8
# Memory estimates, in bytes, beyond the text: per stack in the order (its key's header, two
# list slots, its id, its rank's dict entry, and one remembered node boundary), and per
# stack's cached frames.
_STACK_OVERHEAD = 420
_FRAMES_OVERHEAD = 150
# Node boundaries remembered (see sampler.profile.Bounds), ~220 bytes each: one per stack in the
# order (counted in _STACK_OVERHEAD), and at least this many.
_MIN_BOUNDS = 50_000
# The longest a request waits for a saved index being loaded (it takes ~0.25 s per 200,000
# stacks) before reading what it lacks itself.
LOAD_WAIT = 10.0
# How the key of a stack the store lacked begins (collector.query.unknown_stack).
_PLACEHOLDER = unknown_stack(0).removesuffix("0]")


_State = tuple[list[str], list[int], dict[int, int], Bounds]


class StackIndex:
    """Sort keys of known stacks in order, with each stack id's rank; thread-safe.

    Bounded by ``max_bytes``, estimated (text counted as one byte a character): past it the
    cached frames go first, then the order starts over with the stacks of the read at hand
    (a single window larger than the bound is still served, and then held alone).
    """

    def __init__(self, read_lines: LineReader, *, max_bytes: int = 300_000_000) -> None:
        self.read_lines = read_lines
        self.max_bytes = max_bytes
        self._lock = threading.RLock()
        # (keys in order, their stack ids, stack id -> position, the node boundaries found in
        # the keys): replaced whole, never changed in place, so readers take no lock.
        no_keys: list[str] = []  # the bounds must belong to these very keys (pruning checks)
        self._state: _State = (no_keys, [], {}, Bounds(no_keys))
        self._bytes = 0
        # Stack id -> its distinct frames, leaf first (one string object per frame name),
        # made the first time a function table needs them. Replaced, never cleared in place.
        self._frames: dict[int, tuple[str, ...]] = {}
        self._frame_names: dict[str, str] = {}
        self._frame_bytes = 0
        # Counts changes of the order (stacks learned, or a start over): a saved copy of an
        # index is current while this has not moved (webui.indexfile).
        self.generation = 0
        # Clear while a saved index is being loaded: a request that lacks stacks waits for
        # the load (up to LOAD_WAIT seconds) rather than read them all from the store itself.
        self._loaded = threading.Event()
        self._loaded.set()

    def __len__(self) -> int:
        return len(self._state[0])

    def known(self) -> tuple[list[str], list[int]]:
        """Returns the sort keys of the stacks known, in order, and their ids (do not modify
        them: they are the index's own, replaced whole as it learns)."""
        keys, ids, _, _ = self._state
        return keys, ids

    def keys_of(self, ids: list[int]) -> tuple[list[int], list[str]]:
        """Returns those of ``ids`` it knows and their sort keys, without reading anything:
        the function index asks here before the store. Placeholders of stacks the store
        lacked are left out (asked of the store again)."""
        keys, _, rank, _ = self._state
        known = [sid for sid in ids if sid in rank]
        found = [keys[rank[sid]] for sid in known]
        if any(map(str.startswith, found, repeat(_PLACEHOLDER))):
            kept = [i for i, sid in enumerate(known) if found[i] != unknown_stack(sid)]
            known, found = [known[i] for i in kept], [found[i] for i in kept]
        return known, found

    def saved_form(self) -> tuple[list[str], list[int]]:
        """Returns what load() takes: known() without the stacks the store did not have
        (named by a placeholder, which must not outlive this process)."""
        keys, ids = self.known()
        unknown = {
            i
            for i, key in enumerate(keys)
            if key.startswith(_PLACEHOLDER) and key == unknown_stack(ids[i])
        }
        if unknown:
            keys = [key for i, key in enumerate(keys) if i not in unknown]
            ids = [sid for i, sid in enumerate(ids) if i not in unknown]
        return keys, ids

    def loading(self) -> None:
        """Marks a saved index as being loaded: requests that lack stacks wait for load()
        (or loaded()) rather than read them from the store."""
        self._loaded.clear()

    def loaded(self) -> None:
        """Marks the load as over (done or failed)."""
        self._loaded.set()

    def load(self, keys: list[str], ids: list[int], *, share: float = 0.5) -> int:
        """Adds stacks whose sort keys are known already (in order: a saved index), as far as
        they fit in ``share`` of the bound, never making room for them; returns how many."""
        if len(keys) != len(ids):
            raise ValueError(f"{len(keys)} keys for {len(ids)} ids")

        def given(wanted: list[int]) -> tuple[list[str], list[int]]:
            if len(wanted) == len(ids):
                return keys, ids
            missing = set(wanted)
            pairs = [(key, sid) for key, sid in zip(keys, ids, strict=True) if sid in missing]
            return [key for key, _ in pairs], [sid for _, sid in pairs]

        try:
            with self._lock:
                if len(self) or self._frame_bytes:
                    return self._add_within(ids, given, share)[0]
                # Empty, as at a start: the keys that fit are a prefix of them, found by
                # bisection over their sizes (a Python loop over 200,000 costs 0.2 s).
                room = share * self.max_bytes
                chars = list(accumulate(map(len, keys)))
                fit = bisect_right(
                    range(1, len(keys) + 1), room, key=lambda n: chars[n - 1] + _STACK_OVERHEAD * n
                )
                if fit:
                    self._merge([], [], keys[:fit], ids[:fit], chars=chars[fit - 1])
                return fit
        finally:
            self.loaded()

    def arrange(self, profiles: Sequence[Mapping[int, int]]) -> SortedStacks:
        """Returns the stacks of these profiles (counts by stack id) in sort order; stacks
        the index knows may come with no samples."""
        if len(profiles) == 1:
            laid_out = self._laid_out(profiles[0])
            if laid_out is not None:
                return laid_out
        # Few passes over the window, each one a builtin: this runs over every distinct stack.
        if len(profiles) == 1:
            ids = list(profiles[0])
            values = [list(profiles[0].values())]
        else:
            ids = list(set().union(*profiles))
            zeros = [0] * len(ids)
            values = [list(map(p.get, ids, zeros)) for p in profiles]
        keys, _, rank, bounds = self._state
        try:
            ranks = _look_up(rank, ids)
        except KeyError:
            self._loaded.wait(LOAD_WAIT)
            keys, _, rank, bounds = self._learn(ids)
            ranks = _look_up(rank, ids)
        if len(keys) <= _SPREAD * len(ids):
            # Most known stacks are in the window: spread its counts over all of them in order
            # (those it lacks stay at zero) rather than sort the window; the tree is then built
            # over the index's own keys, whose node boundaries it remembers.
            spread_values = []
            for v in values:
                dense = [0] * len(keys)
                deque(map(dense.__setitem__, ranks, v), maxlen=0)
                spread_values.append(dense)
            return SortedStacks(keys, spread_values, bounds)
        order = sorted(range(len(ids)), key=ranks.__getitem__)
        return SortedStacks(
            list(map(keys.__getitem__, map(ranks.__getitem__, order))),
            [list(map(v.__getitem__, order)) for v in values],
        )

    def _laid_out(self, profile: Mapping[int, int]) -> SortedStacks | None:
        """The common case, in C where built: one profile holding most of what the index
        knows (learned first, if it lacks some), its counts laid over the index's keys; None
        otherwise."""
        counts = profile if isinstance(profile, dict) else dict(profile)
        for learned in (False, True):
            keys, _, rank, bounds = self._state
            if len(keys) > _SPREAD * len(counts):
                return None
            try:
                dense = spread(rank, counts, len(keys))
            except KeyError:
                if learned:
                    return None
                self._loaded.wait(LOAD_WAIT)
                self._learn(list(counts))
                continue
            return None if dense is None else SortedStacks(keys, [dense], bounds)
        return None

    def folded(self, counts: Mapping[int, int]) -> dict[str, int]:
        """Returns a profile of counts by stack id as folded counts."""
        stacks = self.arrange([counts])
        values = stacks.values[0]
        return dict(
            zip(map(folded_of, compress(stacks.keys, values)), filter(None, values), strict=True)
        )

    def function_samples(self, counts: Mapping[int, int]) -> FunctionSamples:
        """Counts each frame's self and total samples in a profile of counts by stack id
        (escaped names; a frame counts once per stack in its total)."""
        ids = [sid for sid, count in counts.items() if count > 0]
        return count_frames(self._frames_of(ids), list(map(counts.__getitem__, ids)))

    def warm(
        self,
        ids: Sequence[int],
        *,
        share: float = 0.5,
        chunk: int = 50_000,
        stop: Callable[[], bool] = lambda: False,
    ) -> tuple[int, bool]:
        """Learns the stacks of ``ids`` it lacks, in the order given, as far as they fit in
        ``share`` of the bound, never making room for them. Returns how many it learned, and
        whether there may be room for more.

        Reads ``chunk`` stacks at a time, so a request that needs the index waits for one
        chunk at most; ``stop`` is asked between chunks.
        """
        learned = 0
        for i in range(0, len(ids), chunk):
            if stop():
                break
            added, fitted = self._learn_within(ids[i : i + chunk], share)
            learned += added
            if not fitted:
                return learned, False
        return learned, True

    def _frames_of(self, ids: list[int]) -> list[tuple[str, ...]]:
        cache = self._frames
        found = list(map(cache.get, ids))
        if None not in found:
            return found  # type: ignore[return-value]
        self._loaded.wait(LOAD_WAIT)  # before the lock, which the load takes
        with self._lock:
            keys, _, rank, _ = self._state
            if not all(map(rank.__contains__, ids)):
                keys, _, rank, _ = self._learn(ids)  # the lock is reentrant
            if self._bytes + self._frame_bytes > self.max_bytes:
                self._drop_frames()
            cache, names = self._frames, self._frame_names
            missing = [sid for sid in ids if sid not in cache]
            for sid in missing:
                parts = keys[rank[sid]].split(SORT_SEPARATOR)
                parts.reverse()
                cache[sid] = stack = tuple(dict.fromkeys(map(names.setdefault, parts, parts)))
                self._frame_bytes += _FRAMES_OVERHEAD + 8 * len(stack)
            return [cache[sid] for sid in ids]

    def _drop_frames(self) -> None:
        self._frames, self._frame_names, self._frame_bytes = {}, {}, 0

    def _read(self, ids: list[int]) -> tuple[list[str], list[int], int]:
        """Reads the text of ``ids``: their sort keys and ids, in order, and the keys'
        characters in all."""
        found, lines = self.read_lines(ids)
        # The keys are as long as the lines (escaped control characters aside: it is an
        # estimate), every character but the newlines between them.
        chars = len(lines) - max(len(found) - 1, 0)
        keys, found = keys_in_order(lines, found)
        if len(found) < len(ids):
            known = set(found)
            missing = [sid for sid in ids if sid not in known]
            placeholders = [sort_key(unknown_stack(sid)) for sid in missing]
            chars += sum(map(len, placeholders))
            keys, found = merged(keys, found, *in_order(placeholders, missing))
        return keys, found, chars

    def _learn(self, ids: list[int]) -> _State:
        """Adds the stacks of ``ids`` it lacks, making room for them past the bound."""
        with self._lock:
            keys, known_ids, rank, _ = self._state
            missing = [sid for sid in ids if sid not in rank]
            if not missing:
                return self._state  # another thread (or a load) learned them meanwhile
            new_keys, new_ids, chars = self._read(missing)
            added = chars + _STACK_OVERHEAD * len(new_keys)
            if self._bytes + self._frame_bytes + added > self.max_bytes:
                self._drop_frames()
            if self._bytes + added > self.max_bytes and keys:
                # Start over with this read's stacks only, keeping the keys known already.
                kept = [sid for sid in ids if sid in rank]
                keys, known_ids = in_order([keys[rank[sid]] for sid in kept], kept)
                self._bytes = sum(map(len, keys)) + _STACK_OVERHEAD * len(keys)
            return self._merge(keys, known_ids, new_keys, new_ids, chars=chars)

    def _learn_within(self, ids: Sequence[int], share: float) -> tuple[int, bool]:
        """Adds the stacks of ``ids`` it lacks, in the order given, while they fit in
        ``share`` of the bound (frames included); returns how many, and whether all fitted."""
        return self._add_within(ids, lambda wanted: self._read(wanted)[:2], share)

    def _add_within(
        self,
        ids: Sequence[int],
        read: Callable[[list[int]], tuple[list[str], list[int]]],
        share: float,
    ) -> tuple[int, bool]:
        """Adds the stacks of ``ids`` it lacks, their sort keys in order from ``read``, as
        _learn_within() describes. Reads without the lock: a request lacking stacks meanwhile
        learns them itself rather than wait for this read (a warm-up's chunk: ~0.1 s)."""
        with self._lock:
            rank = self._state[2]
            wanted = [sid for sid in dict.fromkeys(ids) if sid not in rank]
            room = self._room(share)
            if not wanted:
                return 0, room > 0
            if not self._fits_one(room):
                return 0, False
        new_keys, new_ids = read(wanted)
        with self._lock:
            keys, known_ids, rank, _ = self._state  # as others left it meanwhile
            room = self._room(share)
            if not self._fits_one(room):
                return 0, False
            size = dict(zip(new_ids, [len(key) + _STACK_OVERHEAD for key in new_keys], strict=True))
            fits = set()
            fitted = True
            for sid in wanted:
                if sid in rank:
                    continue  # learned meanwhile
                room -= size[sid]
                if room < 0:
                    fitted = False
                    break
                fits.add(sid)
            if len(fits) < len(new_ids):
                new_keys = [key for key, sid in zip(new_keys, new_ids, strict=True) if sid in fits]
                new_ids = [sid for sid in new_ids if sid in fits]
            if new_keys:
                self._merge(keys, known_ids, new_keys, new_ids)
            return len(new_keys), fitted

    def _room(self, share: float) -> float:
        """Bytes left within ``share`` of the bound (frames included)."""
        return min(share * self.max_bytes, self.max_bytes - self._frame_bytes) - self._bytes

    def _fits_one(self, room: float) -> bool:
        """Whether ``room`` holds a stack of the usual size."""
        keys = self._state[0]
        return room > 0 and (not keys or room >= self._bytes / len(keys))

    def _merge(
        self,
        keys: list[str],
        ids: list[int],
        new_keys: list[str],
        new_ids: list[int],
        *,
        chars: int | None = None,
    ) -> _State:
        """Makes the state hold these keys and new ones (both in order), and counts the new
        (``chars``: their length, if known)."""
        if chars is None:
            chars = sum(map(len, new_keys))
        self._bytes += chars + _STACK_OVERHEAD * len(new_keys)
        self.generation += 1
        if keys:
            keys, ids = merged(keys, ids, new_keys, new_ids)
        else:
            keys, ids = new_keys, new_ids
        self._state = (
            keys,
            ids,
            dict(zip(ids, range(len(ids)), strict=True)),
            Bounds(keys, max(_MIN_BOUNDS, len(keys))),
        )
        return self._state


def _look_up(mapping: Mapping[int, int], keys: list[int]) -> Sequence[int]:
    """Returns ``mapping[key]`` for each key (KeyError if one is missing), in one call of a
    builtin: a third faster than mapping ``__getitem__`` over them."""
    if len(keys) < 2:
        return [mapping[key] for key in keys]
    found: tuple[int, ...] = itemgetter(*keys)(mapping)
    return found
