"""Call trees of large profiles, built straight from their stacks and pruned to a bounded size.

A browser cannot draw a million frames, and building a full call tree of 200,000 distinct
stacks in Python takes seconds. So the tree is never built whole: the stacks are sorted with
a separator that sorts below every character a frame may contain, which makes every call-tree
node a contiguous range of the sorted list, and cumulative counts give any node's total with
two lookups. A best-first walk then keeps the heaviest nodes up to ``max_nodes`` and folds the
rest of each parent's children into one ``[pruned]`` node. The work depends on the number of
nodes kept, not on the number of stacks below them. The result is made of tree.Node, one tree
per profile (several profiles, as the two sides of a comparison, give trees of one shape).
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence

from .frames import PRUNED, SEPARATOR
from .tree import Node

__all__ = [
    "SORT_SEPARATOR",
    "Bounds",
    "Pruned",
    "SortedStacks",
    "folded_of",
    "prune",
    "sort_key",
    "sort_keys",
    "sort_keys_of_lines",
    "sort_stacks",
]

# Frames never contain control characters (the wire format escapes them), so these two sort
# below every character that can follow a frame name.
SORT_SEPARATOR = _SEP = "\x01"
_END = "\x02"


class Bounds:
    """Where call-tree nodes begin and end in one list of sorted keys, found by bisection and
    remembered: they do not depend on the counts, so trees built over the same keys (a
    StackIndex's, for every window it arranges) find each one once. Thread-safe; at most
    ``limit`` remembered, then it starts over."""

    def __init__(self, keys: list[str], limit: int = 500_000) -> None:
        self.keys = keys
        self.limit = limit
        # What node_at and node_start found, by their first two arguments: may be read
        # directly (saving a call); replaced, never cleared in place.
        self.ends: dict[tuple[int, int], tuple[int, int]] = {}
        self.starts: dict[tuple[int, int], int] = {}

    def node_at(self, i: int, start: int, hi: int) -> tuple[int, int]:
        """Returns where the name of the node that key ``i`` starts ends in the key (its
        frames begin at ``start``), and the key after the node's last; ``hi`` bounds it."""
        found = self.ends.get((i, start))
        if found is None:
            key = self.keys[i]
            stop = key.find(_SEP, start)
            if stop < 0:
                stop = len(key)
            found = (stop, bisect_left(self.keys, key[:stop] + _END, i + 1, hi))
            self._make_room()
            self.ends[(i, start)] = found
        return found

    def node_start(self, j: int, start: int, lo: int) -> int:
        """Returns the first key of the node holding key ``j`` whose name begins at ``start``
        (at or after ``lo``, a node boundary)."""
        found = self.starts.get((j, start))
        if found is None:
            key = self.keys[j]
            stop = key.find(_SEP, start)
            found = bisect_left(self.keys, key[:stop] if stop >= 0 else key, lo, j + 1)
            self._make_room()
            self.starts[(j, start)] = found
        return found

    def _make_room(self) -> None:
        if len(self.ends) + len(self.starts) >= self.limit:
            # Replaced, not cleared: other threads may be reading them.
            self.ends, self.starts = {}, {}


class SortedStacks:
    """Stacks as sort keys (see sort_key), in order, with each profile's counts aligned.

    Sorted so, every call-tree node is one contiguous range of keys. Built from folded counts
    by sort_stacks(), or by a webui StackIndex that keeps the order between requests; keys
    may include stacks without samples (an index's order holds every stack it knows), and
    ``bounds`` the node boundaries remembered for these keys, if any.
    """

    __slots__ = ("keys", "values", "bounds")

    def __init__(
        self, keys: list[str], values: list[list[int]], bounds: Bounds | None = None
    ) -> None:
        self.keys = keys
        self.values = values
        self.bounds = bounds

    def __repr__(self) -> str:
        return f"SortedStacks({len(self.keys)} keys, {len(self.values)} profiles)"


class Pruned:
    """A pruned call tree per profile (the same shape for all), and what was pruned."""

    __slots__ = ("roots", "nodes", "pruned_nodes", "pruned_samples")

    def __init__(
        self, roots: list[Node], nodes: int, pruned_nodes: int, pruned_samples: list[int]
    ) -> None:
        self.roots = roots  # one per profile
        self.nodes = nodes  # in each tree, the root and [pruned] nodes included
        self.pruned_nodes = pruned_nodes
        self.pruned_samples = pruned_samples  # per profile: the samples of the [pruned] nodes


def sort_key(stack: str) -> str:
    """Returns the key a folded stack sorts by: frames joined by a separator that sorts
    below every character a frame name may hold (control characters are escaped)."""
    if _SEP in stack or _END in stack or "\n" in stack:
        stack = _sanitize(stack)
    return stack.replace(SEPARATOR, _SEP)


def sort_keys(stacks: list[str]) -> list[str]:
    """Returns the sort key of each stack (see sort_key), in one pass over all of them."""
    # One join, replace and split over all stacks: much faster than one replace each.
    joined = "\n".join(stacks)
    keys = joined.replace(SEPARATOR, _SEP).split("\n") if stacks else []
    if len(keys) != len(stacks) or _SEP in joined or _END in joined:
        # Not valid folded text (control characters in a frame); keep it drawable anyway.
        keys = list(map(sort_key, stacks))
    return keys


def sort_keys_of_lines(lines: str, count: int) -> list[str]:
    """Returns the sort keys of ``count`` folded stacks given one per line (see sort_key)."""
    if _SEP in lines or _END in lines:
        lines = lines.replace(_SEP, "%01").replace(_END, "%02")  # as sort_key does
    keys = lines.replace(SEPARATOR, _SEP).split("\n") if count else []
    if len(keys) != count:
        raise ValueError(f"expected {count} stacks, got {len(keys)} lines")
    return keys


def folded_of(key: str) -> str:
    """Returns the folded stack of a sort key."""
    return key.replace(_SEP, SEPARATOR)


def sort_stacks(profiles: Sequence[Mapping[str, int]]) -> SortedStacks:
    """Sorts the stacks of one or more profiles of folded counts (missing counts are 0)."""
    # Builtins over whole lists (map, sorted, join) rather than Python loops: this runs over
    # every distinct stack of the window.
    if len(profiles) == 1:
        stacks = list(profiles[0])
        values = [list(profiles[0].values())]
    else:
        stacks = list(set().union(*profiles))
        values = [list(map(p.get, stacks, itertools.repeat(0))) for p in profiles]
    keys = sort_keys(stacks)
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return SortedStacks(
        list(map(keys.__getitem__, order)), [list(map(v.__getitem__, order)) for v in values]
    )


class _Ranges:
    """Cumulative counts over sorted stacks, so any node's numbers are two lookups.

    ``cumulative[i][k]`` is profile i's samples in the first k keys, and ``weight[k]`` the
    same for the pruning weight (a weighted sum of the profiles).
    """

    def __init__(self, stacks: SortedStacks, scale: Sequence[float]) -> None:
        keys, values = stacks.keys, list(stacks.values)  # the caller's lists stay as they are
        self.keys = keys
        if stacks.bounds is not None and stacks.bounds.keys is not keys:
            raise ValueError("the remembered node boundaries belong to other keys")
        self.bounds = stacks.bounds or Bounds(keys)
        for i, v in enumerate(values):
            if v and min(v) < 0:
                values[i] = [max(x, 0) for x in v]
        # The empty stack has no frames: its samples belong to the root itself.
        self.first = 1 if keys and keys[0] == "" else 0
        self.root_self = [v[0] if self.first else 0 for v in values]
        self.cumulative = [_running_sums(v) for v in values]
        self.totals = [cum[-1] for cum in self.cumulative]
        if len(values) == 1:
            self.weight: Sequence[float] = self.cumulative[0]
        else:
            per_key = map(
                sum,
                zip(*([x * f for x in v] for v, f in zip(values, scale, strict=True)), strict=True),
            )
            weight = array("d", [0.0])
            weight.extend(itertools.accumulate(per_key))
            self.weight = weight

    def sums(self, lo: int, hi: int) -> list[int]:
        """Returns each profile's samples in the keys ``[lo, hi)``."""
        return [cum[hi] - cum[lo] for cum in self.cumulative]


def _running_sums(values: Iterable[int]) -> array[int]:
    """Returns 0 and the running sums of ``values``, as an array: bisecting a list of numbers
    goes from object to object over memory, three times slower."""
    sums = array("q", [0])
    sums.extend(itertools.accumulate(values))
    return sums


def _sanitize(stack: str) -> str:
    return stack.replace(_SEP, "%01").replace(_END, "%02").replace("\n", "%0A")


def prune(
    stacks: SortedStacks,
    *,
    max_nodes: int = 5000,
    min_share: float = 0.0,
    scale: Sequence[float] | None = None,
    root_name: str = "all",
) -> Pruned:
    """Builds the call tree of each profile of ``stacks`` with at most ``max_nodes`` nodes,
    pruned ones included, all trees of the same shape.

    Nodes are kept heaviest first, a node's weight being the sum of its samples in each
    profile times that profile's ``scale`` (1 for one profile; with two, the reciprocals of
    their totals weigh the sides of a comparison equally). A node whose weight is at most
    ``min_share`` of the root's is never kept. The callees of a node that were not kept
    become one ``[pruned]`` child holding their samples. Names stay escaped, as in stacks.
    """
    if max_nodes < 2:
        raise ValueError("max_nodes must be at least 2 (the root and one [pruned] node)")
    ranges = _Ranges(stacks, [1.0] if scale is None else scale)
    roots = [Node(root_name, total) for total in ranges.totals]
    min_weight = min_share * ranges.weight[-1] if len(ranges.weight) else 0.0
    kept, pruned = _best_first(ranges, roots, max_nodes, min_weight)
    samples = [0] * len(roots)
    for nodes, sums in pruned:
        for i, (node, value) in enumerate(zip(nodes, sums, strict=True)):
            if PRUNED in node.children:
                node.add(PRUNED, value)  # beside a real frame of that name
            else:
                node.children[PRUNED] = Node(PRUNED, value)
            samples[i] += value
    return Pruned(roots, kept + len(pruned), len(pruned), samples)


def _best_first(
    stacks: _Ranges, roots: list[Node], max_nodes: int, min_weight: float
) -> tuple[int, list[tuple[list[Node], list[int]]]]:
    """Keeps the heaviest nodes, attaching them below ``roots`` (one per profile).

    Returns the number of nodes kept and, for each kept node some of whose callees were not
    kept, that node (one per profile) and the samples of those callees per profile.
    """
    keys, weight, bounds = stacks.keys, stacks.weight, stacks.bounds
    single = len(roots) == 1
    order = itertools.count()
    heap: list[tuple[float, int, int, str, int, int, int]] = []
    # Per kept node (by index): its node in each profile's tree, its samples, what its kept
    # callees hold, and how many of its callees are not kept.
    nodes: list[list[Node]] = [roots]
    sums: list[list[int]] = [list(stacks.totals)]
    in_callees: list[list[int]] = [list(stacks.root_self)]
    unkept: list[int] = [0]

    # Weights of the heaviest nodes seen so far. Once it holds `enough`, no node lighter than
    # its smallest can be kept: at least `enough` nodes at least as heavy will be (kept nodes
    # outnumber [pruned] ones), so light callees are skipped without being looked at.
    enough = max(1, (max_nodes - 2) // 2)
    best: list[float] = []

    def push_children(index: int, lo: int, hi: int, prefix_len: int) -> None:
        # The remembered boundaries, read here without a call (they may be replaced meanwhile:
        # what these hold stays true).
        ends, starts = bounds.ends, bounds.starts
        i = lo
        if i < hi and len(keys[i]) == prefix_len:
            # The stack that ends at this node: its own samples, not a callee's.
            in_callees[index] = [cum[i + 1] - cum[i] for cum in stacks.cumulative]
            i += 1
        start = prefix_len + 1
        count = 0
        skipped = False
        while i < hi:
            bound = best[0] if len(best) >= enough else 0
            rest = weight[hi] - weight[i]
            if rest <= 0 or rest < bound:
                skipped = skipped or rest > 0
                break
            # Key j is the first whose weight brings the run from key i to the bound (or,
            # without a bound, the first with samples): the callees that end before the one
            # holding key j are too light to keep, or empty.
            if bound:
                j = bisect_left(weight, weight[i] + bound, i + 1, hi + 1) - 1
            else:
                j = bisect_right(weight, weight[i], i + 1, hi + 1) - 1
            if j > i:
                first = starts.get((j, start))
                if first is None:
                    first = bounds.node_start(j, start, i)
                if first > i:
                    skipped = skipped or weight[first] > weight[i]
                    i = first
            found = ends.get((i, start))
            stop, end = found if found is not None else bounds.node_at(i, start, hi)
            w = weight[end] - weight[i]
            if w < bound:
                skipped = True
            else:
                heapq.heappush(heap, (-w, next(order), index, keys[i][start:stop], i, end, stop))
                count += 1
                if len(best) < enough:
                    heapq.heappush(best, w)
                elif w > best[0]:
                    heapq.heapreplace(best, w)
            i = end
        # A skipped callee is never kept: it counts as one that stays unkept.
        unkept[index] = count + skipped

    placeholders = 0
    if len(keys) > stacks.first:
        push_children(0, stacks.first, len(keys), -1)  # the root's callees start at offset 0
        placeholders = 1 if unkept[0] else 0
    while heap:
        neg_weight, _, parent, name, lo, hi, prefix_len = heap[0]
        if -neg_weight <= min_weight:
            break
        own = 1 if len(keys[lo]) == prefix_len else 0
        has_children = weight[hi] - weight[lo + own] > 0
        after = len(nodes) + 1 + placeholders - (unkept[parent] == 1) + has_children
        if after > max_nodes:
            break
        heapq.heappop(heap)
        node_sums = stacks.sums(lo, hi)
        # Kept siblings have distinct names (each is one range of keys): no name is taken.
        if single:
            node = nodes[parent][0].children[name] = Node(name, node_sums[0])
            kept = [node]
        else:
            kept = [Node(name, value) for value in node_sums]
            for parent_node, node in zip(nodes[parent], kept, strict=True):
                parent_node.children[name] = node
        held = in_callees[parent]
        for i, value in enumerate(node_sums):
            held[i] += value
        index = len(nodes)
        nodes.append(kept)
        sums.append(node_sums)
        in_callees.append([0] * len(node_sums))
        unkept.append(0)
        unkept[parent] -= 1
        if unkept[parent] == 0:
            placeholders -= 1
        if has_children:
            push_children(index, lo, hi, prefix_len)
            if unkept[index]:
                placeholders += 1
    pruned = [
        (nodes[i], [total - held for total, held in zip(sums[i], in_callees[i], strict=True)])
        for i in range(len(nodes))
        if unkept[i]
    ]
    return len(nodes), pruned
