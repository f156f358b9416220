"""The worker view's /api/live: a real worker, polled once by a real collector, then recorded
live through the web UI; only instances the collector polls are reachable."""

import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "collector"))

from pollhelpers import collector_settings, ready_worker  # noqa: E402

from collector.service import Collector  # noqa: E402

WORKER = r"""
import sys, time
import sampler

sampler.start(port=int(sys.argv[1]), service="live")


def busy_in_the_worker():
    end = time.thread_time() + 0.05
    while time.thread_time() < end:
        pass


print("ready", flush=True)
while True:
    busy_in_the_worker()
    time.sleep(0.01)
"""


@pytest.fixture(scope="module")
def polled(tmp_path_factory):
    """A database the collector polled a live worker into, and the worker's instance id."""
    with ready_worker(WORKER) as (worker, port):
        time.sleep(0.3)
        url = f"sqlite:///{tmp_path_factory.mktemp('live') / 'fleetflame.db'}"
        collector = Collector(collector_settings(url, [f"127.0.0.1:{port}"]))
        collector.migrate()
        try:
            collector.poll_cycle()
        finally:
            collector.stop()
        from collector.store import Store

        with Store(url) as store, store.engine.read_transaction() as conn:
            import sqlalchemy as sa

            from collector.store import schema

            (instance,) = conn.execute(sa.select(schema.cursor_targets.c.instance)).scalars()
        yield url, instance, worker


@pytest.fixture
def client(polled):
    from webui import create_app

    app = create_app({"DATABASE_URL": polled[0]})
    yield app.test_client()
    app.extensions["fleetflame_db"].close()


def test_a_polled_worker_is_recorded_live(polled, client):
    answer = client.get("/api/live", query_string={"instance": polled[1], "seconds": 1})
    assert answer.status_code == 200, answer.data[:300]
    data = answer.json
    assert data["seconds"] == 1 and data["total"] >= 10  # ~0.8 s of CPU at 100 Hz
    assert "busy_in_the_worker" in str(data["tree"])


def test_the_workers_the_collector_polls_are_listed_latest_first(polled, tmp_path):
    import shutil

    import sqlalchemy as sa

    from collector.store import schema
    from webui import create_app

    # Beside the live worker: one sampled an hour ago, and one with no samples stored yet.
    path = tmp_path / "workers.db"
    shutil.copy(polled[0].removeprefix("sqlite:///"), path)
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        live = dict(conn.execute(sa.select(schema.series)).mappings().first())
        hour_ago = live["last_bucket"] - 3600
        old = {**live, "id": live["id"] + 1, "instance": "old-1", "host": "h-old"}
        conn.execute(schema.series.insert(), [{**old, "last_bucket": hour_ago}])
        conn.execute(
            schema.cursor_targets.insert(),
            [
                {"target": "127.0.0.1:1", "instance": "old-1"},
                {"target": "127.0.0.1:2", "instance": "new-1"},
            ],
        )
    engine.dispose()
    app = create_app({"DATABASE_URL": f"sqlite:///{path}"})
    try:
        workers = app.test_client().get("/api/workers").json["workers"]
    finally:
        app.extensions["fleetflame_db"].close()
    assert [w["instance"] for w in workers] == [polled[1], "old-1", "new-1"]
    first, second, third = workers
    assert first["service"] == "live" and first["target"].startswith("127.0.0.1:")
    assert first["last"] > time.time() - 600
    assert (second["host"], second["last"], second["target"]) == ("h-old", hour_ago, "127.0.0.1:1")
    assert (third["service"], third["last"]) == ("", None)


@pytest.mark.parametrize(
    "query, status",
    [
        ({"instance": "not-polled"}, 400),
        ({}, 400),
        ({"instance": "x", "seconds": "600"}, 400),
    ],
)
def test_only_polled_instances_are_reachable(client, query, status):
    answer = client.get("/api/live", query_string=query)
    assert answer.status_code == status and "error" in answer.json


@pytest.mark.browser
def test_the_worker_page_records_and_draws(polled):
    import threading

    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    from webui import create_app

    if polled[2].poll() is not None:
        pytest.skip("the worker was stopped by an earlier test of this module")
    app = create_app({"DATABASE_URL": polled[0]})
    httpd = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page()
            page.set_default_timeout(30_000)
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"http://127.0.0.1:{httpd.server_port}/worker?seconds=1")
            page.wait_for_selector("body[data-state=ready]")
            page.select_option("#instance", polled[1])
            # Named by its service and address, not by its instance id alone.
            assert page.locator("#instance option").first.inner_text().startswith("live on ")
            page.click("#record")
            page.wait_for_selector("#chart g.frame[name='__main__:busy_in_the_worker']")
            assert "samples from 127.0.0.1:" in page.locator("#summary").inner_text()
            browser.close()
            assert errors == []
    finally:
        httpd.shutdown()
        thread.join(timeout=10)
        httpd.server_close()
        app.extensions["fleetflame_db"].close()


def test_a_worker_that_is_gone_is_a_clear_error(polled, client):
    polled[2].kill()
    polled[2].wait()
    answer = client.get("/api/live", query_string={"instance": polled[1], "seconds": 1})
    assert answer.status_code == 504 and "did not answer" in answer.json["error"]


def _client_with_targets(tmp_path, targets):
    """A client over a new store that lists ``targets`` ({instance: target}) as polled."""
    import sqlalchemy as sa

    from collector.store import Store, schema
    from webui import create_app

    url = f"sqlite:///{tmp_path / 'targets.db'}"
    with Store(url) as store:
        store.migrate()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        rows = [{"target": target, "instance": inst} for inst, target in targets.items()]
        conn.execute(schema.cursor_targets.insert(), rows)
    engine.dispose()
    return create_app({"DATABASE_URL": url})


def test_a_stored_target_that_is_no_address_is_a_clear_error(tmp_path):
    # http.client.InvalidURL is no OSError: these were 500s of an HTML page.
    targets = {"spaced": "127.0.0.1:1 x", "port": "127.0.0.1:port", "v6": "[::1"}
    app = _client_with_targets(tmp_path, targets)
    try:
        for instance, target in targets.items():
            answer = app.test_client().get("/api/live", query_string={"instance": instance})
            assert answer.status_code == 502, answer.data[:300]
            assert (
                repr(target) in answer.json["error"] and "cannot be asked" in answer.json["error"]
            )
    finally:
        app.extensions["fleetflame_db"].close()


BROKEN_ANSWERS = {
    "no http": b"no http here\r\n\r\n",
    # http.client reads it as an answer cut short (IncompleteRead), not as a ValueError.
    "a chunk size that is no number": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
    ),
}


@pytest.mark.parametrize("garbage", list(BROKEN_ANSWERS.values()), ids=list(BROKEN_ANSWERS))
def test_a_worker_that_answers_no_http_is_a_clear_error(tmp_path, garbage):
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_garbage():
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(garbage)

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    app = _client_with_targets(tmp_path, {"odd": f"127.0.0.1:{port}"})
    try:
        answer = app.test_client().get("/api/live", query_string={"instance": "odd", "seconds": 1})
        assert answer.status_code == 502, answer.data[:300]
        assert "did not answer HTTP" in answer.json["error"]
    finally:
        app.extensions["fleetflame_db"].close()
        thread.join(timeout=10)
        listener.close()
