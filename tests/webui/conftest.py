"""Fixtures for the web UI tests: a database holding a known fleet profile, and apps over it.

The fleet database is written once per module and engine: the web UI only reads it.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from webhelpers import TIMEOUT, fleet_rows

from collector.store import Store

# bench/ is a folder of scripts: the browser tests launch Chromium with bench/headless.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

PG_ADMIN_URL = os.environ.get(
    "FLEETFLAME_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_db_url(request, tmp_path_factory) -> Iterator[str]:
    """An empty database on each engine, made once per module (its tests only read it)."""
    admin = name = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('fleet') / 'fleetflame.db'}"
    else:
        name = f"fleetflame_test_{uuid.uuid4().hex[:12]}"
        admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
            # Test data need no durability (see tests/conftest.py's pg_url).
            conn.execute(sa.text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
        url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    try:
        yield url
    finally:
        if admin is not None:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


@pytest.fixture(scope="module")
def fleet_url(module_db_url: str) -> str:
    """A database on each engine holding an hour of FLEET, written by the collector's store."""
    store = Store(module_db_url)
    store.migrate()
    store.write(fleet_rows())
    store.close()
    return module_db_url


@pytest.fixture
def app(fleet_url: str):
    """The web app over the fleet database."""
    from webui import create_app

    application = create_app({"DATABASE_URL": fleet_url, "CACHE_ENTRIES": 4})
    yield application
    application.extensions["fleetflame_db"].close()


@pytest.fixture
def client(app):
    """A test client of the app."""
    return app.test_client()


@pytest.fixture
def make_app():
    """Builds apps from config overrides; closes their database pools afterwards."""
    from webui import create_app

    apps = []

    def build(config):
        application = create_app(config)
        apps.append(application)
        return application

    yield build
    for application in apps:
        application.extensions["fleetflame_db"].close()


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for a module's browser tests."""
    from headless import launch_chromium
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A browser page in a context of its own; the test fails on any JavaScript error it raised.

    ``page.errors`` and ``page.dialogs`` hold the errors and the messages of the dialogs
    (dismissed) so far.
    """
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.errors, page.dialogs = errors, dialogs
    yield page
    context.close()
    assert errors == [], f"JavaScript errors: {errors}"
