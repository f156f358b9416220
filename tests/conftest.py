"""Fixtures shared by every test: database URLs on both engines."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

# The web UI saves its stack index in the user's cache directory by default: tests that want
# it say where (a file shared between tests would make what one reads depend on another).
os.environ["FLEETFLAME_WEB_INDEX_DIR"] = ""

# The local PostgreSQL server (trust auth); CI starts it when it is down.
PG_ADMIN_URL = os.environ.get(
    "FLEETFLAME_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


# Tests that measure wall or CPU time, sampled counts or shares, latency or overhead: a
# neighbour busy on the other core would skew them, so `make test` runs them by themselves, one
# at a time, after the rest (which run on two processes at once); `pytest -m alone` selects
# them. In the folders named here most tests measure, so a test there is alone unless it, or its
# module, carries `pytest.mark.parallel` (it measures none of these: settings, parsing, formats,
# crashes); a new test there stays alone until someone reads it and decides. Anywhere else, and
# over a module's `parallel`, a test that measures carries `pytest.mark.alone` itself.
ALONE = ("tests/sampler/", "tests/middleware/")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        # Node ids are relative to the root.
        if item.nodeid.startswith(ALONE) and item.get_closest_marker("parallel") is None:
            item.add_marker(pytest.mark.alone)


@contextmanager
def _fresh_pg_database(template: str | None = None) -> Iterator[str]:
    """Yields the URL of a new PostgreSQL database (a copy of ``template``), dropped afterwards."""
    import sqlalchemy as sa

    name = f"fleetflame_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        copy = f' TEMPLATE "{template}"' if template else ""
        conn.execute(sa.text(f'CREATE DATABASE "{name}"{copy}'))
        # Test data need no durability: commits need not wait for the disk (tests of a crash
        # kill the collector, not the server, so this changes nothing they check).
        conn.execute(sa.text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """Yields the URL of a fresh PostgreSQL database, dropped afterwards."""
    with _fresh_pg_database() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """Returns the URL of a SQLite file in the test's temporary folder."""
    return f"sqlite:///{tmp_path / 'fleetflame.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """A database URL on each engine in turn: every storage test runs on both."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


# Migrating a database takes ~0.3 s on PostgreSQL and ~0.1 s on SQLite, and well over a hundred
# tests start from a migrated, empty one: each gets a copy of one migrated once per session.


@pytest.fixture(scope="session")
def _migrated_pg_template() -> Iterator[str]:
    """The name of a PostgreSQL database migrated once, to copy test databases from."""
    import sqlalchemy as sa

    from collector.store import Store

    with _fresh_pg_database() as url:
        with Store(url) as store:
            store.migrate()
        name = url.rsplit("/", 1)[1]
        admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            # Copied only while no one is connected to it: autovacuum then leaves it alone too.
            conn.execute(sa.text(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false'))
        admin.dispose()
        yield name


@pytest.fixture(scope="session")
def _migrated_sqlite_file(tmp_path_factory) -> Path:
    """A SQLite file migrated once, to copy test databases from."""
    from collector.store import Store

    path = tmp_path_factory.mktemp("migrated") / "fleetflame.db"
    with Store(f"sqlite:///{path}") as store:
        store.migrate()
    assert not path.with_name(path.name + "-wal").exists()  # all of it in the file
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def migrated_db_url(request, tmp_path) -> Iterator[str]:
    """The URL of a migrated, empty database on each engine in turn (a fresh copy each test)."""
    if request.param == "sqlite":
        path = tmp_path / "fleetflame.db"
        shutil.copyfile(request.getfixturevalue("_migrated_sqlite_file"), path)
        yield f"sqlite:///{path}"
    else:
        with _fresh_pg_database(request.getfixturevalue("_migrated_pg_template")) as url:
            yield url


@pytest.fixture(autouse=True)
def no_sampler_left_behind():
    """Fails any test that leaves a sampler, a timer, a signal handler or a sampler thread behind."""
    import signal
    import threading

    import sampler

    yield
    leftovers = []
    if sampler.running() is not None:
        leftovers.append("a running sampler")
        sampler.stop()
    for signum, timer in (
        (signal.SIGPROF, signal.ITIMER_PROF),
        (signal.SIGALRM, signal.ITIMER_REAL),
    ):
        if signal.getitimer(timer) != (0.0, 0.0):
            leftovers.append(f"an armed {signal.Signals(signum).name} timer")
            signal.setitimer(timer, 0, 0)
        if signal.getsignal(signum) not in (signal.SIG_DFL, signal.SIG_IGN, None):
            leftovers.append(f"a {signal.Signals(signum).name} handler")
            signal.signal(signum, signal.SIG_DFL)
    threads = [
        t.name for t in threading.enumerate() if t.name.startswith("fleetflame-") and t.is_alive()
    ]
    if threads:
        leftovers.append(f"threads {threads}")
    assert not leftovers, "test left behind " + ", ".join(leftovers)
