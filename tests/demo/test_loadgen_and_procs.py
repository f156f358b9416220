"""The demo's load generator (bounded, loopback only), port plan, settings and process supervision."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from demoshop import loadgen, ports, procs, settings

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com:80",
        "http://10.0.0.5:8001",
        "https://127.0.0.1:8001",
        "http://127.0.0.1",
        "ftp://127.0.0.1:21",
    ],
)
def test_only_loopback_http_urls_are_accepted(url) -> None:
    with pytest.raises(ValueError):
        loadgen.parse_target(url)


def test_the_command_line_refuses_a_remote_host() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "demoshop.loadgen", "--url", "http://192.0.2.1:80"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(REPO / "deploy" / "demo")},
    )
    assert proc.returncode == 2
    assert "only sends requests to 127.0.0.1" in proc.stderr


class _Recorder(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer()

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()

    def _answer(self) -> None:
        _Recorder.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def test_the_rate_is_capped_and_every_route_is_exercised() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    _Recorder.hits = []
    stop = threading.Event()
    timer = threading.Timer(2.0, stop.set)
    timer.start()
    try:
        stats = loadgen.run([f"http://127.0.0.1:{server.server_port}"], 40, 4, stop, products=50)
    finally:
        timer.cancel()
        server.shutdown()
        server.server_close()
    sent = len(_Recorder.hits)
    # 40/s for 2 s, plus the first request of each thread: never more, whatever the machine.
    assert 10 <= sent <= 40 * 2 + 4 + 1
    assert "error" not in stats.summary()
    assert {h.split("?")[0] for h in _Recorder.hits} >= {"/api/products", "/api/search"}


@pytest.mark.parametrize("rate, concurrency", [(0, 1), (500, 1), (10, 0), (10, 100)])
def test_unbounded_settings_are_refused(rate, concurrency) -> None:
    with pytest.raises(ValueError):
        loadgen.run(["http://127.0.0.1:9"], rate, concurrency, threading.Event())


def test_the_port_plan_and_busy_ports() -> None:
    plan = ports.PortPlan(8000)
    assert plan.sampler_range == "8021-8040"
    assert (plan.web_ui, plan.shop_sync, plan.shop_gthread, plan.collector_health) == (
        8000,
        8001,
        8002,
        8003,
    )
    free = ports.find_free_plan()
    assert ports.busy_ports(free) == []
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free.shop_gthread))
        sock.listen()
        assert ports.busy_ports(free) == [free.shop_gthread]
        assert ports.listening_ports(free) == [free.shop_gthread]
    assert ports.listening_ports(free) == []


def test_settings_come_from_options_then_environment_then_defaults() -> None:
    env = {"FLEETFLAME_DEMO_RATE": "5", "FLEETFLAME_DEMO_FRESH": "yes"}
    args = settings.parse_args(["--duration", "9"], env)
    assert (args.duration, args.rate, args.fresh, args.base_port) == (9.0, 5.0, True, "8000")
    assert settings.parse_args(["--rate", "7"], env).rate == 7.0


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--rate", "1000"], {}, "--rate must be"),
        (["--base-port", "80"], {}, "--base-port must be from"),
        (["--base-port", "x"], {}, "port number or auto"),
        ([], {"FLEETFLAME_DEMO_DURATION": "soon"}, "FLEETFLAME_DEMO_DURATION"),
    ],
)
def test_bad_settings_are_clear_errors(argv, env, message, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        settings.parse_args(argv, env)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_docs_list_every_demo_setting() -> None:
    doc = (REPO / "docs" / "demo.md").read_text()
    for setting in settings.SETTINGS:
        assert setting.flag in doc and setting.env_var in doc


_STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
print(child.pid, flush=True)
time.sleep(300)
"""


def test_a_group_that_ignores_sigterm_is_killed_grandchildren_included(tmp_path) -> None:
    supervisor = procs.Supervisor("t" + os.urandom(4).hex(), tmp_path)
    child = supervisor.start("stubborn", [sys.executable, "-c", _STUBBORN], {})
    log = tmp_path / "stubborn.log"
    assert ports.wait_until(lambda: log.read_text().strip() != "", timeout=30)
    grandchild = int(log.read_text().split()[0])
    assert procs.pids_of_run(supervisor.run_id) != []
    started = time.monotonic()
    assert supervisor.stop(child, timeout=1.0) is False  # not graceful: it had to be killed
    assert time.monotonic() - started < 30
    assert not procs.group_alive(child.pid)
    assert procs.pids_of_run(supervisor.run_id) == []
    assert not Path(f"/proc/{grandchild}").exists() or procs._is_zombie(grandchild)


def test_leftovers_of_a_killed_run_are_found_by_run_id(tmp_path) -> None:
    run_id = "left" + os.urandom(4).hex()
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"],
        env={**os.environ, procs.RUN_ENV: run_id},
        start_new_session=True,
    )
    try:
        assert ports.wait_until(lambda: procs.pids_of_run(run_id) == [orphan.pid], timeout=10)
        assert procs.kill_leftovers(run_id) == [orphan.pid]
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        assert procs.pids_of_run(run_id) == []
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def test_the_users_sampler_variables_do_not_leak_into_the_demo(monkeypatch) -> None:
    from demoshop import commands

    monkeypatch.setenv("FLEETFLAME_HOST", "0.0.0.0")  # would need a token: samplers would not start
    monkeypatch.setenv("FLEETFLAME_PORT", "8021")
    monkeypatch.setenv("FLEETFLAME_MODE", "wall")  # an experiment docs/demo.md suggests
    monkeypatch.setenv("FLEETFLAME_COLLECTOR_POLL_INTERVAL", "5")
    env = commands.inherited_env()
    assert "FLEETFLAME_HOST" not in env and "FLEETFLAME_PORT" not in env
    assert env["FLEETFLAME_MODE"] == "wall" and env["FLEETFLAME_COLLECTOR_POLL_INTERVAL"] == "5"


def test_the_web_ui_keeps_its_saved_indexes_in_the_demo_folder(tmp_path) -> None:
    from demoshop import configs
    from webui.settings import read_config_file

    values = read_config_file(configs.write_web_config(tmp_path))
    assert values["database_url"] == configs.database_url(tmp_path)
    assert values["index_dir"] == str(tmp_path / "index")  # not the user's cache directory
