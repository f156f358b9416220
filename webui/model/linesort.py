"""Stacks read from the store, one per line, made into sort keys in order.

Most of a fresh server's first view of a large window is spent here: 200,000 stacks are ~100
MB of text to cut into keys and sort. The sampler's C extension does it in ~60% of the time
of the Python below (which it falls back to where the extension is not built, or the text
has characters past Latin-1), and sorts without holding the interpreter; tests hold the two to
the same keys and ids.
"""

from __future__ import annotations

from typing import Any

from sampler.profile import sort_keys_of_lines

__all__ = ["in_order", "keys_in_order"]


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


def _native() -> Any:
    """The sampler's C extension, where it is built with sort_lines; else None."""
    try:
        from sampler import _native
    except ImportError:
        return None
    return _native if hasattr(_native, "sort_lines") else None
