"""Reads: filters, timelines, top functions, label values, bad queries; and the pure planner."""

from __future__ import annotations

import random

import pytest
from storehelpers import T0, row, store_fixture  # noqa: F401  (the `store` fixture)

from collector.functions import FunctionStat, function_stats
from collector.query import Filters, Query
from collector.store import InvalidQuery, Store
from collector.store.tiers import Segment, TierState, plan


@pytest.fixture
def fleet(store: Store) -> Query:
    """Two services on three hosts, with route and version labels, over three minutes."""
    rows = []
    for minute in range(3):
        b = T0 + 60 * minute
        rows += [
            row(b, "m;api;get", 1, host="web-1", instance="a1", labels={"route": "/get", "v": "1"}),
            row(b, "m;api;put", 2, host="web-1", instance="a1", labels={"route": "/put", "v": "1"}),
            row(b, "m;api;get", 4, host="web-2", instance="a2", labels={"route": "/get", "v": "2"}),
            row(b, "m;job;run", 8, service="batch", host="job-1", instance="b1", labels={"v": "2"}),
        ]
    store.write(rows)
    return Query(store)


def test_filters_or_within_a_key_and_across_keys(fleet: Query) -> None:
    window = (T0, T0 + 180)
    assert fleet.profile(*window) == {"m;api;get": 15, "m;api;put": 6, "m;job;run": 24}
    assert fleet.profile(*window, Filters(services=("batch",))) == {"m;job;run": 24}
    assert fleet.profile(*window, Filters(hosts=("web-1", "job-1"))) == {
        "m;api;get": 3,
        "m;api;put": 6,
        "m;job;run": 24,
    }
    assert fleet.profile(*window, Filters(instances=("a2",))) == {"m;api;get": 12}
    both_routes = Filters(labels=(("route", "/get"), ("route", "/put")))
    assert fleet.profile(*window, both_routes) == {"m;api;get": 15, "m;api;put": 6}
    route_and_version = Filters(labels=(("route", "/get"), ("v", "2")))
    assert fleet.profile(*window, route_and_version) == {"m;api;get": 12}
    assert fleet.profile(*window, Filters(services=("api",), labels=(("v", "2"),))) == {
        "m;api;get": 12
    }
    assert fleet.profile(*window, Filters(labels=(("nope", "x"),))) == {}
    assert fleet.profile(*window, Filters(mode="wall")) == {}


def test_profile_by_stack_id_and_the_names_of_the_ids(fleet: Query) -> None:
    window = (T0, T0 + 180)
    by_id = fleet.profile_ids(*window)
    assert all(type(sid) is int and type(count) is int for sid, count in by_id.items())
    names = fleet.stack_names(by_id)
    assert {names[sid]: count for sid, count in by_id.items()} == fleet.profile(*window)
    # A bucket counts when its start lies in the window: the last two minutes here.
    assert sum(fleet.profile_ids(T0 + 30, T0 + 180).values()) == 30
    assert fleet.stack_names([12345]) == {12345: "[unknown stack 12345]"}


def test_stack_texts_in_one_query_agree_with_the_chunked_fallback(fleet: Query) -> None:
    from collector.store.engines.base import Engine

    stored = list(fleet.profile_ids(T0, T0 + 180))
    ids = [*stored, -(2**63), 2**63 - 1]  # ids not stored, at the ends of the 64-bit range
    engine = fleet.store.engine
    with engine.read_transaction() as conn:
        found = sorted(engine.stack_texts(conn, ids))
        assert found == sorted(Engine.stack_texts(engine, conn, ids))
        assert [sid for sid, _ in found] == sorted(stored)
        assert engine.stack_texts(conn, []) == []


def test_stack_lines_in_one_row_agree_with_the_rows(fleet: Query, monkeypatch) -> None:
    import sqlite3

    import sqlalchemy as sa

    from collector.store import schema
    from collector.store.engines import sqlite as sqlite_engine
    from collector.store.engines.base import Engine

    engine = fleet.store.engine
    odd, empty, long = 4242, 4343, 4444  # the first two the store would refuse
    with engine.write_transaction() as conn:
        conn.execute(sa.insert(schema.stacks).values(id=odd, folded="x;y\nz"))
        conn.execute(sa.insert(schema.stacks).values(id=empty, folded=""))
        conn.execute(sa.insert(schema.stacks).values(id=long, folded="f;" * 60 + "g"))
    stored = list(fleet.profile_ids(T0, T0 + 180))
    texts = {**fleet.stack_names(stored), odd: "x;y%0Az", empty: "", long: "f;" * 60 + "g"}
    cases = [[*stored, 12345], [*stored, odd], [stored[0]], [odd], [empty], [empty, *stored]]
    cases += [[12345], []]

    def by_id(found: list[int], lines: str) -> dict[int, str]:
        assert len(set(found)) == len(found)
        return dict(zip(found, lines.split("\n") if found else [], strict=True))

    def check() -> None:
        for ids in cases:
            with engine.read_transaction() as conn:
                read = by_id(*engine.stack_lines(conn, ids))
                assert read == by_id(*Engine.stack_lines(engine, conn, ids))
            assert read == {sid: texts[sid] for sid in ids if sid != 12345}

    check()
    monkeypatch.setattr(sqlite_engine, "_LINES_CHUNK", 2)  # several rows of lines
    check()
    assert fleet.stack_lines([stored[0], stored[0]]) == ([stored[0]], texts[stored[0]])
    # Asked in id order (the primary key's), whatever order they are given in.
    found, _ = fleet.stack_lines(sorted(stored, reverse=True))
    assert found == sorted(stored) and len(found) > 2
    if engine.name == "sqlite":
        # Lines longer than SQLite's longest string are read a string per stack.
        with engine.read_transaction() as conn:
            driver = conn.connection.driver_connection
            old = driver.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 125)  # one text fits, not two
            try:
                ids = [long, stored[0]]
                with pytest.raises(sa.exc.DataError):
                    conn.exec_driver_sql(sqlite_engine._STACK_LINES, (str(ids),))
                assert by_id(*engine.stack_lines(conn, ids)) == {i: texts[i] for i in ids}
            finally:
                driver.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, old)


def test_many_stacks_are_read_in_two_halves_at_once(fleet: Query, monkeypatch) -> None:
    import threading

    from collector import query as query_module
    from collector.store import StoreUnavailable

    stored = sorted(fleet.profile_ids(T0, T0 + 180))
    missing = [1, 2]  # ids never stored
    one_read = fleet.stack_lines(stored + missing)
    assert one_read[0] == stored
    reads: list[tuple[str, list[int]]] = []
    real = Query._stack_lines

    def spied(query: Query, ids: list[int]) -> tuple[list[int], str]:
        reads.append((threading.current_thread().name, ids))
        return real(query, ids)

    monkeypatch.setattr(Query, "_stack_lines", spied)
    monkeypatch.setattr(query_module, "_HALVES_FROM", 2)
    # In halves on SQLite (its one row of lines is made outside the interpreter), not PostgreSQL.
    assert fleet.stack_lines(stored + missing) == one_read
    assert len(reads) == (2 if fleet.store.engine.name == "sqlite" else 1)
    reads.clear()
    monkeypatch.setattr(fleet.store.engine, "reads_lines_in_halves", lambda: True)  # PostgreSQL
    assert fleet.stack_lines(stored + missing) == one_read
    assert fleet.stack_lines(stored) == fleet.stack_lines(list(reversed(stored)))
    assert fleet.stack_lines(missing + stored[:1]) == (stored[:1], one_read[1].split("\n")[0])
    assert fleet.stack_lines(missing) == ([], "")
    # Each time two reads, on two threads, of the two halves in id order.
    assert len(reads) == 10 and reads[0][1] + reads[1][1] == sorted(missing + stored)
    assert len({name for name, _ in reads[:2]}) == 2

    def failing(query: Query, ids: list[int]) -> tuple[list[int], str]:
        if threading.current_thread() is not threading.main_thread():
            raise StoreUnavailable("the database went away")
        return real(query, ids)

    monkeypatch.setattr(Query, "_stack_lines", failing)
    with pytest.raises(StoreUnavailable, match="went away"):
        fleet.stack_lines(stored)


def test_many_stacks_of_an_in_memory_database_are_read_in_one(monkeypatch) -> None:
    # Each thread has its own in-memory database (SQLAlchemy's SingletonThreadPool): a half
    # read on another thread would find no tables at all (found by a review).
    from collector import query as query_module

    with Store("sqlite://") as store:
        store.migrate()
        store.write([row(T0, f"m;f{i}", 1) for i in range(4)])
        fleet = Query(store)
        ids = sorted(fleet.profile_ids(T0, T0 + 60))
        monkeypatch.setattr(query_module, "_HALVES_FROM", 2)
        found, lines = fleet.stack_lines(ids)
    assert found == ids and sorted(lines.split("\n")) == [f"m;f{i}" for i in range(4)]


def test_stack_counts_in_one_row_agree_with_the_driver_rows(fleet: Query) -> None:
    from collector.store import schema
    from collector.store.engines.base import Engine

    engine = fleet.store.engine
    samples = schema.samples.c
    for where in ([samples.width == 60], [samples.width == 60, samples.bucket < T0]):
        with engine.read_transaction() as conn:
            ids, counts = engine.stack_counts(conn, where)
            rows = Engine.stack_counts(engine, conn, where)
        assert dict(zip(ids, counts, strict=True)) == dict(zip(*rows, strict=True))
        assert len(set(ids)) == len(ids)
        assert all(type(x) is int for x in ids + counts)
    assert ids == []  # nothing before T0
    # Stacks of several series, and of several tiers' segments, add up.
    assert sum(fleet.profile_ids(T0, T0 + 180).values()) == 45


def test_one_bucket_of_one_series_is_read_without_merging(fleet: Query) -> None:
    engine = fleet.store.engine
    merged: list[bool] = []
    read = engine.stack_counts

    def recording(conn, where, *, merge=True):  # type: ignore[no-untyped-def]
        merged.append(merge)
        return read(conn, where, merge=merge)

    engine.stack_counts = recording  # type: ignore[method-assign]
    a2 = Filters(instances=("a2",))  # one series; a1 has two (two routes)
    cases = [
        (T0, T0 + 60, a2, {"m;api;get": 4}, False),
        (T0 + 120, T0 + 900, a2, {"m;api;get": 4}, False),  # its last bucket is T0 + 120
        (T0, T0 + 61, a2, {"m;api;get": 8}, True),
        (T0, T0 + 60, Filters(instances=("a1",)), {"m;api;get": 1, "m;api;put": 2}, True),
        (T0, T0 + 60, Filters(), {"m;api;get": 5, "m;api;put": 2, "m;job;run": 8}, True),
    ]
    for start, end, filters, expected, merge in cases:
        merged.clear()
        assert fleet.profile(start, end, filters) == expected
        assert merged == [merge]


def test_timeline_per_bucket_and_per_step(fleet: Query) -> None:
    assert fleet.timeline(T0, T0 + 180) == [(T0, 15), (T0 + 60, 15), (T0 + 120, 15)]
    assert fleet.timeline(T0, T0 + 180, Filters(services=("batch",))) == [
        (T0, 8),
        (T0 + 60, 8),
        (T0 + 120, 8),
    ]
    assert fleet.timeline(T0, T0 + 180, step=120) == [(T0, 30), (T0 + 120, 15)]
    assert fleet.timeline(T0 + 60, T0 + 120) == [(T0 + 60, 15)]


def test_top_functions(fleet: Query) -> None:
    top = fleet.top_functions(T0, T0 + 180)
    assert top[0] == FunctionStat("m;job;run".split(";")[-1], 24, 24)
    by_name = {s.name: s for s in top}
    assert by_name["m"] == FunctionStat("m", 0, 45)
    assert by_name["api"] == FunctionStat("api", 0, 21)
    assert fleet.top_functions(T0, T0 + 180, limit=2) == top[:2]


def test_empty_frame_names_are_no_functions() -> None:
    stats = function_stats({"": 3, "a;;b": 2, "a": 1, "c": 0, "d": -4})
    assert stats == [FunctionStat("b", 2, 2), FunctionStat("a", 1, 3)]


def test_recursive_frames_count_once_in_total() -> None:
    stats = {s.name: s for s in function_stats({"a;b;a;b;a": 10, "a;c": 5, "b": 1})}
    assert stats["a"] == FunctionStat("a", 10, 15)
    assert stats["b"] == FunctionStat("b", 1, 11)
    assert all(s.total <= 16 for s in stats.values())


def test_label_values_honour_the_other_filters(fleet: Query) -> None:
    window = (T0, T0 + 180)
    assert fleet.label_values(*window) == {
        "service": ["api", "batch"],
        "host": ["job-1", "web-1", "web-2"],
        "instance": ["a1", "a2", "b1"],
        "route": ["/get", "/put"],
        "v": ["1", "2"],
    }
    picked = fleet.label_values(*window, Filters(services=("batch",)))
    assert picked["service"] == ["api", "batch"]  # the alternatives to the selection stay
    assert picked["host"] == ["job-1"]
    assert picked["v"] == ["2"]
    assert "route" not in picked
    assert fleet.label_values(T0 + 600, T0 + 900)["service"] == []


def test_tree_of_a_window(fleet: Query) -> None:
    tree = fleet.tree(T0, T0 + 60)
    assert tree.total == 15
    assert tree.children["m"].children["api"].total == 7


@pytest.mark.parametrize(
    "call",
    [
        lambda q: q.profile(T0 + 60, T0),
        lambda q: q.profile("yesterday", T0),
        lambda q: q.profile(T0, T0 + 60, Filters(mode="gpu")),
        lambda q: q.timeline(T0, T0 + 60, step=0),
        lambda q: q.label_values(T0, 1.5),
    ],
)
def test_bad_queries_raise_invalid_query(fleet: Query, call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidQuery):
        call(fleet)


def covers_without_overlap(segments: list[Segment], start: int, end: int) -> None:
    for a, b in zip(segments, segments[1:], strict=False):
        assert a.end <= b.start
    for seg in segments:
        assert start <= seg.start < seg.end <= end


def test_plan_prefers_coarse_tiers_and_never_overlaps() -> None:
    rng = random.Random(3)
    day = 86400
    for _ in range(2000):
        rolled_hour = rng.randrange(0, 40) * 3600
        rolled_ten = rolled_hour + rng.randrange(0, 30) * 600
        kept_fine = rng.randrange(0, rolled_ten // 3600 + 1) * 3600
        kept_ten = rng.randrange(0, kept_fine // 3600 + 1) * 3600
        states = [
            TierState(60, kept_fine, 0),
            TierState(600, kept_ten, rolled_ten),
            TierState(3600, 0, rolled_hour),
        ]
        start = rng.randrange(0, 2 * day // 60) * 60 + rng.choice([0, 17])
        end = start + rng.randrange(0, day)
        for max_width in (None, 60, 600):
            segments = plan(start, end, states, max_width=max_width)
            covers_without_overlap(segments, start, end)
            for seg in segments:
                state = next(s for s in states if s.width == seg.width)
                rolled = 2**62 if seg.width == 60 else state.rolled_to
                if seg.start % seg.width == 0 and seg.end % seg.width == 0:
                    assert state.kept_from <= seg.start and seg.end <= rolled


def test_plan_examples() -> None:
    states = [TierState(60, 7200, 0), TierState(600, 0, 10800), TierState(3600, 0, 7200)]
    assert plan(0, 14400, states) == [
        Segment(3600, 0, 7200),
        Segment(600, 7200, 10800),
        Segment(60, 10800, 14400),
    ]
    assert plan(0, 14400, states, max_width=60) == [
        Segment(600, 0, 7200),  # minute rows before 7200 are gone: the next finest
        Segment(60, 7200, 14400),
    ]
    assert plan(100, 100, states) == []


def test_counts_of_an_id_read_twice_are_added() -> None:
    from collector.store.reads import _add_counts

    totals: dict[int, int] = {}
    _add_counts(totals, [1, 2, 1], [5, 1, 2])  # should not happen (one snapshot), but may not lose
    assert totals == {1: 7, 2: 1}
    _add_counts(totals, [2, 3], [1, 1])
    assert totals == {1: 7, 2: 2, 3: 1}


def test_recent_stacks_most_recent_first(store: Store) -> None:
    store.write(
        [
            row(T0, "m;old", 5),
            row(T0 + 60, "m;mid", 1, service="batch"),
            row(T0 + 660, "m;new", 2, host="web-9", labels={"v": "3"}),
            row(T0 + 600, "m;mid", 1),
            row(T0 + 120, "m;mid", 1),
        ]
    )
    query = Query(store)
    ids = {text: stack_id(query, text) for text in ("m;old", "m;mid", "m;new")}
    # Every series counts; each stack once, by its last sample.
    assert query.recent_stacks(T0, T0 + 3600) == [ids["m;new"], ids["m;mid"], ids["m;old"]]
    assert query.recent_stacks(T0 + 60, T0 + 120) == [ids["m;mid"]]
    assert query.recent_stacks(T0 + 7200, T0 + 9000) == []
    # Once rolled up, an aligned window is read from coarser rows: the same stacks.
    store.rollup(T0 + 86400 * 8)
    assert sorted(query.recent_stacks(T0, T0 + 3600)) == sorted(ids.values())
    with pytest.raises(InvalidQuery, match="before its start"):
        query.recent_stacks(T0 + 60, T0)


def stack_id(query: Query, text: str) -> int:
    ids = query.profile_ids(T0, T0 + 3600)
    return next(sid for sid, name in query.stack_names(ids).items() if name == text)
