"""Properties of the profile core, over generated names, profiles and trees."""

from __future__ import annotations

import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from sampler.profile import (
    Node,
    Profile,
    build_tree,
    encodable_text,
    escape_frame,
    filter_stacks,
    format_folded,
    merge,
    parse_folded,
    prune,
    sort_stacks,
    subtract,
    unescape_frame,
)

# Any text at all, lone surrogates included: a frame name is whatever a process calls it.
names = st.text(st.characters(codec=None, min_codepoint=0), max_size=30)
frames = names.map(escape_frame).filter(bool)
stacks = st.lists(frames, min_size=1, max_size=8).map(";".join)
counts = st.dictionaries(stacks, st.integers(min_value=1, max_value=10**12), max_size=30)
few_frames = st.sampled_from(["a", "b", "a b", "a:x", "a!", "ab", "m%3Bn", "z"])
# Stacks over few names, so that profiles share stacks and prefixes.
shared = st.dictionaries(
    st.lists(few_frames, min_size=1, max_size=5).map(";".join),
    st.integers(min_value=1, max_value=1000),
    max_size=40,
)


@given(names)
@example("caf\udce9.py;\ud800")  # lone surrogates, always tried (at random: now and then)
def test_escape_round_trips_and_leaves_nothing_unsafe(name):
    escaped = escape_frame(name)
    # Every name comes back, but for lone surrogates, which UTF-8 cannot hold: written out.
    assert unescape_frame(escaped) == encodable_text(name)
    escaped.encode()
    assert not any(c in escaped for c in ';"\\\n\r\x00\x7f')
    assert json.dumps(escaped, ensure_ascii=False) == f'"{escaped}"'
    assert escape_frame(escaped) == escaped.replace("%", "%25")


@given(counts)
def test_print_then_parse_round_trips(profile):
    assert parse_folded(format_folded(profile)) == profile


@given(counts)
def test_parse_then_print_is_canonical(profile):
    text = format_folded(profile)
    assert format_folded(parse_folded(text)) == text


@given(shared, shared)
def test_subtract_undoes_merge(a, b):
    assert subtract(merge([a, b]), b) == a
    assert subtract(a, a) == {}
    assert merge([a, {}]) == a


@given(shared, shared)
def test_merge_of_profiles_keeps_the_interval_and_subtract_undoes_it(a, b):
    pa, pb = Profile(a, interval=0.005, mode="wall"), Profile(b, interval=0.005, mode="wall")
    assert pa.merge(pb).subtract(pb) == pa
    assert pa.merge(pb).seconds == (sum(a.values()) + sum(b.values())) * 0.005


@given(shared, shared)
def test_tree_merge_subtract_and_stacks_agree_with_counts(a, b):
    ta, tb = build_tree(a), build_tree(b)
    assert ta.stacks() == a
    assert ta.merge(tb) == build_tree(merge([a, b]))
    assert ta.merge(tb).subtract(tb) == ta
    assert ta.filter(lambda s: s.startswith("a")) == build_tree(
        filter_stacks(a, lambda s: s.startswith("a"))
    )


@given(shared)
def test_a_tree_totals_its_children_and_own_samples(a):
    tree = build_tree(a)
    assert tree.total == sum(a.values())
    for _, node in tree.walk():
        assert node.self_count >= 0
        assert node.total == node.self_count + sum(c.total for c in node.children.values())


@settings(max_examples=60)
@given(shared, st.integers(min_value=2, max_value=40))
def test_pruned_trees_keep_every_sample_within_the_bound(a, max_nodes):
    pruned = prune(sort_stacks([a]), max_nodes=max_nodes)
    (root,) = pruned.roots
    nodes = [root, *(node for _, node in root.walk())]
    assert len(nodes) == pruned.nodes <= max_nodes
    assert root.total == sum(a.values())
    for node in nodes:
        assert node.total >= sum(c.total for c in node.children.values())
    unpruned = prune(sort_stacks([a]), max_nodes=10**6).roots[0]
    assert unpruned == build_tree(a)


@given(shared, shared)
def test_two_profiles_prune_into_trees_of_one_shape(a, b):
    root_a, root_b = prune(sort_stacks([a, b]), max_nodes=25, scale=[1.0, 1.0]).roots

    def shape(node: Node) -> list[object]:
        return [node.name, [shape(c) for c in node.children.values()]]

    assert shape(root_a) == shape(root_b)
    assert (root_a.total, root_b.total) == (sum(a.values()), sum(b.values()))
