"""The sort order of every stack the web UI has read, kept between requests.

Pruning a profile into a call tree needs its stacks sorted (see flametree.SortedStacks), and
sorting 200,000 stacks of folded text takes most of a second: the text is ~100 MB. Stack ids
never change meaning (they are hashes of the text), so the index sorts each stack once, when
it is first read, and a window's stacks are then put in order by sorting small integers.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from itertools import compress
from operator import itemgetter

from .flametree import SortedStacks, folded_of, sort_key

__all__ = ["StackIndex"]

# Reads the folded text of stacks by id (ids it does not know may be left out).
NameReader = Callable[[list[int]], Mapping[int, str]]
# A window holding at least 1/_SPREAD of the known stacks is put in order by spreading its
# counts over all of them, which costs less than sorting it.
_SPREAD = 8


class StackIndex:
    """Sort keys of known stacks in order, with each stack id's rank; thread-safe.

    Bounded by ``max_chars`` of key text: when a read would pass it, the index starts over
    with the stacks of that read only.
    """

    def __init__(self, read_names: NameReader, *, max_chars: int = 300_000_000) -> None:
        self.read_names = read_names
        self.max_chars = max_chars
        self._lock = threading.Lock()
        # (keys in order, their stack ids, stack id -> position): replaced whole, never
        # changed in place, so readers take no lock.
        self._state: tuple[list[str], list[int], dict[int, int]] = ([], [], {})
        self._chars = 0

    def __len__(self) -> int:
        return len(self._state[0])

    def arrange(self, profiles: Sequence[Mapping[int, int]]) -> SortedStacks:
        """Returns the stacks of these profiles (counts by stack id) in sort order."""
        # Few passes over the window, each one a builtin: this runs over every distinct stack.
        if len(profiles) == 1:
            ids = list(profiles[0])
            values = [list(profiles[0].values())]
        else:
            ids = list(set().union(*profiles))
            zeros = [0] * len(ids)
            values = [list(map(p.get, ids, zeros)) for p in profiles]
        keys, _, rank = self._state
        ranks = list(map(rank.get, ids))
        if None in ranks:
            keys, _, rank = self._learn(ids)
            ranks = list(map(rank.__getitem__, ids))
        if len(keys) <= _SPREAD * len(ids):
            # Most known stacks are in the window: spread its counts over all of them in order
            # and keep the ones it has, rather than sort the window.
            spread = []
            for v in values:
                dense = [0] * len(keys)
                deque(map(dense.__setitem__, ranks, v), maxlen=0)
                spread.append(dense)
            present = spread[0] if len(spread) == 1 else list(map(any, zip(*spread, strict=True)))
            return SortedStacks(
                list(compress(keys, present)), [list(compress(d, present)) for d in spread]
            )
        order = sorted(range(len(ids)), key=ranks.__getitem__)
        return SortedStacks(
            list(map(keys.__getitem__, map(ranks.__getitem__, order))),
            [list(map(v.__getitem__, order)) for v in values],
        )

    def folded(self, counts: Mapping[int, int]) -> dict[str, int]:
        """Returns a profile of counts by stack id as folded counts."""
        stacks = self.arrange([counts])
        return dict(zip(map(folded_of, stacks.keys), stacks.values[0], strict=True))

    def _read(self, ids: list[int]) -> list[tuple[str, int]]:
        """Reads the names of ``ids``: (sort key, id) pairs in order."""
        names = self.read_names(ids)
        return sorted((sort_key(names.get(sid, f"[unknown stack {sid}]")), sid) for sid in ids)

    def _learn(self, ids: list[int]) -> tuple[list[str], list[int], dict[int, int]]:
        with self._lock:
            keys, known_ids, rank = self._state
            new = self._read([sid for sid in ids if sid not in rank])
            chars = sum(len(key) for key, _ in new)
            if self._chars + chars > self.max_chars and keys:
                # Start over with this read's stacks only (reading the known ones again).
                keys, known_ids, self._chars = [], [], 0
                new = sorted([*new, *self._read([sid for sid in ids if sid in rank])])
                chars = sum(len(key) for key, _ in new)
            # Two sorted runs: the sort merges them in one pass.
            merged = sorted([*zip(keys, known_ids, strict=True), *new]) if keys else new
            keys = list(map(itemgetter(0), merged))
            known_ids = list(map(itemgetter(1), merged))
            self._state = (
                keys,
                known_ids,
                dict(zip(known_ids, range(len(known_ids)), strict=True)),
            )
            self._chars += chars
            return self._state
