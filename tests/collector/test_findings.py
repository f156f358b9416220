"""Findings that arrive by themselves: a fleet deploys 1.4.2 with a planted regression; the
scheduled comparison, run 5 minutes after the deploy, records it once, logs it, and a real
webhook receives it (after a failed first attempt, retried)."""

import http.server
import json
import threading

import numpy as np
import pytest

from collector.findings import FindingsJob, WebhookSender
from collector.store import SampleRow, Store

T0 = 1_700_000_000 // 86400 * 86400
DEPLOY = T0 + 86400 + 3600  # a day of 1.4.1 and an hour, then 1.4.2
RENDER = "__main__:<module>;app:serve;app:render"
OTHER = "__main__:<module>;app:serve;db:query"


def rows(service="shop", old="1.4.1", new="1.4.2"):
    rng = np.random.default_rng(8)
    out = []
    for minute in range(-180, 5):  # three hours of 1.4.1, then five minutes of 1.4.2
        bucket = DEPLOY + 60 * minute
        version = new if minute >= 0 else old
        render = 0.25 if version == new else 0.15  # +10 points in 1.4.2
        for index in range(4):
            share = rng.beta(render * 400, (1 - render) * 400)
            counts = rng.multinomial(1000, [share, 1 - share])
            for stack, count in ((RENDER, counts[0]), (OTHER, counts[1])):
                out.append(
                    SampleRow(
                        bucket,
                        "cpu",
                        service,
                        f"web-{index}",
                        f"i-{index}-{version}",
                        {"version": version},
                        stack,
                        int(count),
                        0.01,
                    )
                )
    return out


class Hook(http.server.BaseHTTPRequestHandler):
    received: list = []
    fail_first = [True]

    def do_POST(self):  # noqa: N802 - the standard library's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.fail_first[0]:
            self.fail_first[0] = False
            self.send_response(500)
        else:
            Hook.received.append(body)
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Hook.received.clear()
    Hook.fail_first[0] = True
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()
    thread.join()
    server.server_close()


def test_the_deploys_regression_is_found_once_logged_and_sent(db_url, webhook, caplog):
    store = Store(db_url)
    store.migrate()
    store.write(rows())
    job = None
    sender = None
    try:
        job = FindingsJob(store, window=300, link_base="http://ui.example")
        sender = WebhookSender(webhook, first_delay=0.05, on_sent=job.mark_sent)
        job.webhook = sender
        found = job.run(DEPLOY + 300)
        again = job.run(DEPLOY + 300 + 60)  # the next round finds it again: not new
        for _ in range(100):
            if Hook.received:
                break
            threading.Event().wait(0.05)
    finally:
        if sender is not None:
            sender.stop()
        store.close()
    (render,) = [f for f in found if f["function"] == "app:render" and f["kind"] == "self"]
    assert render["compared"] == "version 1.4.1 -> 1.4.2"
    assert render["change"] == pytest.approx(10.0, abs=2.0) and render["q"] < 0.05
    assert render["link"].startswith("http://ui.example/compare?service=shop")
    assert "b_label=version:1.4.2" in render["link"]
    assert again == []
    assert "regression found" in caplog.text
    (sent,) = [r for r in Hook.received if r["finding"]["function"] == "app:render"]
    assert sent["finding"]["change"] == render["change"]


def test_the_findings_api_lists_them(db_url):
    store = Store(db_url)
    store.migrate()
    store.write(rows())
    try:
        FindingsJob(store, window=300).run(DEPLOY + 300)
    finally:
        store.close()
    from webui import create_app

    app = create_app({"DATABASE_URL": db_url})
    try:
        answer = app.test_client().get(
            "/api/findings", query_string={"from": DEPLOY, "to": DEPLOY + 600, "service": "shop"}
        )
        assert answer.status_code == 200
        functions = {(f["function"], f["kind"]) for f in answer.json["findings"]}
        assert ("app:render", "self") in functions
    finally:
        app.extensions["fleetflame_db"].close()


def test_found_from_the_first_round_after_the_deploy_while_both_versions_run(sqlite_url):
    # 90 s after the deploy the 5-minute window holds both versions (a rollout): the newest
    # is compared with the one before it at once.
    store = Store(sqlite_url)
    store.migrate()
    store.write(rows())
    try:
        found = FindingsJob(store, window=300).run(DEPLOY + 90)
    finally:
        store.close()
    assert [f["compared"] for f in found if f["function"] == "app:render"] == [
        "version 1.4.1 -> 1.4.2"
    ] * len([f for f in found if f["function"] == "app:render"])
    assert any(f["function"] == "app:render" for f in found)


def test_the_link_names_versions_and_services_holding_url_characters(sqlite_url):
    # A '+' (semver build metadata) read as a space, '&' and '#' cut the service: the link
    # opened a comparison of nothing.
    from urllib.parse import parse_qs, urlsplit

    service, old, new = "shop&co #1", "1.4.1+build.7", "1.4.2+build.8"
    store = Store(sqlite_url)
    store.migrate()
    store.write(rows(service, old, new))
    try:
        found = FindingsJob(store, window=300, link_base="http://ui.example").run(DEPLOY + 300)
    finally:
        store.close()
    (render,) = [f for f in found if f["function"] == "app:render" and f["kind"] == "self"]
    link = urlsplit(render["link"])
    assert link.fragment == "" and link.path == "/compare"
    query = parse_qs(link.query)
    assert query["service"] == [service]
    assert query["a_label"] == [f"version:{old}"] and query["b_label"] == [f"version:{new}"]
    assert "b_label=version:1.4.2%2Bbuild.8" in render["link"]
    from webui import create_app

    # The web UI reads the link's query as the comparison the finding made.
    app = create_app({"DATABASE_URL": sqlite_url})
    try:
        answer = app.test_client().get(f"/api/diff?{link.query}")
        assert answer.status_code == 200, answer.data[:300]
        assert answer.json["a"]["label"] == [f"version:{old}"]
        assert answer.json["total_a"] > 0 and answer.json["total_b"] > 0
    finally:
        app.extensions["fleetflame_db"].close()
