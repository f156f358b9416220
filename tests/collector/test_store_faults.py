"""Faults at the store: bad input, hostile strings, a write failing or killed half way, outages, locks."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import sqlalchemy as sa
from storehelpers import T0, TcpProxy, row, store_fixture  # noqa: F401  (the `store` fixture)

from collector.query import Query
from collector.store import (
    CursorUpdate,
    InvalidRow,
    Limits,
    SampleRow,
    StackHashCollision,
    Store,
    StoreError,
    StoreUnavailable,
)
from collector.store.rows import stack_id


def count_rows(store: Store, table: str) -> int:
    with store.engine.sa_engine.connect() as conn:
        return conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()


HOSTILE_FRAMES = [
    'app:it\'s "quoted"',
    "app:back\\slash",
    "app:'; DROP TABLE samples; --",
    "app:ünïcödé 漢字 🔥",
    "app:percent %3B escaped %25",
    "app:with spaces and (parens) [brackets] {braces}",
    "x" * 5000,
]


def test_hostile_strings_round_trip_exactly(store: Store) -> None:
    stack = ";".join(HOSTILE_FRAMES)
    labels = {"route": "/a?b=c&d='e'", "emoji 🔥": "tab\there\nnewline", "k": "v" * 1000}
    store.write(
        [row(T0, stack, 3, labels=labels, service="svc 'x'", host='h"1', instance="i;1")],
        [CursorUpdate("h:1", "i;1", True, {(0, stack): 3}, {0: labels})],
    )
    q = Query(store)
    assert q.profile(T0, T0 + 60) == {stack: 3}
    values = q.label_values(T0, T0 + 60)
    assert values["emoji 🔥"] == ["tab\there\nnewline"]
    assert values["service"] == ["svc 'x'"]
    assert store.load_cursors()["h:1"].label_sets == {0: labels}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (dict(count=0), "count 0"),
        (dict(count=-5), "count -5"),
        (dict(count=10**12), "outside"),
        (dict(count=True), "must be an integer"),
        (dict(count=2.5), "must be an integer"),
        (dict(bucket=T0 + 7), "not a multiple"),
        (dict(bucket=-60), "outside"),
        (dict(mode="gpu"), "mode"),
        (dict(service=None), "service must be a string"),
        (dict(host="h" * 300), "limit is 256"),
        (dict(instance="a\x00b"), "NUL"),
        (dict(stack=""), "empty"),
        (dict(stack="a;;b"), "empty frame"),
        (dict(stack="a;b\nc"), "control character"),
        (dict(stack="a;\ud800"), "control character"),
        (dict(stack="a;" + "b" * 70000), "limit"),
        (dict(labels={"k": "v" * 2000}), "limit is 1024"),
        (dict(labels={"k": "\x00"}), "NUL"),
        (dict(labels={"": "v"}), "empty"),
        (dict(labels={"k": 5}), "must be a string"),
        (dict(labels={f"k{i}": "v" for i in range(100)}), "100 labels"),
        (dict(labels=["not", "a", "mapping"]), "mapping"),
    ],
)
def test_bad_rows_are_refused_and_nothing_is_written(store: Store, bad: dict, message: str) -> None:
    good = row(T0, "a;b", 1)
    fields = {**good.__dict__, **bad}
    with pytest.raises(InvalidRow, match=message) as caught:
        store.write([good, SampleRow(**fields)], [CursorUpdate("t:1", "i", True, {(0, "a;b"): 1})])
    assert caught.value.index == 1
    assert isinstance(caught.value, StoreError)
    assert count_rows(store, "samples") == count_rows(store, "cursor_log") == 0
    assert count_rows(store, "stacks") == 0


@pytest.mark.parametrize(
    "update",
    [
        CursorUpdate("t:1", "i", False, {(0, "a"): -1}),
        CursorUpdate("t:1", "i", False, {(0, "a"): 2**63}),
        CursorUpdate("t:1", "i", False, {("0", "a"): 1}),
        CursorUpdate("t:1", "i", False, {(0, "a\x00"): 1}),
        CursorUpdate("t:1\x00", "i", False, {}),
        CursorUpdate("t:1", "i", False, {}, {0: {"k": "\ud800"}}),
    ],
)
def test_bad_cursor_updates_are_refused(store: Store, update: CursorUpdate) -> None:
    with pytest.raises(InvalidRow):
        store.write([row(T0, "a", 1)], [update])
    assert count_rows(store, "samples") == 0


def test_sums_past_the_count_limit_are_refused(db_url: str) -> None:
    with Store(db_url, limits=Limits(max_count=100)) as st:
        st.migrate()
        with pytest.raises(InvalidRow, match="absurd"):
            st.write([row(T0, "a", 60), row(T0, "a", 60)])


def test_a_stack_hash_collision_is_detected(store: Store) -> None:
    with store.engine.sa_engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO stacks (id, folded) VALUES (:id, 'not;this;stack')"),
            {"id": stack_id("a;b")},
        )
    with pytest.raises(StackHashCollision):
        store.write([row(T0, "a;b", 1)])
    assert count_rows(store, "samples") == 0


def test_a_failure_between_statements_rolls_everything_back(store: Store) -> None:
    """A real exception raised after the samples are written, before the cursors."""
    store.write([row(T0, "a;b", 1)], [CursorUpdate("t:1", "i", True, {(0, "a;b"): 1})])

    def fail_on_cursors(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        if "cursor_log" in statement and statement.lstrip().upper().startswith("INSERT"):
            raise RuntimeError("injected failure")

    engine = store.engine.sa_engine
    sa.event.listen(engine, "before_cursor_execute", fail_on_cursors)
    second = [row(T0 + 60, "a;b", 5), row(T0 + 60, "a;b;new", 2, instance="i-2")]
    update = CursorUpdate("t:1", "i", False, {(0, "a;b"): 6, (0, "a;b;new"): 2})
    try:
        with pytest.raises(RuntimeError, match="injected failure"):
            store.write(second, [update])
    finally:
        sa.event.remove(engine, "before_cursor_execute", fail_on_cursors)
    q = Query(store)
    assert q.profile(T0, T0 + 120) == {"a;b": 1}
    assert store.load_cursors()["t:1"].counts == {(0, "a;b"): 1}
    assert count_rows(store, "stacks") == 1 and count_rows(store, "series") == 1
    # The retry stores everything: the writer did not remember the rolled-back stack.
    store.write(second, [update])
    assert q.profile(T0, T0 + 120) == {"a;b": 6, "a;b;new": 2}
    assert store.load_cursors()["t:1"].counts == {(0, "a;b"): 6, (0, "a;b;new"): 2}


CRASHING_WRITER = textwrap.dedent(
    """
    import os, sys
    import sqlalchemy as sa
    from collector.store import CursorUpdate, SampleRow, Store

    url, t0 = sys.argv[1], int(sys.argv[2])
    store = Store(url)
    rows = [SampleRow(t0, "cpu", "api", "h", "i", {}, "a;b", 1)]
    store.write(rows, [CursorUpdate("t:1", "i", True, {(0, "a;b"): 1})])

    def die(conn, cursor, statement, *args):
        if "cursor_log" in statement and statement.lstrip().upper().startswith("INSERT"):
            os._exit(17)  # killed mid-write: no rollback, no cleanup

    sa.event.listen(store.engine.sa_engine, "before_cursor_execute", die)
    rows = [SampleRow(t0 + 60, "cpu", "api", "h", "i", {}, "a;b", 5)]
    store.write(rows, [CursorUpdate("t:1", "i", False, {(0, "a;b"): 6})])
    """
)


def test_a_collector_killed_mid_write_loses_and_doubles_nothing(store: Store) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, store.engine.url, str(T0)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 17, result.stderr
    # The database holds the first write and its cursor, exactly: the poller resumes from
    # cumulative count 1 and stores the 5 new samples once.
    assert Query(store).profile(T0, T0 + 120) == {"a;b": 1}
    assert store.load_cursors()["t:1"].counts == {(0, "a;b"): 1}
    store.write([row(T0 + 60, "a;b", 5)], [CursorUpdate("t:1", "i", False, {(0, "a;b"): 6})])
    assert Query(store).profile(T0, T0 + 120) == {"a;b": 6}


def test_postgresql_unreachable_is_store_unavailable() -> None:
    proxy = TcpProxy(target_port=1)  # only used to find a free, closed port
    url = f"postgresql+psycopg://postgres@127.0.0.1:{proxy.port}/test"
    with Store(url, connect_timeout=2) as st:
        with pytest.raises(StoreUnavailable):
            st.migrate()
        with pytest.raises(StoreUnavailable, match="unavailable"):
            st.write([row(T0, "a", 1)])
        with pytest.raises(StoreUnavailable):
            Query(st).profile(T0, T0 + 60)


def test_postgresql_outage_and_recovery(pg_url: str) -> None:
    proxy = TcpProxy(target_port=5432)
    proxy.start()
    url = pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    try:
        with Store(url, connect_timeout=2) as st:
            st.migrate()
            st.write([row(T0, "a", 1)], [CursorUpdate("t:1", "i", True, {(0, "a"): 1})])
            proxy.stop()  # the database goes away, pooled connections die
            batch = [row(T0 + 60, "a", 2)], [CursorUpdate("t:1", "i", False, {(0, "a"): 3})]
            with pytest.raises(StoreUnavailable):
                st.write(*batch)
            with pytest.raises(StoreUnavailable):
                st.write(*batch)
            proxy.start()  # it comes back: the same call now succeeds, exactly once
            st.write(*batch)
            assert Query(st).profile(T0, T0 + 120) == {"a": 3}
            assert st.load_cursors()["t:1"].counts == {(0, "a"): 3}
    finally:
        proxy.stop()


def test_sqlite_in_a_missing_folder_is_named_at_start_and_unavailable_once_running(
    tmp_path,
) -> None:
    # No folder at start: a setting to correct, named (it was retried forever as an outage).
    with pytest.raises(StoreError, match=f"no folder {tmp_path}/missing for the SQLite file"):
        Store(f"sqlite:///{tmp_path}/missing/x.db")
    # Gone once running (a volume lost): an outage, the writes retried.
    (tmp_path / "gone").mkdir()
    with Store(f"sqlite:///{tmp_path}/gone/x.db") as st:
        (tmp_path / "gone").rmdir()
        with pytest.raises(StoreUnavailable):
            st.write([row(T0, "a", 1)])


def test_another_bucket_width_on_a_database_is_refused(tmp_path) -> None:
    # Stored beside the first width's rows, each reader (collector, web UI) showed one of them.
    url = f"sqlite:///{tmp_path}/x.db"
    with Store(url) as st:
        st.migrate()
        st.write([row(T0, "a", 1)])
    with Store(url, bucket_seconds=120) as other:
        with pytest.raises(StoreError, match="holds 60-second buckets, and bucket_seconds is 120"):
            other.migrate()
        with pytest.raises(StoreError, match="set bucket_seconds = 60"):
            other.check_bucket_seconds()
    with Store(url) as same:
        same.migrate()
        same.check_bucket_seconds()


def hold_read_snapshot(store: Store):  # type: ignore[no-untyped-def]
    """Opens a second connection holding a read transaction on samples; returns it."""
    if store.dialect == "sqlite":
        path = store.engine.sa_engine.url.database
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM samples").fetchone()
        return conn
    conn = store.engine.sa_engine.connect()
    conn.exec_driver_sql("BEGIN ISOLATION LEVEL REPEATABLE READ")
    conn.exec_driver_sql("SELECT count(*) FROM samples").fetchone()
    return conn


def test_a_reader_holding_the_database_does_not_block_writes(db_url: str) -> None:
    with Store(db_url, busy_timeout=2.0) as st:
        st.migrate()
        st.write([row(T0, "a", 1)])
        reader = hold_read_snapshot(st)
        try:
            st.write([row(T0 + 60, "a", 2)])  # fails at once with SQLITE_BUSY without WAL
            assert Query(st).profile(T0, T0 + 120) == {"a": 3}
            first = reader.exec_driver_sql if hasattr(reader, "exec_driver_sql") else reader.execute
            assert first("SELECT sum(count) FROM samples").fetchone()[0] == 1  # its snapshot
        finally:
            reader.close()


def lock_for(store: Store, seconds: float, locked: threading.Event) -> threading.Thread:
    """Holds the write lock (SQLite) or an exclusive table lock (PostgreSQL) for a while."""

    def hold() -> None:
        if store.dialect == "sqlite":
            conn = sqlite3.connect(store.engine.sa_engine.url.database, isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
        else:
            conn = store.engine.sa_engine.raw_connection()
            conn.cursor().execute("LOCK TABLE tiers IN ACCESS EXCLUSIVE MODE")
        locked.set()
        time.sleep(seconds)
        conn.rollback()
        conn.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert locked.wait(30)
    return thread


def test_a_short_lock_is_waited_for(db_url: str) -> None:
    with Store(db_url, busy_timeout=60.0) as st:
        st.migrate()
        st.write([row(T0, "a", 1)])
        holder = lock_for(st, 1.0, threading.Event())
        st.write([row(T0, "a", 1)])
        holder.join()
        assert Query(st).profile(T0, T0 + 60) == {"a": 2}


def test_a_lock_held_too_long_is_store_unavailable_then_recovers(db_url: str) -> None:
    with Store(db_url, busy_timeout=0.3) as st:
        st.migrate()
        holder = lock_for(st, 1.5, threading.Event())
        try:
            with pytest.raises(StoreUnavailable):
                st.write([row(T0, "a", 1)], [CursorUpdate("t:1", "i", True, {(0, "a"): 1})])
        finally:
            holder.join()
        st.write([row(T0, "a", 1)], [CursorUpdate("t:1", "i", True, {(0, "a"): 1})])
        assert Query(st).profile(T0, T0 + 60) == {"a": 1}
        assert st.load_cursors()["t:1"].counts == {(0, "a"): 1}
