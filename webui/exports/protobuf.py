"""A tiny protocol buffers writer: just what profile.proto needs, no dependency.

Field encodings follow https://protobuf.dev/programming-guides/encoding/: varints for
integers (negative int64 as ten bytes of two's complement), length-delimited bytes for
strings, sub-messages and packed repeated integers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["Message", "varint"]

_VARINT = 0
_LENGTH_DELIMITED = 2


def varint(value: int) -> bytes:
    """Encodes an integer as a protobuf varint (int64 semantics for negative values)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class Message:
    """Accumulates the encoded fields of one message, in the order they are added."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def uint(self, field: int, value: int) -> Message:
        """Adds an integer field; zero is the default and is left out, as proto3 does."""
        if value:
            self.buffer += varint(field << 3 | _VARINT)
            self.buffer += varint(value)
        return self

    def raw(self, field: int, value: bytes) -> Message:
        """Adds a length-delimited field, even when empty (repeated strings need that)."""
        self.buffer += varint(field << 3 | _LENGTH_DELIMITED)
        self.buffer += varint(len(value))
        self.buffer += value
        return self

    def string(self, field: int, value: str) -> Message:
        """Adds a string field as UTF-8."""
        return self.raw(field, value.encode("utf-8"))

    def message(self, field: int, value: Message) -> Message:
        """Adds an embedded message."""
        return self.raw(field, bytes(value.buffer))

    def packed(
        self, field: int, values: Iterable[int], table: Sequence[bytes] | None = None
    ) -> Message:
        """Adds a packed repeated integer field; ``table[i]`` may hold ``varint(i)`` ready made."""
        if table is not None:
            payload = b"".join(map(table.__getitem__, values))
        else:
            payload = b"".join(map(varint, values))
        if payload:
            self.raw(field, payload)
        return self

    def __bytes__(self) -> bytes:
        return bytes(self.buffer)
