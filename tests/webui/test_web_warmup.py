"""Warming the stack index when a process first opens the database."""

from __future__ import annotations

import logging
import os
import threading
import time

from webhelpers import FLEET, T0

from webui import db
from webui.db import Database
from webui.params import Selection
from webui.warmup import THREAD_NAME

DISTINCT = len({stack for stacks in FLEET.values() for stack in stacks})


def reads_of(database: Database) -> list[list[int]]:
    """Records every read of stack text the database's index makes from now on."""
    reads: list[list[int]] = []
    index = database.index
    real = index.read_lines
    index.read_lines = lambda ids: reads.append(ids) or real(ids)
    return reads


def test_the_stacks_of_the_last_hours_are_known_before_the_first_view(fleet_url):
    # The fleet's hour of samples ended 30 minutes ago.
    database = Database(fleet_url, warm_hours=2, clock=lambda: T0 + 5400)
    try:
        assert database.warmer is None  # nothing opened yet (a preloading server forks later)
        database.open()  # it opens on first use otherwise
        assert database.warmer is not None and database.warmer.wait(30)
        assert database.warmer.learned == len(database.index) == DISTINCT
        reads = reads_of(database)
        tree, _interval = database.sorted_stacks(Selection(T0, T0 + 3600))
        assert len(tree.keys) == DISTINCT and reads == []
        # The function index too: the first table reads no stack text either.
        assert database.warmer.functions_learned == len(database.functions) == DISTINCT
        functions = database.functions
        functions.read_lines = lambda ids: reads.append(ids) or ([], "")  # type: ignore[method-assign]
        samples, _interval = database.function_samples(Selection(T0, T0 + 3600), limit=3)
        assert reads == [] and sum(samples.self_counts.values()) == samples.total > 0
    finally:
        database.close()
    assert not any(t.name == THREAD_NAME for t in threading.enumerate())


def test_stacks_older_than_the_warm_window_are_left_to_the_requests(fleet_url):
    database = Database(fleet_url, warm_hours=1, clock=lambda: T0 + 4 * 3600)
    try:
        database.open()
        assert database.warmer is not None and database.warmer.wait(30)
        assert database.warmer.learned == len(database.index) == 0
        reads = reads_of(database)
        database.sorted_stacks(Selection(T0, T0 + 3600))
        assert len(reads) == 1
    finally:
        database.close()


def test_warming_off(fleet_url):
    database = Database(fleet_url, warm_hours=0, clock=lambda: T0 + 5400)
    try:
        assert len(database.index) == 0 and database.warmer is None
    finally:
        database.close()


def test_an_unavailable_database_is_logged_and_the_app_still_answers(make_app, caplog):
    app = make_app({"DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"})
    with caplog.at_level(logging.WARNING, logger="webui.warmup"):
        response = app.test_client().get("/api/flamegraph?from=-1h")
        assert response.status_code == 503
        warmer = app.extensions["fleetflame_db"].warmer
        assert warmer is not None and warmer.wait(30) and warmer.learned == 0
    assert "could not warm the stack index" in caplog.text


def test_closing_stops_warming_between_hours(fleet_url, monkeypatch):
    from collector.query import Query

    hours = []
    real = Query.recent_stacks

    def slow_hour(self, start, end):  # an hour a second: warming 48 hours takes long
        hours.append(start)
        time.sleep(0.2)
        return real(self, start, end)

    monkeypatch.setattr(Query, "recent_stacks", slow_hour)
    database = Database(fleet_url, warm_hours=48, clock=lambda: T0 + 5400)
    try:
        database.open()
        assert database.warmer is not None and not database.warmer.wait(0.5)
        began = time.monotonic()
    finally:
        database.close()
    assert time.monotonic() - began < 1
    assert 0 < len(hours) < 10
    assert not any(t.name == THREAD_NAME for t in threading.enumerate())


def test_a_forked_child_opens_its_own_store_and_warms_again(fleet_url):
    database = Database(fleet_url, warm_hours=2, clock=lambda: T0 + 5400)
    try:
        database.open()
        assert database.warmer is not None and database.warmer.wait(30)
        database.serving(+1)  # forked while serving: the child serves none of it
        pid = os.fork()
        if pid == 0:  # the child: report by exit status only
            ok = False
            try:
                fresh = database.warmer is None and database._store is None
                database.open()
                warmer = database.warmer
                ok = fresh and warmer is not None and warmer.wait(30)
                ok = ok and warmer.learned == DISTINCT
                ok = ok and sum(database.profile(Selection(T0, T0 + 3600)).values()) > 0
            finally:
                os._exit(0 if ok else 1)
        database.serving(-1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's connections still work: the child did not close them.
        assert sum(database.profile(Selection(T0, T0 + 60)).values()) > 0
    finally:
        database.close()


def test_fleetflame_web_opens_the_database_at_start(fleet_url, monkeypatch):
    import werkzeug.serving

    from webui.cli import main

    served = []
    monkeypatch.setattr(werkzeug.serving, "run_simple", lambda *a, **k: served.append(a[2]))
    assert main(["--database-url", fleet_url, "--port", "0"]) == 0
    database = served[0].extensions["fleetflame_db"]
    try:
        assert database.warmer is not None and database.warmer.wait(30)
    finally:
        database.close()


def test_warming_waits_while_a_request_is_served(fleet_url):
    database = Database(fleet_url, warm_hours=2, clock=lambda: T0 + 5400)
    try:
        database.serving(+1)  # a request in flight from the start: it learns what it needs
        database.open()
        warmer = database.warmer
        assert warmer is not None
        assert not warmer.wait(0.3) and warmer.learned == warmer.functions_learned == 0
        database.serving(-1)
        assert warmer.wait(30) and warmer.learned == DISTINCT
        assert warmer.functions_learned == DISTINCT
    finally:
        database.close()


def test_requests_in_flight_are_counted(make_app, fleet_url, monkeypatch):
    app = make_app({"DATABASE_URL": fleet_url, "WARM_HOURS": 0})
    database = app.extensions["fleetflame_db"]
    client = app.test_client()
    monkeypatch.setattr(db, "QUIET_SECONDS", 0.0)
    assert client.get("/healthz").status_code == 200
    assert database.idle()  # a load balancer's look is not a visitor's request
    monkeypatch.setattr(db, "QUIET_SECONDS", 60.0)
    assert database.idle()
    assert client.get(f"/api/top?from={T0}&to={T0 + 60}").status_code == 200
    assert client.get("/api/top?from=never").status_code == 400
    assert client.get("/api/nothing").status_code == 404
    # Idle once no request has come for a moment: not in the gaps between a page's requests.
    assert database._in_flight == 0 and not database.idle()
    monkeypatch.setattr(db, "QUIET_SECONDS", 0.0)
    assert database.idle()


def test_a_server_never_quiet_works_in_the_gaps_between_requests(fleet_url, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(db.time, "monotonic", lambda: now[0])
    database = Database(fleet_url, warm_hours=0)
    try:
        for _ in range(int(db.QUIET_PATIENCE / 0.2) - 1):  # a request every 0.2 s
            database.serving(+1)
            now[0] += 0.1
            database.serving(-1)
            now[0] += 0.1
            assert not database.idle()
        now[0] += 0.35  # still no pause (0.45 s since the last request)
        assert database.idle()  # but a minute without one: the gaps will do
        database.serving(+1)
        assert not database.idle()  # never while one is served
        database.serving(-1)
        now[0] += db.QUIET_SECONDS
        assert database.idle()  # a pause again, and patience starts over
        database.serving(+1)
        database.serving(-1)
        assert not database.idle()
    finally:
        database.close()
