"""The demo's failures a new user can meet: a port in use, a second demo on the same folder, a
component that dies at start. Each gets a clear message and leaves nothing running."""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from demoshop import ports, procs

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "deploy" / "demo" / "run.py"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFLAME_")}
    return {**env, **extra}


def _squat_on_a_free_plan(squatter: socket.socket) -> ports.PortPlan:
    """Binds the squatter to the gthread port of a free plan. Tests run in parallel, so a port
    found free can be taken before the bind: then another plan is tried."""
    for _ in range(20):
        plan = ports.find_free_plan()
        try:
            squatter.bind(("127.0.0.1", plan.shop_gthread))
        except OSError:
            continue
        return plan
    raise AssertionError("no free port plan to squat on in 20 tries")


def test_a_port_in_use_is_named_and_nothing_starts(tmp_path) -> None:
    with socket.socket() as squatter:
        plan = _squat_on_a_free_plan(squatter)
        squatter.listen()
        out = subprocess.run(
            [
                sys.executable,
                str(RUN),
                "--base-port",
                str(plan.base),
                "--var-dir",
                str(tmp_path / "var"),
            ],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 1
    # Another test may take one more of the plan's ports meanwhile: ours must be among those named.
    busy = re.search(r"port\(s\) ([\d, ]+) on 127\.0\.0\.1 are in use", out.stderr)
    assert busy, out.stderr
    assert str(plan.shop_gthread) in busy.group(1).split(", ")
    assert "--base-port" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "var" / "logs").exists()  # no process was started


def test_a_second_demo_on_the_same_folder_is_refused(tmp_path) -> None:
    var = tmp_path / "var"
    var.mkdir()
    with open(var / "demo.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running demo holds
        out = subprocess.run(
            [sys.executable, str(RUN), "--base-port", "auto", "--var-dir", str(var)],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 1
    assert "another demo is running" in out.stderr and "--var-dir" in out.stderr


def test_a_component_that_dies_at_start_is_reported_with_its_log(tmp_path) -> None:
    var = tmp_path / "var"
    out = subprocess.run(
        [
            sys.executable,
            str(RUN),
            "--base-port",
            "auto",
            "--var-dir",
            str(var),
            "--duration",
            "30",
        ],
        # A broken setting makes the collector exit at once, as a typo in a config would.
        env=_env(FLEETFLAME_COLLECTOR_POLL_INTERVAL="soon"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert "collector exited with status" in out.stderr
    assert "collector.log" in out.stderr and "soon" in out.stderr  # the log's tail is shown
    assert "every process exited, every port is free" in out.stdout
    run_id = json.loads((var / "run.json").read_text())["run_id"]
    assert procs.pids_of_run(run_id) == []
