"""Stacks read from the store, one per line, made into sort keys in order; sorted runs merged.

Most of a fresh server's first view of a large window is spent here: 200,000 stacks are ~100
MB of text to cut into keys and sort. The sampler's C extension does it in ~60% of the time
of the Python below (which it falls back to where the extension is not built, or the text
has characters past Latin-1), and sorts without holding the interpreter; tests hold the two to
the same keys and ids. Merging many new keys into known ones is done there too (~25 against
~115 ms for 50,000 into 150,000), and laying a window's counts over the index's keys.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from sampler.profile import sort_keys_of_lines

__all__ = ["in_order", "keys_in_order", "merged", "spread"]

# New keys fewer than 1/_FEW of the known are merged in by bisection rather than by sorting.
_FEW = 16


def keys_in_order(lines: str, ids: list[int]) -> tuple[list[str], list[int]]:
    """Returns the sort keys of stacks given one per line, with ``ids`` (theirs, in the same
    order), both in the keys' order. ValueError when lines and ids are not as many."""
    native = _native()
    if native is not None:
        done: tuple[list[str], list[int]] | None = native.sort_lines(lines, ids)
        if done is not None:
            return done
    return in_order(sort_keys_of_lines(lines, len(ids)), ids)


def in_order(keys: list[str], ids: list[int]) -> tuple[list[str], list[int]]:
    """Sorts keys, and their ids along with them."""
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return list(map(keys.__getitem__, order)), list(map(ids.__getitem__, order))


def merged(
    keys: list[str], ids: list[int], new_keys: list[str], new_ids: list[int]
) -> tuple[list[str], list[int]]:
    """Merges two sorted runs of keys, and their ids along with them."""
    if len(new_keys) * _FEW > len(keys):
        native = _native()
        if native is not None:
            done: tuple[list[str], list[int]] = native.merge_sorted(keys, ids, new_keys, new_ids)
            return done
        return in_order(keys + new_keys, ids + new_ids)  # the sort merges two runs in a pass
    # Few new keys, as a window of a live fleet brings: each is put in place by bisection and
    # the runs between are copied in slices, rather than calling a sort key 200,000 times.
    out_keys: list[str] = []
    out_ids: list[int] = []
    done = 0
    for key, sid in zip(new_keys, new_ids, strict=True):
        at = bisect_right(keys, key, done)
        out_keys += keys[done:at]
        out_ids += ids[done:at]
        out_keys.append(key)
        out_ids.append(sid)
        done = at
    out_keys += keys[done:]
    out_ids += ids[done:]
    return out_keys, out_ids


def spread(rank: dict[int, int], counts: dict[int, int], size: int) -> list[int] | None:
    """Returns ``size`` zeros with each count of ``counts`` (by stack id) at its id's position
    in ``rank``, in the sampler's C extension (~10 against ~90 ms for 200,000 stacks: no lists
    of ids and values made on the way); None where it is not built. KeyError when an id has
    no position."""
    native = _native()
    if native is None:
        return None
    dense: list[int] | None = native.spread_counts(rank, counts, size)
    if dense is None:
        raise KeyError("a stack the index does not know")
    return dense


def _native() -> Any:
    """The sampler's C extension, where it is built with these; else None."""
    try:
        from sampler import _native
    except ImportError:
        return None
    return _native if hasattr(_native, "spread_counts") else None
