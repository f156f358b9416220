"""Schema migrations: a database written by the first schema, upgraded, keeps every answer."""

from __future__ import annotations

import sqlalchemy as sa
from storehelpers import T0, row

from collector.query import Filters, Query
from collector.store import Cursor, CursorUpdate, Store
from collector.store.cursors import COMPACT_EVERY
from collector.store.ids import fleet_labels
from collector.store.rows import fleet_id, label_set_id, labels_text, series_id, stack_id

OLD_SERIES = [
    ("api", "web-1", "i-1", {"route": "/a", "pod": "api-1"}),
    ("api", "web-2", "i-2", {"route": "/b", "pod": "api-2"}),
]


def write_first_schema(conn: sa.Connection) -> None:
    """Writes what a collector of revision 0001 wrote: two series, minute rows, a cursor."""
    for service, host, instance, labels in OLD_SERIES:
        text = labels_text(labels)
        lid = label_set_id(text)
        sid = series_id("cpu", service, host, instance, lid)
        conn.execute(
            sa.text("INSERT INTO label_sets (id, labels) VALUES (:i, :l) ON CONFLICT DO NOTHING"),
            {"i": lid, "l": text},
        )
        for key, value in labels.items():
            conn.execute(
                sa.text("INSERT INTO label_pairs (key, value, label_set_id) VALUES (:k, :v, :i)"),
                {"k": key, "v": value, "i": lid},
            )
        conn.execute(
            sa.text(
                "INSERT INTO series (id, mode, service, host, instance, label_set_id, "
                "first_bucket, last_bucket) VALUES (:id, 'cpu', :s, :h, :n, :l, :f, :t)"
            ),
            {"id": sid, "s": service, "h": host, "n": instance, "l": lid, "f": T0, "t": T0 + 60},
        )
        for stack, count in (("m;a", 3), ("m;b;c", 4)):
            conn.execute(
                sa.text("INSERT INTO stacks (id, folded) VALUES (:i, :f) ON CONFLICT DO NOTHING"),
                {"i": stack_id(stack), "f": stack},
            )
            for bucket in (T0, T0 + 60):
                conn.execute(
                    sa.text(
                        "INSERT INTO samples (width, bucket, series_id, stack_id, count) "
                        "VALUES (60, :b, :s, :k, :c)"
                    ),
                    {"b": bucket, "s": sid, "k": stack_id(stack), "c": count},
                )
    conn.execute(sa.text("INSERT INTO cursor_targets (target, instance) VALUES ('t:1', 'i-1')"))
    for stack, count in (("m;a", 6), ("m;b;c", 8)):
        conn.execute(
            sa.text(
                "INSERT INTO cursor_entries (target, label_index, stack_id, count) "
                "VALUES ('t:1', 0, :k, :c)"
            ),
            {"k": stack_id(stack), "c": count},
        )


def test_a_database_of_the_first_schema_upgrades_with_its_data(db_url: str) -> None:
    with Store(db_url) as old:
        old.migrate("0001")
        for width in (60, 600, 3600):  # PostgreSQL: the time partitions the writer makes
            old.engine.ensure_partitions(width, {T0})
        with old.engine.write_transaction() as conn:
            write_first_schema(conn)
    with Store(db_url) as store:
        store.migrate()
        q = Query(store)
        expected = {"m;a": 12, "m;b;c": 16}
        assert q.profile(T0, T0 + 120) == expected
        assert q.read(T0, T0 + 120).interval == 0.01  # series from before: 100 Hz
        assert q.profile(T0, T0 + 120, Filters(labels=(("route", "/b"),))) == {
            "m;a": 6,
            "m;b;c": 8,
        }
        assert store.load_cursors() == {"t:1": Cursor("i-1", {(0, "m;a"): 6, (0, "m;b;c"): 8})}
        with store.engine.sa_engine.connect() as conn:
            named = conn.execute(sa.text("SELECT fleet_id FROM series")).scalars().all()
            fleets = conn.execute(sa.text("SELECT id FROM fleet_series")).scalars().all()
        # One service, two label sets: two fleet series, as the writer names them today.
        assert (
            sorted(named)
            == sorted(fleets)
            == sorted(
                fleet_id("cpu", "api", label_set_id(labels_text(fleet_labels(labels))), 0.01)
                for *_, labels in OLD_SERIES
            )
        )
        store.write([row(T0 + 120, "m;a", 1, host="web-3", instance="i-3", labels={"route": "/a"})])
        store.rollup(T0 + 3600)
        assert any(s.fleet for s in q.plan(T0, T0 + 180))
        assert q.profile(T0, T0 + 180) == {"m;a": 13, "m;b;c": 16}
        # Writing into the upgraded database continues its cursors.
        store.write([], [CursorUpdate("t:1", "i-1", False, {(0, "m;a"): 7})])
        assert store.load_cursors()["t:1"].counts == {(0, "m;a"): 7, (0, "m;b;c"): 8}


def test_cursor_logs_are_folded_and_replayed(db_url: str) -> None:
    with Store(db_url) as store:
        store.migrate()
        store.write(
            [], [CursorUpdate("t:1", "i", True, {(0, "a"): 1, (1, "b"): 1}, {1: {"k": "v"}})]
        )
        for n in range(2, 3 * COMPACT_EVERY):
            store.write([], [CursorUpdate("t:1", "i", False, {(0, "a"): n})])
        with store.engine.sa_engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT count(*) FROM cursor_log")).scalar()
        assert 1 <= rows <= COMPACT_EVERY
        expected = Cursor("i", {(0, "a"): 3 * COMPACT_EVERY - 1, (1, "b"): 1}, {1: {"k": "v"}})
        assert store.load_cursors() == {"t:1": expected}
    # Another writer (a collector restarted, or given this target's shard) appends to it.
    with Store(db_url) as other:
        other.write(
            [],
            [
                CursorUpdate("t:1", "i", False, {(0, "c"): 5}),
                CursorUpdate("t:1", "i", False, {(0, "c"): 6, (1, "b"): 2}),  # later wins
                CursorUpdate("t:2", "j", True, {}),
            ],
        )
        cursors = other.load_cursors()
        assert cursors["t:1"].counts == {**expected.counts, (0, "c"): 6, (1, "b"): 2}
        assert cursors["t:2"] == Cursor("j")
        other.write([], [CursorUpdate("t:1", "k", True, {(0, "z"): 1})])
        assert other.load_cursors()["t:1"] == Cursor("k", {(0, "z"): 1})
