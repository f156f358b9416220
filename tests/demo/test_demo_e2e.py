"""The whole demo, headless: fleet, collector, web UI and load for ~30 s, then a clean stop.

This is what `make demo` runs, with --duration so it stops by itself. It checks what a new user
would see: every worker process (the gunicorn-preforked ones included) reached the collector,
the planted regression of version 1.4.2 stands out against 1.4.1, and nothing is left running.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.query import Filters, Query
from collector.store import Store
from demoshop import ports, procs

REPO = Path(__file__).resolve().parents[2]
DEMO_DIR = REPO / "deploy" / "demo"
REGRESSION_FRAME = "demoshop.pricing:_find_line"


def _demo_argv(var: Path, *args: str) -> list[str]:
    """The command that runs the demo on free ports, with its state in ``var``."""
    argv = [sys.executable, str(DEMO_DIR / "run.py"), "--base-port", "auto", "--var-dir", str(var)]
    return [*argv, *args]


def _demo_env() -> dict[str, str]:
    """This process's environment without FLEETFLAME_* settings (the demo sets its own)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETFLAME_")}


def _run_demo(
    var: Path, *args: str, timeout: float
) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = subprocess.run(
        _demo_argv(var, *args),
        cwd=REPO,
        env=_demo_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    state = json.loads((var / "fleet.json").read_text())
    return proc, state


def _share(profile: dict[str, int], frame: str) -> float:
    total = sum(profile.values())
    hit = sum(c for stack, c in profile.items() if frame in stack.split(";"))
    return hit / total if total else 0.0


def _assert_stopped_cleanly(proc: subprocess.CompletedProcess[str], state: dict) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "every process exited, every port is free" in proc.stdout
    assert state["killed"] == [] and state["leftover_pids"] == [] and state["busy_ports"] == []
    # Checked here too, independently of the orchestrator's own account.
    assert procs.pids_of_run(state["run_id"]) == []
    base = int(state["urls"]["web_ui"].rsplit(":", 1)[1].strip("/"))
    assert ports.listening_ports(ports.PortPlan(base)) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_demo_runs_headless_shows_the_regression_and_stops_cleanly(tmp_path) -> None:
    var = tmp_path / "var"
    started = int(time.time())
    proc, state = _run_demo(
        var,
        "--duration",
        "30",
        "--deploy-after",
        "14",
        "--poll-interval",
        "1",
        "--rate",
        "16",
        timeout=200,
    )
    _assert_stopped_cleanly(proc, state)
    out = proc.stdout
    assert "/stacks" in out and "/flamegraph.svg" in out and "/api/folded?" in out
    assert "demo-shop 1.4.2 is live" in out

    workers = state["workers"]
    by_version = {v: [w for w in workers if w["version"] == v] for v in ("1.4.1", "1.4.2")}
    for version, group in by_version.items():
        pools = [w["pool"] for w in group]
        assert pools.count("sync") == 4 and pools.count("gthread") == 2, (version, pools)
        assert pools.count("jobs") == 1
        # Forked by a gunicorn master, not started by the orchestrator.
        assert all(w["preforked"] for w in group if w["pool"] != "jobs"), group
    # The curl commands printed name a sync worker of the version live at the time.
    printed = [int(p) for p in re.findall(r"curl http://127\.0\.0\.1:(\d+)/stacks", out)]
    sync_ports = {v: {w["port"] for w in g if w["pool"] == "sync"} for v, g in by_version.items()}
    assert len(printed) == 2
    assert printed[0] in sync_ports["1.4.1"] and printed[1] in sync_ports["1.4.2"]

    store = Store(state["database_url"])
    try:
        query = Query(store)
        window = (started - 120, int(time.time()) + 120)
        silent = [
            (w["pool"], w["version"], w["pid"])
            for w in workers
            if not query.profile(*window, Filters(instances=(w["instance"],)))
        ]
        assert silent == [], f"workers with no stored samples: {silent}"

        def shop(version: str) -> dict[str, int]:
            return query.profile(
                *window, Filters(services=("demo-shop",), labels=(("version", version),))
            )

        good, bad = shop("1.4.1"), shop("1.4.2")
        assert sum(good.values()) > 100 and sum(bad.values()) > 100
        assert _share(good, REGRESSION_FRAME) == 0.0  # the quadratic code does not exist in 1.4.1
        assert _share(bad, REGRESSION_FRAME) > 0.04, _share(bad, REGRESSION_FRAME)
    finally:
        store.close()

    # What the compare view shows: the web API ranks the regression among the largest changes.
    from webui import create_app

    app = create_app({"DATABASE_URL": state["database_url"]})
    response = app.test_client().get(
        "/api/diff",
        query_string={
            "service": "demo-shop",
            "from": str(window[0]),
            "to": str(window[1]),
            "a_label": "version:1.4.1",
            "b_label": "version:1.4.2",
            "limit": "10",
        },
    )
    # The worst-cases page's routes: the demo's app has the request middleware.
    requests = app.test_client().get(
        "/api/requests",
        query_string={"service": "demo-shop", "from": str(window[0]), "to": str(window[1])},
    )
    app.extensions["fleetflame_db"].close()
    assert requests.status_code == 200, requests.get_data(as_text=True)
    routes = {route["route"]: route for route in requests.get_json()["routes"]}
    assert {"/api/products", "/api/search", "/api/checkout", "/api/report"} <= set(routes)
    for route in routes.values():
        latency = route["latency"]
        assert route["count"] > 0 and latency["count"] == route["count"]
        assert 0 < latency["p50"] <= latency["p99"] <= latency["max"] * 1.01, route
    assert response.status_code == 200, response.get_data(as_text=True)
    functions = response.get_json()["functions"]
    names = [f["name"] for f in functions]
    assert REGRESSION_FRAME in names[:5], names
    change = functions[names.index(REGRESSION_FRAME)]
    assert change["total_a"] == 0 and change["self_delta"] > 0.04

    # A second run on the same folder (the database, logs and state of the first are there),
    # interactive this time: it runs until Ctrl-C, which the terminal sends to the orchestrator.
    demo = subprocess.Popen(
        _demo_argv(var, "--deploy-after", "-1", "--poll-interval", "1"),
        cwd=REPO,
        env=_demo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    banner = ""
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            banner += line
            if "Ctrl-C stops everything" in line:
                break
        assert "Ctrl-C stops everything" in banner, banner + (
            demo.stderr.read() if demo.stderr else ""
        )
        time.sleep(3)
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C does: SIGINT to the foreground group
        out, err = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    state2 = json.loads((var / "fleet.json").read_text())
    _assert_stopped_cleanly(
        subprocess.CompletedProcess(demo.args, demo.returncode, banner + out, err), state2
    )
    assert state2["run_id"] != state["run_id"]
    assert {w["version"] for w in state2["workers"]} == {"1.4.1"}
    assert len(state2["workers"]) == 7
