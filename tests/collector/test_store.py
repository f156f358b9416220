"""Writing samples and cursors, and reading them back, on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlalchemy as sa
from storehelpers import T0, row, store_fixture  # noqa: F401  (the `store` fixture)

from collector.migrate_db import head_revision
from collector.query import Filters, Query
from collector.store import Cursor, CursorUpdate, Store


def test_migrate_creates_the_schema_and_is_idempotent(store: Store) -> None:
    store.migrate()  # a second run (another collector starting) changes nothing
    tables = set(sa.inspect(store.engine.sa_engine).get_table_names())
    assert {"stacks", "label_sets", "series", "samples", "tiers", "cursor_log"} <= tables
    with store.engine.sa_engine.connect() as conn:
        version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    assert version == head_revision()


def test_written_rows_come_back_merged(store: Store) -> None:
    store.write(
        [
            row(T0, "main;work;leaf", 5),
            row(T0, "main;work", 3, instance="i-2", host="web-2"),
            row(T0 + 60, "main;work;leaf", 7),
        ]
    )
    q = Query(store)
    assert q.profile(T0, T0 + 120) == {"main;work;leaf": 12, "main;work": 3}
    assert q.profile(T0, T0 + 60) == {"main;work;leaf": 5, "main;work": 3}
    assert q.profile(T0 + 60, T0 + 120) == {"main;work;leaf": 7}
    assert q.profile(T0 + 120, T0 + 180) == {}


def test_counts_of_the_same_key_are_summed(store: Store) -> None:
    # Within one batch and across batches (the upsert path).
    store.write([row(T0, "a;b", 2), row(T0, "a;b", 3)])
    store.write([row(T0, "a;b", 10)])
    assert Query(store).profile(T0, T0 + 60) == {"a;b": 15}


def test_stacks_and_label_sets_are_stored_once(store: Store) -> None:
    labels = {"route": "/upload"}
    for minute in range(5):
        store.write(
            [row(T0 + 60 * minute, "a;b;c", 1, labels=labels, instance=f"i-{i}") for i in range(3)]
        )
    with store.engine.sa_engine.connect() as conn:
        count = lambda table: conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar()  # noqa: E731
        assert count("stacks") == 1
        assert count("label_sets") == 1
        assert count("series") == 3
        assert count("samples") == 15


def test_modes_never_merge(store: Store) -> None:
    store.write([row(T0, "a", 1, mode="cpu"), row(T0, "a", 10, mode="wall")])
    q = Query(store)
    assert q.profile(T0, T0 + 60, Filters(mode="cpu")) == {"a": 1}
    assert q.profile(T0, T0 + 60, Filters(mode="wall")) == {"a": 10}


def test_cursors_round_trip(store: Store) -> None:
    update = CursorUpdate(
        target="web-1:8021",
        instance="abc",
        replaced=True,
        counts={(0, "main;idle"): 40, (1, "main;upload;json:dumps"): 21},
        label_sets={0: {}, 1: {"route": "/upload"}},
    )
    store.write([row(T0, "main;idle", 40)], [update])
    assert store.load_cursors() == {
        "web-1:8021": Cursor(
            "abc",
            {(0, "main;idle"): 40, (1, "main;upload;json:dumps"): 21},
            {0: {}, 1: {"route": "/upload"}},
        )
    }


def test_cursor_updates_touch_only_changed_keys(store: Store) -> None:
    first = CursorUpdate("t:1", "abc", True, {(0, "a"): 1, (0, "b"): 2})
    store.write([], [first])
    store.write([], [CursorUpdate("t:1", "abc", False, {(0, "b"): 5, (0, "c"): 1})])
    assert store.load_cursors()["t:1"].counts == {(0, "a"): 1, (0, "b"): 5, (0, "c"): 1}


def test_a_replaced_cursor_drops_the_old_instance(store: Store) -> None:
    store.write([], [CursorUpdate("t:1", "old", True, {(0, "a"): 9, (0, "b"): 2}, {0: {}})])
    store.write([], [CursorUpdate("t:2", "other", True, {(0, "z"): 1})])
    store.write([], [CursorUpdate("t:1", "new", True, {(0, "b"): 1})])
    cursors = store.load_cursors()
    assert cursors["t:1"] == Cursor("new", {(0, "b"): 1}, {})
    assert cursors["t:2"].counts == {(0, "z"): 1}


def test_a_second_store_on_the_same_database_sees_everything(db_url: str) -> None:
    with Store(db_url) as first:
        first.migrate()
        first.write([row(T0, "x;y", 4)], [CursorUpdate("t:1", "abc", True, {(0, "x;y"): 4})])
    with Store(db_url) as second:
        second.migrate()
        assert Query(second).profile(T0, T0 + 60) == {"x;y": 4}
        assert second.load_cursors()["t:1"].counts == {(0, "x;y"): 4}


def test_cursor_targets_with_array_syntax_round_trip(store: Store) -> None:
    # PostgreSQL gets the targets as one array literal: quotes, backslashes, commas and braces
    # in a target name must come back as they went in.
    targets = ['a"b:1', "c\\d:2", "e,f{g}:3", "NULL", " h :4", "ünï:5"]
    updates = [CursorUpdate(t, "i", True, {(0, "main"): n + 1}) for n, t in enumerate(targets)]
    store.write([row(T0, "main", 1)], updates)
    cursors = store.load_cursors()
    assert {t: c.counts for t, c in cursors.items()} == {
        t: {(0, "main"): n + 1} for n, t in enumerate(targets)
    }


def test_a_read_sees_one_snapshot_while_writes_commit(store: Store) -> None:
    store.write([row(T0, "m;a", 1)])
    query = Query(store)
    samples = sa.select(sa.func.sum(sa.text("count"))).select_from(sa.text("samples"))
    with store.engine.read_transaction() as conn:
        assert conn.execute(samples).scalar() == 1
        store.write([row(T0, "m;a", 2), row(T0 + 60, "m;b", 4)])  # commits meanwhile
        assert conn.execute(samples).scalar() == 1
    with store.engine.read_transaction() as conn:
        assert conn.execute(samples).scalar() == 7
    assert query.profile(T0, T0 + 120) == {"m;a": 3, "m;b": 4}


def test_two_writers_of_one_bucket_sum_their_counts(db_url: str) -> None:
    # Each writer takes the bucket for new to it (PostgreSQL inserts without ON CONFLICT
    # then): the second one's insert conflicts, and its write adds up all the same.
    with Store(db_url) as first, Store(db_url) as second:
        first.migrate()
        first.write([row(T0, "a;b", 2), row(T0, "a;c", 1)])
        second.write(
            [row(T0, "a;b", 3), row(T0, "a;d", 4)],
            [CursorUpdate("t:1", "i", True, {(0, "a;b"): 3})],
        )
        first.write([row(T0, "a;b", 5)])  # a bucket it wrote before: upserted at once
        assert Query(first).profile(T0, T0 + 60) == {"a;b": 10, "a;c": 1, "a;d": 4}
        assert second.load_cursors()["t:1"].counts == {(0, "a;b"): 3}
