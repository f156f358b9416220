"""The flame and differential trees the browser draws: the core's pruned call trees
(sampler.profile.prune), rendered as d3-flame-graph's nested dicts with names unescaped.

The core builds a pruned tree straight from sorted stacks, so the work depends on the nodes
kept, not on the 200,000 stacks below them (see sampler/profile/pruning.py). With the
profile's sampling interval the trees also say how many seconds their samples stand for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sampler.profile import (
    PRUNED,
    SORT_SEPARATOR,
    Bounds,
    Node,
    Profile,
    SortedStacks,
    folded_of,
    prune,
    sort_key,
    sort_keys,
    sort_keys_of_lines,
    sort_stacks,
    unescape_frame,
)

__all__ = [
    "PRUNED",
    "SEPARATOR",
    "Bounds",
    "DiffTree",
    "FlameTree",
    "SortedStacks",
    "diff_tree",
    "diff_tree_sorted",
    "flame_tree",
    "flame_tree_sorted",
    "folded_of",
    "sort_key",
    "sort_keys",
    "sort_keys_of_lines",
    "sort_stacks",
]

SEPARATOR = SORT_SEPARATOR
Rendered = dict[str, Any]


@dataclass
class FlameTree:
    """A pruned call tree in d3-flame-graph's shape, with what was pruned."""

    root: Rendered
    total: int
    nodes: int
    pruned_nodes: int
    pruned_samples: int
    interval: float | None = None  # seconds one sample stands for, when known

    def to_dict(self) -> dict[str, Any]:
        """Renders the tree and its bookkeeping as one JSON-ready dict."""
        seconds = {} if self.interval is None else _seconds(self.interval, total=self.total)
        return {
            "total": self.total,
            **seconds,
            "nodes": self.nodes,
            "pruned_nodes": self.pruned_nodes,
            "pruned_samples": self.pruned_samples,
            "tree": self.root,
        }


@dataclass
class DiffTree:
    """A pruned differential tree: each node has its share of A, its share of B, and the delta."""

    root: Rendered
    total_a: int
    total_b: int
    nodes: int
    pruned_nodes: int
    interval: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Renders the tree and its bookkeeping as one JSON-ready dict."""
        seconds = (
            {}
            if self.interval is None
            else _seconds(self.interval, total_a=self.total_a, total_b=self.total_b)
        )
        return {
            "total_a": self.total_a,
            "total_b": self.total_b,
            **seconds,
            "nodes": self.nodes,
            "pruned_nodes": self.pruned_nodes,
            "tree": self.root,
        }


def _seconds(interval: float, **totals: int) -> dict[str, float]:
    """The interval, and each total in seconds (``total_a`` gives ``seconds_a``)."""
    out = {"interval": interval}
    for name, total in totals.items():
        out[name.replace("total", "seconds")] = total * interval
    return out


def _counts(profile: Mapping[str, int] | Profile) -> tuple[Mapping[str, int], float | None]:
    if isinstance(profile, Profile):
        return profile.counts, profile.interval
    return profile, None


def flame_tree(
    counts: Mapping[str, int] | Profile, *, max_nodes: int = 5000, min_share: float = 0.0
) -> FlameTree:
    """Builds the pruned call tree of a profile (see flame_tree_sorted); a Profile's tree
    carries its interval."""
    mapping, interval = _counts(counts)
    return flame_tree_sorted(
        sort_stacks([mapping]), max_nodes=max_nodes, min_share=min_share, interval=interval
    )


def flame_tree_sorted(
    stacks: SortedStacks,
    *,
    max_nodes: int = 5000,
    min_share: float = 0.0,
    root_name: str = "all",
    interval: float | None = None,
) -> FlameTree:
    """Builds the call tree of a profile with at most ``max_nodes`` nodes, pruned ones included.

    Nodes are kept heaviest first; a node at or below ``min_share`` of the total is never kept.
    The callees of a node that were not kept become one ``[pruned]`` child holding their
    samples. Frame names are unescaped for display.
    """
    pruned = prune(stacks, max_nodes=max_nodes, min_share=min_share, root_name=root_name)
    (root,) = pruned.roots
    return FlameTree(
        _render_flame(root),
        root.total,
        pruned.nodes,
        pruned.pruned_nodes,
        pruned.pruned_samples[0],
        interval,
    )


def _render_flame(root: Node) -> Rendered:
    """Renders a tree as d3-flame-graph's dicts, names unescaped; iterative, as a pruned tree
    may be a chain thousands of frames deep. (Node.to_dict does the same; this one runs for
    every view, so it saves the calls.)"""
    top: Rendered = {"name": unescape_frame(root.name), "value": root.total, "children": []}
    pending = [(root, top["children"])]
    pop, push = pending.pop, pending.append
    while pending:
        node, into = pop()
        append = into.append
        for child in node.children.values():
            rendered = {"name": unescape_frame(child.name), "value": child.total, "children": []}
            append(rendered)
            if child.children:
                push((child, rendered["children"]))
    return top


def diff_tree(
    counts_a: Mapping[str, int] | Profile,
    counts_b: Mapping[str, int] | Profile,
    *,
    max_nodes: int = 5000,
) -> DiffTree:
    """Builds the differential tree of two profiles (see diff_tree_sorted); Profiles must
    have one interval, which the tree carries."""
    (a, interval_a), (b, interval_b) = _counts(counts_a), _counts(counts_b)
    if interval_a != interval_b:
        raise ValueError(f"the two sides' intervals differ ({interval_a}, {interval_b})")
    return diff_tree_sorted(sort_stacks([a, b]), max_nodes=max_nodes, interval=interval_a)


def diff_tree_sorted(
    stacks: SortedStacks,
    *,
    max_nodes: int = 5000,
    min_share: float = 0.0,
    root_name: str = "all",
    interval: float | None = None,
) -> DiffTree:
    """Builds the differential tree of two profiles, each normalised to its own total.

    Every node carries ``a`` and ``b`` (its inclusive share of each side's total, 0..1),
    ``delta`` (b - a: positive means more time in B), the sample counts ``samples_a`` and
    ``samples_b``, and ``value``, the mean of the two shares, which sets its width. Pruning
    keeps the nodes with the largest ``a + b``. ``stacks`` holds the two profiles, A first.
    """
    totals = [sum(c for c in values if c > 0) for values in stacks.values]
    scale = [1.0 / t if t else 0.0 for t in totals]
    pruned = prune(
        stacks, max_nodes=max_nodes, min_share=min_share, scale=scale, root_name=root_name
    )

    root_a, root_b = pruned.roots
    scale_a, scale_b = scale

    def render(node_a: Node, node_b: Node) -> Rendered:
        a, b = node_a.total * scale_a, node_b.total * scale_b
        return {
            "name": unescape_frame(node_a.name),
            "value": (a + b) / 2,
            "a": a,
            "b": b,
            "delta": b - a,
            "samples_a": node_a.total,
            "samples_b": node_b.total,
            "children": [],
        }

    # Iterative, as _render_flame; the two trees have one shape, their children one order.
    top = render(root_a, root_b)
    pending = [(root_a, root_b, top["children"])]
    while pending:
        node_a, node_b, into = pending.pop()
        for child_a, child_b in zip(
            node_a.children.values(), node_b.children.values(), strict=True
        ):
            rendered = render(child_a, child_b)
            into.append(rendered)
            if child_a.children:
                pending.append((child_a, child_b, rendered["children"]))
    return DiffTree(top, totals[0], totals[1], pruned.nodes, pruned.pruned_nodes, interval)
