"""Folded stacks and call trees: the pure data model shared by sampler, collector and web UI.

Nothing here does I/O, keeps global state or reads a clock. A profile is a mapping from a
folded stack (frames root first, joined by ``;``) to a sample count.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "FoldedFormatError",
    "Node",
    "build_tree",
    "escape_frame",
    "format_folded",
    "merge",
    "parse_folded",
    "subtract",
    "unescape_frame",
]

Counts = dict[str, int]
NO_FRAMES = "[no frames]"

# Characters that would break a folded line: the separator, the escape character itself,
# and every control character (newlines above all); also the two characters JSON escapes, so
# a frame's JSON string is always its text in quotes.
_UNSAFE = re.compile(r'[%;"\\\x00-\x1f\x7f]')
_ESCAPED = re.compile(r"%([0-9A-F]{2})")


class FoldedFormatError(ValueError):
    """A folded-stack text is malformed; the message names the line."""


def escape_frame(name: str) -> str:
    """Returns ``name`` with ``;``, ``%``, ``"``, ``\\`` and control characters percent-escaped."""
    if _UNSAFE.search(name) is None:
        return name
    return _UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", name)


def unescape_frame(name: str) -> str:
    """Reverses :func:`escape_frame`."""
    if "%" not in name:
        return name
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), name)


def format_folded(counts: Mapping[str, int]) -> str:
    """Renders counts as folded-stack text, one ``stack count`` line each, sorted by stack."""
    return "".join(f"{stack} {count}\n" for stack, count in sorted(counts.items()) if count > 0)


def parse_folded(text: str, *, max_lines: int | None = None) -> Counts:
    """Parses folded-stack text into counts, summing repeated stacks.

    Blank lines are skipped; a count with no stack (py-spy writes them for samples that
    caught no Python frame) counts under ``[no frames]``. Raises FoldedFormatError naming the
    first bad line.
    """
    counts: Counts = {}
    for number, line in enumerate(text.splitlines(), 1):
        if max_lines is not None and number > max_lines:
            raise FoldedFormatError(f"more than {max_lines} lines")
        line = line.strip()
        if not line:
            continue
        stack, sep, count_text = line.rpartition(" ")
        if not sep and count_text.isdigit():
            stack, sep = NO_FRAMES, " "
        if not sep or not stack:
            raise FoldedFormatError(
                f"line {number}: expected 'frame;frame count', got {line[:80]!r}"
            )
        if not count_text.isdigit():
            raise FoldedFormatError(
                f"line {number}: count {count_text[:20]!r} is not a whole number"
            )
        counts[stack] = counts.get(stack, 0) + int(count_text)
    return counts


def merge(profiles: Iterable[Mapping[str, int]]) -> Counts:
    """Sums several profiles into one."""
    total: Counts = {}
    for profile in profiles:
        for stack, count in profile.items():
            total[stack] = total.get(stack, 0) + count
    return total


def subtract(after: Mapping[str, int], before: Mapping[str, int]) -> Counts:
    """Returns what ``after`` gained over ``before`` (both cumulative); never negative."""
    delta: Counts = {}
    for stack, count in after.items():
        gained = count - before.get(stack, 0)
        if gained > 0:
            delta[stack] = gained
    return delta


@dataclass
class Node:
    """One frame in a call tree: its name, inclusive samples and children by name."""

    name: str
    total: int = 0
    children: dict[str, Node] = field(default_factory=dict)

    @property
    def self_count(self) -> int:
        """Samples in this frame itself, not in its callees."""
        return self.total - sum(child.total for child in self.children.values())

    def child(self, name: str) -> Node:
        """Returns the child named ``name``, creating it if needed."""
        node = self.children.get(name)
        if node is None:
            node = self.children[name] = Node(name)
        return node

    def to_dict(self) -> dict[str, object]:
        """Renders the tree as nested ``{"name", "value", "children"}`` dicts (d3-flame-graph's shape)."""
        return {
            "name": self.name,
            "value": self.total,
            "children": [child.to_dict() for child in self.children.values()],
        }


def build_tree(counts: Mapping[str, int], root_name: str = "all") -> Node:
    """Builds the call tree of a profile; the root's total is the sum of all counts."""
    root = Node(root_name)
    for stack, count in counts.items():
        if count <= 0:
            continue
        root.total += count
        node = root
        for frame in stack.split(";"):
            node = node.child(frame)
            node.total += count
    return root
