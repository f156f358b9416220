"""Deltas between cumulative snapshots: new instances, growth, resets, validation."""

from __future__ import annotations

import copy
import json

import pytest
from pollhelpers import make_doc

from collector.deltas import compute_delta, merge_cursor_updates
from collector.query import Query
from collector.states import StackTable, TargetState
from collector.store import Store
from sampler.profile import DocumentError, Limits, decode_document, validate_document

TABLE = StackTable()


def profile(stacks, *, instance="a1", label_sets=None, labels=None, generation=0):
    doc = make_doc(stacks, instance=instance, label_sets=label_sets, labels=labels)
    doc["generation"] = generation
    return validate_document(doc)


def delta(prev, prof, **kw):
    table = kw.pop("table", TABLE)
    return compute_delta(
        "w1:8021", kw.pop("target_labels", {}), prev, prof, bucket=600, table=table
    )


def counts(state):
    return state.folded(TABLE)


def row_counts(d):
    return {(r.stack, tuple(sorted(r.labels.items()))): r.count for r in d.rows}


def test_first_snapshot_is_all_new():
    d = delta(None, profile([(0, "a;b", 5), (0, "a;c", 3)]))
    assert row_counts(d) == {("a;b", ()): 5, ("a;c", ()): 3}
    assert d.new_instance and d.cursor.replaced
    assert d.cursor.counts == {(0, "a;b"): 5, (0, "a;c"): 3}
    assert d.samples == 8
    assert all(r.bucket == 600 and r.instance == "a1" and r.mode == "cpu" for r in d.rows)


def test_rows_carry_the_sampling_interval_of_their_document():
    doc = make_doc([(0, "a;b", 5)])
    doc["interval"] = 0.005
    (row,) = delta(None, validate_document(doc)).rows
    assert row.interval == 0.005


def test_growth_gives_the_difference_and_changed_keys_only():
    first = delta(None, profile([(0, "a;b", 5), (0, "a;c", 3)]))
    second = delta(first.state, profile([(0, "a;b", 9), (0, "a;c", 3), (0, "a;d", 1)]))
    assert row_counts(second) == {("a;b", ()): 4, ("a;d", ()): 1}
    assert not second.cursor.replaced
    assert second.cursor.counts == {(0, "a;b"): 9, (0, "a;d"): 1}
    assert counts(second.state) == {(0, "a;b"): 9, (0, "a;c"): 3, (0, "a;d"): 1}


def test_unchanged_snapshot_gives_nothing():
    first = delta(None, profile([(0, "a;b", 5)]))
    again = delta(first.state, profile([(0, "a;b", 5)]))
    assert again.rows == [] and again.cursor is None and again.samples == 0


def test_new_instance_id_counts_everything_again():
    first = delta(None, profile([(0, "a;b", 50)]))
    restarted = delta(first.state, profile([(0, "a;b", 7)], instance="b2"))
    assert row_counts(restarted) == {("a;b", ()): 7}
    assert restarted.new_instance and restarted.cursor.replaced
    assert restarted.state.instance == "b2"


def test_count_going_down_is_a_reset_never_negative():
    first = delta(None, profile([(0, "a;b", 50), (0, "a;c", 10)]))
    d = delta(first.state, profile([(0, "a;b", 4), (0, "a;c", 12)]))
    assert row_counts(d) == {("a;b", ()): 4, ("a;c", ()): 2}
    assert d.resets == 1
    assert all(r.count > 0 for r in d.rows)


def test_label_sets_keep_their_ids_when_the_sampler_reorders_them():
    sets1 = [{}, {"route": "/a"}]
    first = delta(None, profile([(0, "x", 1), (1, "y", 2)], label_sets=sets1))
    sets2 = [{}, {"route": "/b"}, {"route": "/a"}]
    second = delta(first.state, profile([(0, "x", 1), (2, "y", 5), (1, "y", 1)], label_sets=sets2))
    assert row_counts(second) == {("y", (("route", "/a"),)): 3, ("y", (("route", "/b"),)): 1}
    assert second.cursor.label_sets == {2: {"route": "/b"}}
    assert second.cursor.counts == {(1, "y"): 5, (2, "y"): 1}


def test_labels_service_and_host_come_from_process_then_target():
    prof = profile(
        [(1, "x", 1)],
        label_sets=[{}, {"route": "/a"}],
        labels={"service": "api", "host": "web-3", "version": "1"},
    )
    d = delta(None, prof, target_labels={"environment": "prod", "version": "2"})
    (row,) = d.rows
    assert (row.service, row.host) == ("api", "web-3")
    assert dict(row.labels) == {"route": "/a", "version": "2", "environment": "prod"}


def test_labels_over_the_limit_together_are_cut_and_marked_and_the_store_takes_them(sqlite_url):
    # 40 process labels and a tag of 30: each fits the 64 of the wire, together they do not.
    process = {f"p{i:02}": "v" for i in range(40)} | {"service": "api", "host": "web-3"}
    tag = {f"t{i:02}": "v" for i in range(30)}
    prof = profile([(0, "a", 4), (1, "a;b", 6)], label_sets=[{}, tag], labels=process)
    d = delta(None, prof, target_labels={"environment": "prod"})
    by_stack = {row.stack: dict(row.labels) for row in d.rows}
    assert by_stack["a"] == {f"p{i:02}": "v" for i in range(40)} | {"environment": "prod"}
    cut = by_stack["a;b"]
    assert len(cut) == 64 and cut["fleetflame"] == "labels-over-limit"
    assert cut["environment"] == "prod" and all(f"p{i:02}" in cut for i in range(40))
    assert [key for key in tag if key in cut] == [f"t{i:02}" for i in range(22)]
    store = Store(sqlite_url)
    store.migrate()
    store.write(d.rows)  # refused whole before: "65 labels, the limit is 64"
    assert Query(store).profile(0, 10**6) == {"a": 4, "a;b": 6}
    store.close()


def test_rows_that_collapse_to_one_label_set_are_summed():
    prof = profile([(0, "x", 2), (1, "x", 3)], label_sets=[{}, {"env": "dev"}])
    d = delta(None, prof, target_labels={"env": "prod"})
    assert [(r.stack, dict(r.labels), r.count) for r in d.rows] == [("x", {"env": "prod"}, 5)]


def test_merge_cursor_updates_has_the_effect_of_both():
    first = delta(None, profile([(0, "a", 1), (0, "b", 1)]))
    second = delta(first.state, profile([(0, "a", 3), (0, "b", 1)]))
    merged = merge_cursor_updates(first.cursor, second.cursor)
    assert merged.replaced and merged.counts == {(0, "a"): 3, (0, "b"): 1}
    third = delta(second.state, profile([(0, "a", 1)], instance="zz"))
    assert merge_cursor_updates(merged, third.cursor) == third.cursor


def _mutated(path, value):
    doc = make_doc([(0, "a;b", 5)])
    target = doc
    for step in path[:-1]:
        target = target[step]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("format",), "fleetflame.profile/2", "not supported"),
        (("format",), 3, "format"),
        (("instance",), KeyError, "instance"),
        (("instance", "id"), "", "instance.id"),
        (("instance", "id"), 42, "instance.id"),
        (("mode",), "gpu", "mode"),
        (("interval",), -1, "interval"),
        (("interval",), "0.01", "interval"),
        (("time",), float("nan"), "time"),
        (("labels",), ["service"], "labels"),
        (("labels", "service"), 3, "labels"),
        (("label_sets",), [], "label_sets"),
        (
            ("label_sets",),
            [{}, {"r": "/a"}, {"r": "/a"}],
            "'label_sets[2]': the same labels as label_sets[1]",
        ),
        (("stacks",), {"a": 1}, "stacks"),
        (("stacks", 0), [0, "a;b"], "stacks[0]"),
        (("stacks", 0), [5, "a;b", 1], "label set index"),
        (("stacks", 0), [0, "", 1], "non-empty"),
        (("stacks", 0), [0, "a;b", -3], "negative"),
        (("stacks", 0), [0, "a;b", 10**30], "absurd"),
        (("stacks", 0), [0, "a;b", 1.5], "whole number"),
        (("stacks", 0), [0, "a;b", True], "whole number"),
        (("stacks", 0), [0, "a\x00b", 1], "control character"),
        (("stacks", 0), [0, "a;;b", 1], "empty frame"),
        (("stacks", 0), [0, "a\ud800", 1], "control character"),
        (("labels", "version"), "x\x00", "NUL"),
    ],
)
def test_validation_names_the_bad_field(path, value, message):
    with pytest.raises(DocumentError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate_document(_mutated(path, value))


def test_too_many_stacks_is_refused():
    doc = make_doc([(0, f"s{i}", 1) for i in range(11)])
    with pytest.raises(DocumentError, match="more than the limit of 10"):
        validate_document(doc, Limits(max_stacks=10))


def test_decode_rejects_bad_json_and_non_objects():
    with pytest.raises(DocumentError, match="not valid JSON"):
        decode_document(b'{"format": ')
    with pytest.raises(DocumentError, match="expected a JSON object"):
        decode_document(b"[1, 2]")
    good = make_doc([(0, "a", 1)])
    assert decode_document(json.dumps(good).encode()).stacks == {(0, "a"): 1}


def test_validation_does_not_modify_the_document():
    doc = make_doc([(0, "a", 1), (0, "a", 2)])
    before = copy.deepcopy(doc)
    prof = validate_document(doc)
    assert doc == before
    assert prof.stacks == {(0, "a"): 3}


def test_a_refused_document_leaves_the_state_as_it_was():
    first = delta(None, profile([(0, "a", 1), (0, "b", 2)]))
    with pytest.raises(DocumentError, match="grew by"):
        delta(first.state, profile([(0, "a", 4), (0, "b", 2 + 10**10)]))
    assert counts(first.state) == {(0, "a"): 1, (0, "b"): 2}
    assert delta(first.state, profile([(0, "a", 4), (0, "b", 2)])).samples == 3


def test_absurd_growth_between_polls_is_refused_and_consumes_nothing():
    first = delta(None, profile([(0, "a", 5)]))
    with pytest.raises(DocumentError, match="grew by 2000000000"):
        delta(first.state, profile([(0, "a", 2_000_000_005)]))
    assert counts(first.state) == {(0, "a"): 5}
    sane = delta(first.state, profile([(0, "a", 9)]))
    assert row_counts(sane) == {("a", ()): 4}


@pytest.mark.parametrize(
    "stack", ["a;b\n", "a\x01;b", "a\x7f", "a\ud800;b", ";a", "a;", "a;;b", "a\\;b\x00"]
)
def test_decode_refuses_bad_stacks_however_they_are_encoded(stack):
    # Escaped (\u0001) or raw (DEL may be raw in JSON), the fast path must not let them through.
    for raw in (
        json.dumps(make_doc([(0, stack, 1)])).encode("utf-8", "surrogatepass"),
        json.dumps(make_doc([(0, stack, 1)]), ensure_ascii=False).encode("utf-8", "surrogatepass"),
    ):
        with pytest.raises(DocumentError):
            decode_document(raw)


def incremental(stacks, *, since, generation, instance="a1"):
    doc = make_doc(stacks, instance=instance)
    doc.update(since=since, generation=generation)
    return validate_document(doc)


def test_an_incremental_document_gives_the_same_rows_as_a_full_one():
    first = [(0, "a;b", 5), (0, "a;c", 3)]
    base = delta(None, profile(first, generation=40)).state
    assert base.generation == 40 and base.since_query() == "?since=40&instance=a1"
    full = delta(base, profile([(0, "a;b", 9), (0, "a;c", 3), (0, "d", 1)], generation=70))
    full_counts = counts(full.state)
    again = delta(None, profile(first, generation=40)).state
    part = delta(again, incremental([(0, "a;b", 9), (0, "d", 1)], since=40, generation=70))
    assert row_counts(part) == row_counts(full) == {("a;b", ()): 4, ("d", ()): 1}
    assert counts(part.state) == full_counts == {(0, "a;b"): 9, (0, "a;c"): 3, (0, "d"): 1}
    assert part.state.generation == 70


def test_an_incremental_document_for_another_snapshot_is_refused_and_read_whole_next():
    base = delta(None, profile([(0, "a;b", 5)], generation=40)).state
    with pytest.raises(DocumentError, match="since tick 39"):
        delta(base, incremental([(0, "a;b", 9)], since=39, generation=70))
    assert base.since_query() == ""  # the next poll asks for every stack
    with pytest.raises(DocumentError, match="since tick 40"):
        delta(None, incremental([(0, "a;b", 9)], since=40, generation=70))


def test_since_beyond_the_generation_is_invalid():
    doc = make_doc([(0, "a", 1)])
    doc.update(since=80, generation=70)
    with pytest.raises(DocumentError, match="since"):
        validate_document(doc)


def test_the_fleet_holds_each_stack_once():
    table = StackTable()
    stacks = [f"main;work;leaf{i}" for i in range(50)]
    states = [
        delta(None, profile([(0, s, 1) for s in stacks], instance=f"i{n}"), table=table).state
        for n in range(20)
    ]
    # Twenty targets, fifty distinct stacks: fifty strings, whatever the count of targets.
    assert len(table) == 50
    texts = {id(table.stack(sid)) for state in states for sid in state.stack_ids()}
    assert len(texts) == 50
    rows = delta(None, profile([(0, s, 1) for s in stacks], instance="x"), table=table).rows
    assert {id(row.stack) for row in rows} == texts


def test_the_table_drops_stacks_no_target_counts_any_more():
    table = StackTable()
    old = delta(None, profile([(0, "a;old", 1), (0, "a;kept", 1)]), table=table).state
    new = delta(old, profile([(0, "a;new", 2)], instance="restarted"), table=table).state
    assert len(table) == 3
    assert table.sweep(new.stack_ids()) == 2
    assert len(table) == 1 and counts_in(new, table) == {(0, "a;new"): 2}
    # A freed id is reused, and a stack coming back gets an id again.
    again = delta(
        new, profile([(0, "a;new", 2), (0, "a;old", 5)], instance="restarted"), table=table
    )
    assert len(table) == 2 and counts_in(again.state, table)[(0, "a;old")] == 5


def counts_in(state, table):
    return state.folded(table)


def test_cursors_rebuild_a_state():
    from collector.store import Cursor

    table = StackTable()
    cursor = Cursor("a1", {(0, "x;y"): 4, (1, "x"): 2}, {0: {}, 1: {"r": "/"}})
    state = TargetState.from_cursor(cursor, table)
    assert state.folded(table) == {(0, "x;y"): 4, (1, "x"): 2}
    d = delta(state, profile([(0, "x;y", 6)]), table=table)
    assert row_counts(d) == {("x;y", ()): 2} and not d.new_instance


def test_dropped_rows_keep_their_cursor_for_the_next_part():
    first = delta(None, profile([(0, "a", 1)]))
    second = delta(first.state, profile([(0, "a", 3), (0, "b", 1)]))
    third = delta(second.state, profile([(0, "a", 7), (0, "b", 1)]))
    assert second.part.drop_rows() == (2, 3)
    assert second.part.sample_rows() == [] and second.part.rows == 0
    third.part.carry(second.part)
    update = third.part.cursor_update()
    assert update.counts == {(0, "a"): 7, (0, "b"): 1}
    assert row_counts(third) == {("a", ()): 4}
