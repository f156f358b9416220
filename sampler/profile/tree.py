"""The call tree: one node per frame on a path from the root, with its inclusive samples.

It is the one tree type of every room: the sampler's SVG draws it, the collector's query
returns it, and the web UI's pruned trees (pruning.py) are made of it. Merging, subtracting
and filtering trees is merging, subtracting and filtering their stacks (counts.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from .counts import Counts, filter_stacks, merge, subtract
from .frames import SEPARATOR, unescape_frame

__all__ = ["Node", "build_tree"]


class Node:
    """One frame in a call tree: its name, inclusive samples and children by name."""

    # A plain class, not a dataclass: dataclasses import inspect and compile their methods at
    # import time, about half the cost of `import sampler`.
    __slots__ = ("name", "total", "children")

    def __init__(self, name: str, total: int = 0, children: dict[str, Node] | None = None) -> None:
        self.name = name
        self.total = total
        self.children: dict[str, Node] = {} if children is None else children

    def __repr__(self) -> str:
        return f"Node({self.name!r}, total={self.total}, children={len(self.children)})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Node):
            return NotImplemented
        return (self.name, self.total) == (other.name, other.total) and sorted(
            (path, node.total) for path, node in self.walk()
        ) == sorted((path, node.total) for path, node in other.walk())

    __hash__ = None  # type: ignore[assignment]  # mutable: compared by value, never hashed

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

    def add(self, name: str, total: int) -> Node:
        """Adds a new child (one more, even when a child has that name: a pruned tree's
        ``[pruned]`` placeholder beside a real frame of that name) and returns it."""
        node = Node(name, total)
        key = name
        while key in self.children:
            key += "\x00"  # frames hold no control character: no real name is taken
        self.children[key] = node
        return node

    def walk(self) -> Iterator[tuple[tuple[str, ...], Node]]:
        """Yields every node below this one with its path of names (this node's excluded),
        parents before their children."""
        pending: list[tuple[tuple[str, ...], Node]] = [((), self)]
        while pending:
            path, node = pending.pop()
            if path:
                yield path, node
            pending.extend((path + (c.name,), c) for c in reversed(node.children.values()))

    def stacks(self) -> Counts:
        """Returns the folded counts this tree was built from (the root's own samples, those
        of the empty stack, under ``""``)."""
        counts: Counts = {}
        own = self.self_count
        if own > 0:
            counts[""] = own
        for path, node in self.walk():
            own = node.self_count
            if own > 0:
                counts[SEPARATOR.join(path)] = own
        return counts

    def merge(self, other: Node) -> Node:
        """Returns the tree of both trees' samples."""
        return build_tree(merge([self.stacks(), other.stacks()]), self.name)

    def subtract(self, other: Node) -> Node:
        """Returns the tree of what this tree has more than ``other``, stack by stack."""
        return build_tree(subtract(self.stacks(), other.stacks()), self.name)

    def filter(self, keep: Callable[[str], bool]) -> Node:
        """Returns the tree of the stacks (folded text) for which ``keep`` is true."""
        return build_tree(filter_stacks(self.stacks(), keep), self.name)

    def to_dict(self, *, unescape: bool = False) -> dict[str, object]:
        """Renders the tree as nested ``{"name", "value", "children"}`` dicts (d3-flame-graph's
        shape), frame names unescaped for display with ``unescape``."""
        name_of = unescape_frame if unescape else str

        def render(node: Node) -> tuple[dict[str, object], list[dict[str, object]]]:
            children: list[dict[str, object]] = []
            return {"name": name_of(node.name), "value": node.total, "children": children}, children

        # Iterative: a pruned tree may be a chain thousands of frames deep.
        top, children = render(self)
        pending = [(self, children)]
        while pending:
            node, into = pending.pop()
            for child in node.children.values():
                rendered, grandchildren = render(child)
                into.append(rendered)
                if child.children:
                    pending.append((child, grandchildren))
        return top


def build_tree(counts: Mapping[str, int], root_name: str = "all") -> Node:
    """Builds the call tree of a profile; the root's total is the sum of all counts (the
    empty stack's samples are the root's own)."""
    root = Node(root_name)
    for stack, count in counts.items():
        if count <= 0:
            continue
        root.total += count
        if not stack:
            continue
        node = root
        for frame in stack.split(SEPARATOR):
            node = node.child(frame)
            node.total += count
    return root
