"""Rollups into coarser tiers, expiry of fine rows, retention and partitions, on both engines."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from storehelpers import T0, row, sparse_rows, store_fixture, write_all  # noqa: F401

from collector.query import Filters, Query
from collector.store import Store, tiers
from collector.store.tiers import DAY

HOUR = 3600
NOW = T0 + 10 * DAY + 5 * HOUR + 1234  # "now" of the rollup runs below


def fill(store: Store, days: int = 10, seed: int = 7) -> None:
    """Writes sparse samples over `days` days before NOW: 3 instances, a handful of stacks."""
    instances = [
        {"instance": instance, "service": "api" if instance != "i-3" else "batch"}
        for instance in ("i-1", "i-2", "i-3")
    ]
    stacks = ["main;a", "main;a;b", "main;c", "main;c;d;e", "main;a;b;a;b"]
    write_all(
        store, sparse_rows(NOW - days * DAY, NOW, 60 * 7, instances, stacks=stacks, seed=seed)
    )


WINDOWS = [
    (T0 + 6 * HOUR, NOW),  # everything (from an hour boundary: the start is in hourly rows)
    (T0 + 3 * HOUR, T0 + 5 * DAY + 7 * HOUR),  # hour-aligned, older than 7 days at its start
    (T0 + 8 * DAY, T0 + 9 * DAY + 10 * 600),  # aligned to 10 minutes, 1 to 2 days old
    (NOW - 5 * HOUR - 17 * 60, NOW - 23 * 60),  # recent and minute-aligned
    (T0 + 6 * DAY + 22 * HOUR + 20 * 60, NOW - 2 * HOUR - 11 * 60),  # spans every resolution
]


ALL = Filters()


def profiles(store: Store, filters: Filters = ALL) -> list[dict[str, int]]:
    q = Query(store)
    return [q.profile(start, end, filters) for start, end in WINDOWS]


def sample_rows(store: Store, width: int) -> int:
    with store.engine.sa_engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT count(*) FROM samples WHERE width = :w"), {"w": width}
        ).scalar_one()


def test_rolled_up_profiles_equal_the_fine_ones(store: Store) -> None:
    fill(store)
    filters = Filters(services=("api",), labels=(("route", "/a"),))
    before, before_filtered = profiles(store), profiles(store, filters)
    fine_rows = sample_rows(store, 60)
    store.rollup(NOW)
    assert profiles(store) == before
    assert profiles(store, filters) == before_filtered
    assert sample_rows(store, 60) < fine_rows / 3  # fine rows older than a day are gone
    assert sample_rows(store, 3600) > 0 and sample_rows(store, 600) > 0


def test_query_reads_the_coarsest_resolution_covering_the_window(store: Store) -> None:
    fill(store)
    store.rollup(NOW)
    q = Query(store)
    old = (T0 + 3 * HOUR, T0 + 2 * DAY)  # hour-aligned, older than 7 days
    assert q.resolution(*old) == 3600
    one_host = Filters(hosts=("web-1",))  # instance tiers only
    assert [s.width for s in q.plan(*old, filters=one_host)] == [3600]
    # The whole fleet: its 6-hour and daily rows where they fit.
    assert [(s.width, s.fleet) for s in q.plan(*old)] == [
        (3600, True),
        (6 * HOUR, True),
        (DAY, True),
    ]
    recent = (NOW - 5 * HOUR - 17 * 60, NOW - 23 * 60)
    assert q.resolution(*recent) == q.store.bucket_seconds == 60
    # Its merged profile reads the complete hours inside it from hourly rows, the rest
    # from minute rows (same counts, see the equivalence test).
    assert {s.width for s in q.plan(*recent, filters=one_host)} == {60, 600, 3600}
    assert {s.width for s in q.plan(*recent)} == {60, 600, 3600}
    assert q.resolution(T0 + 8 * DAY, T0 + 9 * DAY) == 600
    spanning = q.plan(*WINDOWS[4])
    assert len({s.width for s in spanning}) >= 2
    assert all(a.end <= b.start for a, b in zip(spanning, spanning[1:], strict=False))


def test_rollup_is_idempotent(store: Store) -> None:
    fill(store, days=3)
    store.rollup(NOW)
    counts = [sample_rows(store, w) for w in (60, 600, 3600)]
    before = profiles(store)
    store.rollup(NOW)
    store.rollup(NOW + 30)
    assert [sample_rows(store, w) for w in (60, 600, 3600)] == counts
    assert profiles(store) == before


def test_a_rollup_interrupted_by_an_error_is_finished_by_the_next_run(store: Store) -> None:
    fill(store, days=3)
    before = profiles(store)
    calls = {"n": 0}

    def fail_third_rollup(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        if statement.lstrip().startswith("INSERT INTO samples") and "SUM(count)" in statement:
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("injected rollup failure")

    engine = store.engine.sa_engine
    sa.event.listen(engine, "before_cursor_execute", fail_third_rollup)
    try:
        with pytest.raises(RuntimeError):
            store.rollup(NOW)
    finally:
        sa.event.remove(engine, "before_cursor_execute", fail_third_rollup)
    assert profiles(store) == before
    store.rollup(NOW)
    assert profiles(store) == before


def inserts_of(store: Store, run) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Runs ``run()`` and counts the chunks it wrote: rollup and fleet-fold inserts."""
    counts = {"rollups": 0, "folds": 0}

    def count(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        statement = statement.lstrip()
        if statement.startswith("INSERT INTO samples") and "SUM(count)" in statement:
            counts["rollups"] += 1
        elif statement.startswith("INSERT INTO fleet_samples"):
            counts["folds"] += 1

    engine = store.engine.sa_engine
    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        run()
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    return counts


def test_a_sparse_backlog_is_rolled_up_in_few_chunks(store: Store) -> None:
    # Ten days of a sparse fleet at one hour (instance tiers) or ten minutes (fleet tiers) a
    # chunk were 480 rollup and ~1,160 fold transactions: 12 s on PostgreSQL, 3.5 s on SQLite.
    fill(store)
    before = profiles(store)
    chunks = inserts_of(store, lambda: store.rollup(NOW))
    assert chunks["rollups"] <= 50 and chunks["folds"] <= 150, chunks  # 38 and 115 today
    assert profiles(store) == before


def test_a_dense_backlog_keeps_its_chunks_small(store: Store, monkeypatch) -> None:
    # Chunks that write more rows than a transaction should hold never grow: with a budget of
    # 5 rows every chunk writes more, so every hour is a chunk of its own, as before the pace.
    monkeypatch.setattr("collector.store.maintenance.ChunkPace", lambda: tiers.ChunkPace(rows=5))
    monkeypatch.setattr("collector.store.fleet.ChunkPace", lambda: tiers.ChunkPace(rows=5))
    fill(store, days=3)
    before = profiles(store)
    chunks = inserts_of(store, lambda: store.rollup(NOW))
    assert chunks["rollups"] >= 2 * 70, chunks  # ~72 hours, for the 10-minute and hourly tiers
    assert profiles(store) == before


def test_the_pace_doubles_after_small_chunks_and_halves_after_large_ones() -> None:
    pace = tiers.ChunkPace(rows=1000, most=8)
    assert pace.span(3600) == 3600
    for expected in (2, 4, 8, 8):
        pace.done(249)  # under a quarter of the budget
        assert pace.span(600) == 600 * expected
    pace.done(250)  # between a quarter and the budget: kept
    assert pace.factor == 8
    pace.done(1001)
    assert pace.factor == 4
    pace.done(-1)  # a driver that does not say: kept
    assert pace.factor == 4
    for _ in range(5):
        pace.done(10**6)
    assert pace.span(60) == 60


def test_late_rows_behind_the_rollup_are_counted_once(store: Store) -> None:
    fill(store, days=2)
    store.rollup(NOW)
    late_bucket = NOW - DAY - 3 * HOUR - (NOW % 60)  # rolled into 10-minute and hourly rows
    windows = [
        (late_bucket - late_bucket % HOUR, late_bucket - late_bucket % HOUR + HOUR),
        (late_bucket - late_bucket % 600, late_bucket - late_bucket % 600 + 600),
        (NOW - 2 * DAY, NOW),
    ]
    q = Query(store)
    before = [q.profile(*w) for w in windows]
    store.write([row(late_bucket, "late;stack", 9)])
    after = [q.profile(*w) for w in windows]
    for b, a in zip(before, after, strict=True):
        assert a == {**b, "late;stack": 9}
    store.rollup(NOW + 600)
    assert [q.profile(*w) for w in windows] == after


def test_timeline_with_steps_across_resolutions(store: Store) -> None:
    fill(store)
    q = Query(store)
    start, end = NOW - 9 * DAY - (NOW % DAY), NOW - (NOW % HOUR)
    fine = q.timeline(start, end, step=DAY)
    store.rollup(NOW)
    assert q.timeline(start, end, step=DAY) == fine
    assert sum(c for _b, c in q.timeline(start, end)) == sum(c for _b, c in fine)
    hourly = q.timeline(T0 + 6 * HOUR, T0 + 10 * HOUR)
    assert [b for b, _c in hourly] == [T0 + h * HOUR for h in range(6, 10)]


def test_retention_removes_old_samples_and_series(store: Store) -> None:
    fill(store, days=3)
    old = T0 - 40 * DAY
    store.write([row(old, "ancient", 5, instance="gone")])
    q = Query(store)
    assert q.profile(old, old + 60) == {"ancient": 5}
    recent = profiles(store)
    store.rollup(NOW)
    store.apply_retention(NOW)
    assert q.profile(old - DAY, old + DAY) == {}
    assert "gone" not in q.label_values(old - DAY, NOW)["instance"]
    assert profiles(store) == recent
    with store.engine.sa_engine.connect() as conn:
        oldest = conn.execute(sa.text("SELECT min(bucket) FROM samples")).scalar_one()
    assert oldest >= NOW - 30 * DAY - DAY


def test_postgresql_partitions_are_created_ahead_and_dropped(pg_url: str) -> None:
    with Store(pg_url) as st:
        st.migrate()
        fill(st, days=2)
        st.write([row(T0 - 40 * DAY, "ancient", 5)])

        def partitions() -> set[str]:
            with st.engine.sa_engine.connect() as conn:
                names = conn.execute(
                    sa.text("SELECT relname FROM pg_class WHERE relname LIKE 'samples_w%'")
                )
                return set(names.scalars())

        ancient = time_name(60, T0 - 40 * DAY)
        assert ancient in partitions()
        st.rollup(NOW)
        created = partitions()
        assert time_name(60, NOW + DAY - 3600) in created  # ahead of time
        assert time_name(3600, NOW + DAY - 3600) in created
        assert time_name(60, NOW - 2 * DAY) not in created  # fine rows older than a day dropped
        st.apply_retention(NOW)
        assert ancient not in partitions()
        with st.engine.sa_engine.connect() as conn:
            plan = "\n".join(
                conn.execute(
                    sa.text(
                        "EXPLAIN SELECT stack_id, sum(count) FROM samples "
                        "WHERE width = 60 AND bucket >= :a AND bucket < :b GROUP BY stack_id"
                    ),
                    {"a": NOW - 3600, "b": NOW},
                ).scalars()
            )
        # Partition pruning: one time partition of the minute tier is read, no other.
        assert time_name(60, NOW - 3600) in plan or time_name(60, NOW - 7200) in plan
        assert "samples_w3600" not in plan and time_name(60, NOW - DAY) not in plan


def time_name(width: int, bucket: int) -> str:
    from collector.store.engines.postgresql import partition_name, partition_span

    span = partition_span(width)
    return partition_name(width, bucket - bucket % span)


def test_one_series_in_one_rolled_up_bucket_is_read_without_merging(store, monkeypatch) -> None:
    fill(store, days=3)
    store.rollup(NOW)
    one = Filters(instances=("i-1",), labels=(("route", "/a"),))  # a single series
    hour = NOW - 2 * DAY - (NOW % HOUR)  # a complete hour: one hourly row per stack
    cases = [  # window, filters, whether its one segment is merged
        ((hour, hour + HOUR), one, False),
        ((hour, hour + 2 * HOUR), one, True),
        ((hour + 1, hour + HOUR + 1), one, True),  # from 10-minute rows, several buckets
        ((hour, hour + HOUR), Filters(hosts=("web-1",)), True),  # several series
    ]
    q = Query(store)
    assert [s.width for s in q.plan(hour, hour + HOUR)] == [3600]
    read = store.engine.stack_counts
    merged: list[bool] = []

    def always_merging(conn, where, *, merge=True):  # type: ignore[no-untyped-def]
        return read(conn, where, merge=True)

    def recording(conn, where, *, merge=True):  # type: ignore[no-untyped-def]
        merged.append(merge)
        return read(conn, where, merge=merge)

    monkeypatch.setattr(store.engine, "stack_counts", always_merging)
    expected = [q.profile(*window, filters) for window, filters, _ in cases]
    assert all(expected)
    monkeypatch.setattr(store.engine, "stack_counts", recording)
    for (window, filters, merge), profile in zip(cases, expected, strict=True):
        merged.clear()
        assert q.profile(*window, filters) == profile
        assert merged == [merge], window


def test_buckets_a_series_may_hold_in_a_segment() -> None:
    from collector.store.reads import buckets_of_series
    from collector.store.tiers import Segment

    always = (0, 10**9)
    assert buckets_of_series(Segment(60, 100, 161), *always) == 1  # unaligned: only 120 in it
    assert buckets_of_series(Segment(60, 120, 181), *always) == 2
    assert buckets_of_series(Segment(600, 0, 1200), 180, 960) == 2  # rows at 0 and 600
    assert buckets_of_series(Segment(600, 0, 1200), 660, 960) == 1  # its rows start at 600
    assert buckets_of_series(Segment(60, 0, 600), 1980, 3000) == 0  # no rows there


def test_sqlite_gives_the_space_of_expired_rows_back(sqlite_url: str, tmp_path) -> None:
    import sqlite3

    def pages(path: str) -> tuple[int, int]:
        with sqlite3.connect(path) as conn:
            return (
                conn.execute("PRAGMA page_count").fetchone()[0],
                conn.execute("PRAGMA freelist_count").fetchone()[0],
            )

    path = sqlite_url.removeprefix("sqlite:///")
    with Store(sqlite_url) as st:
        st.migrate()
        fill(st, days=3)
        st.rollup(NOW)
        full, _ = pages(path)
        st.apply_retention(NOW + 40 * DAY)  # everything expires
        left, free = pages(path)
    assert left < full / 2 and free <= left / 5  # the file shrank; a fifth may stay free
    # A file from before incremental auto-vacuum keeps working, and keeps its pages.
    old = tmp_path / "old.db"
    with sqlite3.connect(old) as conn:
        conn.execute("CREATE TABLE placeholder (x)")  # its first table: auto-vacuum stays off
    with Store(f"sqlite:///{old}") as st:
        st.migrate()
        fill(st, days=1)
        st.rollup(NOW)
        st.apply_retention(NOW + 40 * DAY)
        assert st.engine.reclaim_space() == 0
        assert Query(st).profile(T0, NOW) == {}
