"""Moving a store between databases (SQLite -> PostgreSQL and back) with collector.migrate_db."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sqlalchemy as sa

from collector import migrate_db
from collector.query import Filters, Query
from collector.store import CursorUpdate, SampleRow, Store, schema

T0 = 1_795_420_800  # a multiple of every bucket width, UTC midnight


def _fill(url: str) -> dict[str, int]:
    """Writes two days of samples, label sets and cursors; returns the profile of it all."""
    store = Store(url)
    store.migrate()  # closed at the end of _fill
    for hour in range(0, 48, 3):
        rows = [
            SampleRow(
                bucket=T0 + hour * 3600 + minute * 60,
                mode=mode,
                service=service,
                host=f"web-{i}",
                instance=f"inst-{i}",
                labels={"version": "1.4.1" if hour < 24 else "1.4.2", "route": "/x;y"},
                stack=f"app:main;app:handle;lib:f{(hour + i) % 7}",
                count=1 + hour + i + minute,
            )
            for i in range(3)
            for minute in range(2)
            for mode in ("cpu", "wall")
            for service in ("api", "jobs")
        ]
        store.write(rows)
    store.write(
        [],
        [
            CursorUpdate(
                target="127.0.0.1:8021",
                instance="inst-0",
                replaced=True,
                counts={(0, "app:main;app:handle"): 41, (1, "app:main;lib:f1"): 7},
                label_sets={0: {}, 1: {"route": "/x"}},
            )
        ],
    )
    store.rollup(T0 + 10 * 86400)  # coarser tiers get rows too: they must travel as well
    _fill_worst_cases(store)
    profile = Query(store).profile(T0, T0 + 2 * 86400, Filters(services=("api",)))
    store.engine.dispose()
    return profile


def _fill_worst_cases(store: Store) -> None:
    """A stall, two minutes of a route's request figures (and their fleet rows), a finding."""
    from collector.request_rows import SKETCHES
    from collector.worst_rows import add_request_rows
    from sampler._sketch import Sketch

    sketches = json.dumps({name: Sketch().document() for name in SKETCHES})
    slow = json.dumps({"count": 1, "stacks": {"app:main;db:query": 2.0}, "slowest": []})
    stall = {"id": 1, "start": T0 + 5.0, "duration": 0.2, "service": "api", "host": "web-0"}
    stall |= {"instance": "inst-0", "kind": "gil", "thread": "t", "what": "w", "stacks": "{}"}
    finding = {"id": 1, "found_at": T0 + 86400.0, "service": "api", "function": "lib:f1"}
    finding |= {"kind": "self", "a_share": 0.1, "b_share": 0.2, "change": 10.0, "q": 0.001}
    finding |= {"compared": "versions", "a_from": T0, "a_to": T0 + 3600, "b_from": T0 + 3600}
    finding |= {"b_to": T0 + 7200, "a_label": "version:1.4.1", "b_label": "version:1.4.2"}
    finding |= {"link": "/compare", "sent": 0}
    with store.engine.write_transaction() as conn:
        conn.execute(schema.stall_events.insert(), [stall])
        conn.execute(schema.findings.insert(), [finding])
        for minute in range(2):
            row = {"bucket": T0 + 60 * minute, "instance": "inst-0", "route": "/x", "host": "h"}
            row |= {"service": "api", "count": 10, "errors": 1, "sketches": sketches, "slow": slow}
            add_request_rows(conn, [row])


def _counts(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        counts = {
            t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in migrate_db.TABLES
        }
    engine.dispose()
    return counts


@pytest.mark.parametrize("direction", ["sqlite_to_pg", "pg_to_sqlite"])
def test_copy_keeps_every_row_and_every_answer(direction, sqlite_url, pg_url) -> None:
    source, target = (sqlite_url, pg_url) if direction == "sqlite_to_pg" else (pg_url, sqlite_url)
    profile = _fill(source)
    messages: list[str] = []
    copied = migrate_db.copy_store(source, target, batch=7, log=messages.append)

    assert copied == _counts(source) == _counts(target)
    assert copied["samples"] > 100 and copied["cursor_log"] == 1
    worst = ("stall_events", "request_buckets", "request_fleet", "findings")
    assert [copied[name] for name in worst] == [1, 2, 2 + 1 + 1 + 1, 1]
    assert messages[-1].startswith("done in")
    with Store(target) as moved, Store(source) as original:
        query = Query(moved)
        assert query.profile(T0, T0 + 2 * 86400, Filters(services=("api",))) == profile
        wall_new = Filters(mode="wall", labels=(("version", "1.4.2"),))
        assert query.profile(T0, T0 + 2 * 86400, wall_new) == Query(original).profile(
            T0, T0 + 2 * 86400, wall_new
        )
        cursors = moved.load_cursors()
        assert cursors["127.0.0.1:8021"].counts[(0, "app:main;app:handle")] == 41
        # The collector keeps writing into the copy (partitions on PostgreSQL, upserts too).
        now = T0 + 10 * 86400
        moved.write([SampleRow(now, "cpu", "api", "web-0", "inst-0", {}, "app:main;new", 5)])
        assert Query(moved).profile(now, now + 60) == {"app:main;new": 5}


def test_a_target_with_data_is_refused_and_left_alone(sqlite_url, pg_url) -> None:
    _fill(sqlite_url)
    with Store(pg_url) as store:
        store.migrate()
        store.write([SampleRow(T0, "cpu", "api", "h", "i", {}, "keep;me", 3)])
        before = _counts(pg_url)
        with pytest.raises(migrate_db.MigrationError, match="already holds data"):
            migrate_db.copy_store(sqlite_url, pg_url)
        assert _counts(pg_url) == before
        assert Query(store).profile(T0, T0 + 60) == {"keep;me": 3}


def test_a_source_without_schema_or_file_is_refused(tmp_path, pg_url) -> None:
    missing = f"sqlite:///{tmp_path / 'nope.db'}"
    with pytest.raises(migrate_db.MigrationError, match="no SQLite file"):
        migrate_db.copy_store(missing, pg_url)
    assert not (tmp_path / "nope.db").exists()  # the source is never created or written

    empty = tmp_path / "empty.db"
    engine = sa.create_engine(f"sqlite:///{empty}")
    engine.connect().close()
    engine.dispose()
    with pytest.raises(migrate_db.MigrationError, match="no fleetflame schema"):
        migrate_db.copy_store(f"sqlite:///{empty}", pg_url)


def test_a_source_at_another_revision_is_refused(sqlite_url, pg_url) -> None:
    _fill(sqlite_url)
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '0000_old'"))
    engine.dispose()
    with pytest.raises(migrate_db.MigrationError, match="revision 0000_old"):
        migrate_db.copy_store(sqlite_url, pg_url)


def test_an_unreachable_target_is_a_clear_error(sqlite_url) -> None:
    _fill(sqlite_url)
    before = _counts(sqlite_url)
    with pytest.raises(migrate_db.MigrationError, match="unavailable"):
        migrate_db.copy_store(
            sqlite_url, "postgresql+psycopg://postgres@127.0.0.1:1/nowhere?connect_timeout=2"
        )
    assert _counts(sqlite_url) == before


def test_a_failed_copy_rolls_back_to_an_empty_target(sqlite_url, pg_url) -> None:
    _fill(sqlite_url)
    # A stack text PostgreSQL cannot store (a NUL byte) makes the copy fail halfway.
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE stacks SET folded = 'bad' || char(0) || 'stack' "
                "WHERE id = (SELECT min(id) FROM stacks)"
            )
        )
    engine.dispose()
    with pytest.raises(migrate_db.MigrationError):
        migrate_db.copy_store(sqlite_url, pg_url)
    after = _counts(pg_url)
    assert sum(n for name, n in after.items() if name != schema.tiers.name) == 0


def test_the_command_line(sqlite_url, pg_url) -> None:
    _fill(sqlite_url)
    ok = subprocess.run(
        [sys.executable, "-m", "collector.migrate_db", "--from", sqlite_url, "--to", pg_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert "rows of samples" in ok.stdout
    again = subprocess.run(
        [sys.executable, "-m", "collector.migrate_db", "--from", sqlite_url, "--to", pg_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 1
    assert "already holds data" in again.stderr
    assert "Traceback" not in again.stderr
