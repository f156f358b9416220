"""Numbering stacks' functions for the function index, and filing stacks under them.

Each stack (its sort key: frames joined by SORT_SEPARATOR) becomes an array of its distinct
function numbers, leaf first; each function, the ordinals of the stacks holding it and of
those it ends. Where the sampler's C extension is built, its ``number_functions`` and
``file_functions`` do this ~5 times faster, in calls short enough (~10-30 ms) to let other
requests' threads in between; the Python loops here are the fallback, and give the same
results (tests hold the two to them). The arrays are the caller's (webui.functable's
FunctionIndex), changed in place.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

from sampler.profile import SORT_SEPARATOR

__all__ = ["file_stacks", "native_functions", "number_stacks"]

# Characters of stacks numbered, and stacks filed, a call of the sampler's C extension (~10-30
# ms each): calls that short let other requests' threads in between. Filing makes an object per
# function a call.
_NATIVE_CHARS = 2_500_000
_FILE_CHUNK = 50_000


def native_functions() -> Any:
    """The sampler's C extension, which numbers and files stacks ~5 times faster than the
    Python loops below (the same results: tests hold the two to them); None where it is not
    built."""
    try:
        from sampler import _native
    except ImportError:
        return None
    return _native if hasattr(_native, "file_functions") else None


def number_stacks(
    native: Any,
    texts: list[str],
    numbers: dict[str, int],
    names: list[str],
    functions: list[array[int]],
    stacks_of: list[array[int]],
    leaf_of: list[array[int]],
) -> None:
    """Numbers the stacks' functions: appends each stack's distinct function numbers to
    ``functions``, and each new name to ``numbers`` and ``names`` with an empty list in
    ``stacks_of`` and ``leaf_of``. In the sampler's C extension when ``native`` is not None.
    The Python loops are written for speed (a warm-up adds 200,000 stacks of 35 frames): the
    loops over frames are builtins (map, chain), each stack's frames are looked up at once."""
    if native is not None:
        try:
            for chunk in _chunks(texts, _NATIVE_CHARS):
                packed = native.number_functions(chunk, SORT_SEPARATOR, numbers, names)
                functions.extend(map(array, repeat("i"), packed))
        finally:
            for _ in range(len(names) - len(stacks_of)):  # the names numbered
                stacks_of.append(array("i"))
                leaf_of.append(array("i"))
        return
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


def file_stacks(
    native: Any,
    added: list[array[int]],
    first: int,
    stacks_of: list[array[int]],
    leaf_of: list[array[int]],
) -> None:
    """Files the stacks ``added`` (their function numbers; ordinals from ``first`` on) under
    their functions: in ``stacks_of`` under each, in ``leaf_of`` under their leaf. In the
    sampler's C extension when ``native`` is not None."""
    if native is not None:
        for i in range(0, len(added), _FILE_CHUNK):
            holding, ending = native.file_functions(
                added[i : i + _FILE_CHUNK], first + i, len(stacks_of)
            )
            for number, packed in holding.items():
                stacks_of[number].frombytes(packed)
            for number, packed in ending.items():
                leaf_of[number].frombytes(packed)
        return
    ordinals = range(first, first + len(added))
    deque(
        map(
            array.append,
            map(stacks_of.__getitem__, chain.from_iterable(added)),
            chain.from_iterable(map(repeat, ordinals, map(len, added))),
        ),
        maxlen=0,
    )
    leaves = map(leaf_of.__getitem__, map(itemgetter(0), added))
    deque(map(array.append, leaves, ordinals), maxlen=0)


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
