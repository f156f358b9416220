"""Integers packed into bytes: how the fleet tiers and the cursor log store arrays in a row.

Little-endian whatever the machine, so a database file or a copy (collector.migrate_db)
reads the same everywhere; ``compress`` deflates them (counts are small numbers in 8 bytes).
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Iterable

__all__ = ["pack", "unpack"]

_SWAP = sys.byteorder == "big"
# Type codes by width in bytes: 'i' is 4 bytes on every platform Python supports.
_CODES = {4: "i", 8: "q"}
assert array("i").itemsize == 4 and array("q").itemsize == 8


def pack(values: Iterable[int], size: int = 8, *, compress: bool = False) -> bytes:
    """Returns signed integers of ``size`` bytes (4 or 8) as bytes, deflated if asked."""
    packed = array(_CODES[size], values)
    if _SWAP:
        packed.byteswap()
    data = packed.tobytes()
    return zlib.compress(data, 1) if compress else data


def unpack(data: bytes, size: int = 8, *, compressed: bool = False) -> array[int]:
    """Returns the integers ``pack`` packed."""
    values = array(_CODES[size])
    values.frombytes(zlib.decompress(data) if compressed else bytes(data))
    if _SWAP:
        values.byteswap()
    return values
