"""The pruned call tree and the differential tree: exact on small inputs, bounded on large ones."""

from __future__ import annotations

import random

import pytest

from sampler.profile import build_tree
from webui.model import PRUNED, SortedStacks, diff_tree, flame_tree, flame_tree_sorted
from webui.model.flametree import Bounds, folded_of, sort_key, sort_keys


def as_plain(node):
    """The tree as nested (name, value, sorted children) tuples, order-independent."""
    return (node["name"], node["value"], sorted(as_plain(c) for c in node["children"]))


def reference(counts):
    return as_plain(build_tree(counts).to_dict())


def random_profile(rng: random.Random, stacks: int, frames: int = 12, depth: int = 8):
    names = [f"mod{i}:f{i}" for i in range(frames)] + ["a", "a:x", "a b", "a!", "ab"]
    out = {}
    for _ in range(stacks):
        stack = ";".join(rng.choice(names) for _ in range(rng.randint(1, depth)))
        out[stack] = out.get(stack, 0) + rng.randint(1, 100)
    return out


def walk(node, path=()):
    yield path + (node["name"],), node
    for child in node["children"]:
        yield from walk(child, path + (node["name"],))


def true_total(counts, path):
    """Samples of the stacks passing through ``path`` (root name first)."""
    frames = list(path[1:])
    return sum(c for s, c in counts.items() if s.split(";")[: len(frames)] == frames and c > 0)


@pytest.mark.parametrize("seed", range(5))
def test_unpruned_tree_equals_the_full_call_tree(seed):
    counts = random_profile(random.Random(seed), 300)
    tree = flame_tree(counts, max_nodes=10**6)
    assert as_plain(tree.root) == reference(counts)
    assert tree.total == sum(counts.values())
    assert tree.pruned_nodes == 0 and tree.pruned_samples == 0


def test_frames_that_prefix_other_frames_stay_apart():
    # ':' ' ' and '!' sort below ';', which would split a node's range with a naive sort.
    counts = {"a;b": 1, "a:x;c": 2, "a;b;c": 4, "a b": 8, "a": 16, "a!;a": 32, "ab": 64}
    assert as_plain(flame_tree(counts).root) == reference(counts)


@pytest.mark.parametrize("max_nodes", [2, 3, 7, 50, 400])
def test_pruning_bounds_the_nodes_and_keeps_every_sample(max_nodes):
    counts = random_profile(random.Random(max_nodes), 2000, frames=40, depth=12)
    tree = flame_tree(counts, max_nodes=max_nodes)
    nodes = list(walk(tree.root))
    assert len(nodes) == tree.nodes <= max_nodes
    assert tree.root["value"] == sum(counts.values())
    placeholders = [n for _, n in nodes if n["name"] == PRUNED]
    assert len(placeholders) == tree.pruned_nodes >= 1
    assert sum(n["value"] for n in placeholders) == tree.pruned_samples > 0
    kept_values = []
    for path, node in nodes:
        assert node["value"] >= sum(c["value"] for c in node["children"])
        names = [c["name"] for c in node["children"]]
        assert names.count(PRUNED) <= 1
        if node["name"] != PRUNED:
            assert node["value"] == true_total(counts, path)
            if len(path) > 1:
                kept_values.append(node["value"])
    # Best first: nothing pruned outweighs anything kept.
    full = build_tree(counts)
    for path, node in nodes:
        if any(c["name"] == PRUNED for c in node["children"]):
            full_node = full
            for name in path[1:]:
                full_node = full_node.children[name]
            kept = {c["name"] for c in node["children"]}
            dropped = [c.total for n, c in full_node.children.items() if n not in kept]
            assert dropped and max(dropped) <= min(kept_values, default=max(dropped))


def test_min_share_drops_light_frames():
    counts = {"main;hot": 990, "main;cold": 10}
    tree = flame_tree(counts, min_share=0.05)
    main = tree.root["children"][0]
    assert [(c["name"], c["value"]) for c in main["children"]] == [("hot", 990), (PRUNED, 10)]


def test_pruning_keeps_the_heaviest_path():
    counts = {f"main;worker;leaf{i}": 1 for i in range(1000)}
    counts["main;worker;hot;deeper"] = 5000
    tree = flame_tree(counts, max_nodes=8)
    names = {path[-1] for path, _ in walk(tree.root)}
    assert {"main", "worker", "hot", "deeper", PRUNED} <= names
    assert tree.nodes <= 8


def test_names_are_unescaped_and_markup_is_left_alone():
    counts = {"m:a%3Bb;<img src=x onerror=alert(1)>": 3, "m:line%0Abreak": 1}
    names = {path[-1] for path, _ in walk(flame_tree(counts).root)}
    assert {"m:a;b", "<img src=x onerror=alert(1)>", "m:line\nbreak"} <= names


def test_empty_stack_zero_and_negative_counts():
    assert flame_tree({}).root == {"name": "all", "value": 0, "children": []}
    tree = flame_tree({"": 5, "a": 0, "b": -3, "c": 2})
    assert as_plain(tree.root) == ("all", 7, [("c", 2, [])])


@pytest.mark.parametrize("max_nodes", [2, 3, 9, 60, 10**6])
def test_stacks_without_samples_change_nothing(max_nodes):
    # A stack index arranges windows over every stack it knows: most have no samples.
    rng = random.Random(max_nodes)
    every = random_profile(rng, 1500, frames=30, depth=10)
    counts = {s: c for s, c in every.items() if rng.random() < 0.2}
    with_zeros = {s: counts.get(s, 0) for s in every}
    expected = flame_tree(counts, max_nodes=max_nodes).to_dict()
    assert flame_tree(with_zeros, max_nodes=max_nodes).to_dict() == expected
    other = {s: c for s, c in every.items() if rng.random() < 0.1}
    expected_diff = diff_tree(counts, other, max_nodes=max_nodes).to_dict()
    other_with_zeros = {s: other.get(s, 0) for s in every}
    assert diff_tree(with_zeros, other_with_zeros, max_nodes=max_nodes).to_dict() == expected_diff


def test_remembered_node_bounds_serve_every_profile_over_the_same_keys():
    rng = random.Random(3)
    every = random_profile(rng, 1500, frames=30, depth=10)
    keys = sort_keys(sorted(every, key=sort_key))
    for limit in (10, 10**6):
        bounds = Bounds(keys, limit)
        for _ in range(4):
            counts = {s: rng.randint(0, 3) * c for s, c in every.items()}
            values = [counts[folded_of(key)] for key in keys]
            tree = flame_tree_sorted(SortedStacks(keys, [values], bounds), max_nodes=300)
            assert tree.to_dict() == flame_tree(counts, max_nodes=300).to_dict()
            assert len(bounds.ends) + len(bounds.starts) <= limit


def test_boundaries_of_other_keys_are_refused():
    keys = sort_keys(["a;b", "a;c"])
    with pytest.raises(ValueError, match="other keys"):
        flame_tree_sorted(SortedStacks(keys, [[1, 2]], Bounds(list(keys))))


def test_control_separator_inside_a_frame_is_drawable():
    tree = flame_tree({"a\x01b;c": 2, "a\x02;d": 1})
    assert tree.total == 3
    assert {path[-1] for path, _ in walk(tree.root)} >= {"a\x01b", "a\x02"}


def test_max_nodes_below_two_is_refused():
    with pytest.raises(ValueError, match="max_nodes"):
        flame_tree({"a": 1}, max_nodes=1)


def test_diff_normalises_each_side_to_its_own_total():
    a = {"main;parse": 30, "main;render": 70}
    b = {"main;parse": 300, "main;render": 100, "main;new": 600}
    tree = diff_tree(a, b)
    root = tree.root
    assert (root["a"], root["b"], root["delta"]) == (1.0, 1.0, 0.0)
    assert (tree.total_a, tree.total_b) == (100, 1000)
    main = root["children"][0]
    by_name = {c["name"]: c for c in main["children"]}
    assert by_name["parse"]["a"] == pytest.approx(0.3)
    assert by_name["parse"]["b"] == pytest.approx(0.3)
    assert by_name["parse"]["delta"] == pytest.approx(0.0)
    assert by_name["render"]["delta"] == pytest.approx(0.1 - 0.7)
    assert by_name["new"]["a"] == 0 and by_name["new"]["b"] == pytest.approx(0.6)
    assert by_name["new"]["samples_b"] == 600 and by_name["new"]["samples_a"] == 0
    assert by_name["render"]["value"] == pytest.approx((0.7 + 0.1) / 2)


def test_diff_with_an_empty_side_has_zero_shares():
    tree = diff_tree({}, {"a": 4})
    assert tree.root["a"] == 0 and tree.root["b"] == 1.0
    assert tree.root["children"][0]["delta"] == 1.0


def test_diff_pruning_is_bounded_and_shares_add_up():
    rng = random.Random(7)
    a, b = random_profile(rng, 1500, frames=40), random_profile(rng, 1500, frames=40)
    tree = diff_tree(a, b, max_nodes=60)
    nodes = list(walk(tree.root))
    assert len(nodes) == tree.nodes <= 60 and tree.pruned_nodes >= 1
    for _, node in nodes:
        for side in ("a", "b"):
            children = sum(c[side] for c in node["children"])
            assert children <= node[side] + 1e-9
        # The [pruned] node plus the kept callees plus own samples make the parent's share.
        assert node["delta"] == pytest.approx(node["b"] - node["a"])
    for path, node in nodes:
        if node["name"] != PRUNED and len(path) > 1:
            assert node["samples_a"] == true_total(a, path)
            assert node["samples_b"] == true_total(b, path)


def test_sort_keys_of_lines_are_those_of_each_stack():
    from webui.model.flametree import sort_keys_of_lines

    stacks = ["a;b", "a\x01b;c", "", "x\x02;y", "a;b;c"]
    assert sort_keys_of_lines("\n".join(stacks), len(stacks)) == sort_keys(stacks)
    assert sort_keys_of_lines("", 0) == [] and sort_keys_of_lines("", 1) == [""]
    with pytest.raises(ValueError, match="expected 2 stacks, got 3"):
        sort_keys_of_lines("a\nb\nc", 2)
