"""The collector's /healthz and /metrics, served by the sampler's HTTP server."""

from __future__ import annotations

import threading

import requests

from collector.health import HealthServer, Metrics


def test_healthz_metrics_and_unknown_paths():
    metrics = Metrics()
    metrics.inc("fleetflame_collector_polls_total", result="ok")
    healthy = [True]
    server = HealthServer(
        "127.0.0.1:0", metrics, lambda: (healthy[0], {"buffered_rows": 3, "database_up": True})
    )
    try:
        ok = requests.get(server.url + "/healthz", timeout=5)
        assert ok.status_code == 200 and ok.json() == {
            "status": "ok",
            "buffered_rows": 3,
            "database_up": True,
        }
        healthy[0] = False
        bad = requests.get(server.url + "/healthz", timeout=5)
        assert bad.status_code == 503 and bad.json()["status"] == "unhealthy"
        text = requests.get(server.url + "/metrics", timeout=5)
        assert text.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert 'fleetflame_collector_polls_total{result="ok"} 1' in text.text
        missing = requests.get(server.url + "/nothing", timeout=5)
        assert missing.status_code == 404 and "try /healthz" in missing.text
    finally:
        server.stop()
    # Its threads are the sampler server's fixed few, gone once stopped.
    assert not [t for t in threading.enumerate() if t.name.startswith("fleetflame-health")]
