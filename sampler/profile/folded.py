"""Folded-stack text: one ``frame;frame count`` line per stack, as flamegraph.pl reads it."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from .frames import NO_FRAMES, SEPARATOR

__all__ = ["FoldedFormatError", "format_folded", "parse_folded"]


# What may follow a line's count: spaces, tabs, and the \r of a \r\n line end.
_TRAILING = " \t\r"


class FoldedFormatError(ValueError):
    """A folded-stack text is malformed; the message names the line."""


def format_folded(counts: Mapping[str, int]) -> str:
    """Renders counts as folded-stack text, one ``stack count`` line each, sorted by stack."""
    return "".join(f"{stack} {count}\n" for stack, count in sorted(counts.items()) if count > 0)


def parse_folded(
    text: str,
    *,
    max_lines: int | None = None,
    strict: bool = True,
    frame: Callable[[str], str] | None = None,
) -> dict[str, int]:
    """Parses folded-stack text into counts, summing repeated stacks.

    A line splits on its last space (frames may hold spaces, even at their ends). Lines end
    at ``\n`` only (a frame may hold any other line separator Unicode knows: only control
    characters are escaped); a ``\r`` and spaces after the count are ignored. Blank lines
    are skipped; a count with no stack (py-spy writes them for samples that caught no Python
    frame) counts under ``[no frames]``. Raises FoldedFormatError naming the first bad line,
    or with ``strict=False`` skips it. ``frame``, when given, renames every frame (another
    tool's names into the wire format's), stacks that become the same being summed.
    """
    counts: dict[str, int] = {}
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the last line's end
    for number, line in enumerate(lines, 1):
        if max_lines is not None and number > max_lines:
            raise FoldedFormatError(f"more than {max_lines} lines")
        line = line.rstrip(_TRAILING)
        if not line.strip(_TRAILING):
            continue
        stack, sep, count_text = line.rpartition(" ")
        whole = count_text.isascii() and count_text.isdigit()
        if whole and not stack:
            stack, sep = NO_FRAMES, " "
        if not sep or not stack or not whole:
            if strict:
                raise FoldedFormatError(_problem(number, line, bool(sep and stack), count_text))
            continue
        if frame is not None:
            stack = SEPARATOR.join(map(frame, stack.split(SEPARATOR)))
        counts[stack] = counts.get(stack, 0) + int(count_text)
    return counts


def _problem(number: int, line: str, has_stack: bool, count_text: str) -> str:
    if not has_stack:
        return f"line {number}: expected 'frame;frame count', got {line[:80]!r}"
    return f"line {number}: count {count_text[:20]!r} is not a whole number"
