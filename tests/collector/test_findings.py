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


def rows():
    rng = np.random.default_rng(8)
    out = []
    for minute in range(-180, 5):  # three hours of 1.4.1, then five minutes of 1.4.2
        bucket = DEPLOY + 60 * minute
        version = "1.4.2" if minute >= 0 else "1.4.1"
        render = 0.25 if version == "1.4.2" else 0.15  # +10 points in 1.4.2
        for index in range(4):
            share = rng.beta(render * 400, (1 - render) * 400)
            counts = rng.multinomial(1000, [share, 1 - share])
            for stack, count in ((RENDER, counts[0]), (OTHER, counts[1])):
                out.append(
                    SampleRow(
                        bucket,
                        "cpu",
                        "shop",
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
