"""The README's commands, run as written (on free ports instead of 8021 and 8080)."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, re.S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def block(language: str, containing: str) -> str:
    found = [text for lang, text in BLOCKS if lang == language and containing in text]
    assert len(found) == 1, f"README has {len(found)} {language} blocks with {containing!r}"
    return found[0]


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFLAME_")}
    env["FLEETFLAME_WEB_INDEX_DIR"] = ""  # no index file in the user's cache (tests/conftest.py)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def wait_until(check, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except (OSError, http.client.HTTPException, subprocess.CalledProcessError):
            pass  # HTTPException: a port not listening yet may connect to itself
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


@pytest.fixture
def service(tmp_path):
    """The README's Python snippet, kept busy, sampled on a free port."""
    port = free_port()
    script = tmp_path / "service.py"
    script.write_text(
        block("python", "sampler.start")
        + "\nimport time\nwhile True:\n    with sampler.tag(route='/upload'):\n"
        "        sum(i * i for i in range(10**5))\n    time.sleep(0.001)\n"
    )
    process = subprocess.Popen(
        [sys.executable, str(script)], env=environment(FLEETFLAME_PORT=str(port)), cwd=tmp_path
    )
    try:
        wait_until(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=2),
            what="the README's service",
        )
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


def run_lines(text: str, replacements: dict[str, str], cwd: Path) -> list[subprocess.Popen]:
    """Runs each command line; lines ending in & run in the background and are returned."""
    background = []
    for line in filter(None, (line.strip() for line in text.splitlines())):
        for old, new in replacements.items():
            line = line.replace(old, new)
        if line.endswith("&"):
            background.append(
                subprocess.Popen(
                    ["bash", "-c", "exec " + line[:-1]],
                    cwd=cwd,
                    env=environment(),
                    start_new_session=True,
                )
            )
        else:
            subprocess.run(["bash", "-c", line], cwd=cwd, env=environment(), check=True, timeout=60)
    return background


def test_the_two_commands_are_make_targets():
    commands = block("", "make demo")
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"^make (\w+)", commands, re.M):
        assert re.search(rf"^{target}:", makefile, re.M), target


def test_curl_a_worker(service, tmp_path):
    run_lines(block("sh", "flamegraph.svg"), {"127.0.0.1:8021": f"127.0.0.1:{service}"}, tmp_path)
    root = ET.parse(tmp_path / "flamegraph.svg").getroot()
    assert root.findall(".//{http://www.w3.org/2000/svg}rect")
    folded = (tmp_path / "last-5s.folded").read_text()
    assert "__main__:<module>" in folded and "__main__:<genexpr>" in folded


def test_collect_and_serve_the_fleet(service, tmp_path):
    web = free_port()
    replacements = {"127.0.0.1:8021-8036": f"127.0.0.1:{service}", "8080": str(web)}
    text = block("sh", "fleetflame collect")
    setup = "\n".join(line for line in text.splitlines() if line.endswith("&"))
    fetch = "\n".join(line for line in text.splitlines() if line.startswith("curl"))
    background = run_lines(setup, replacements, tmp_path)
    try:

        def fetched() -> str:
            run_lines(fetch, replacements, tmp_path)
            return (tmp_path / "last-hour.folded").read_text()

        def stored() -> bool:
            return "__main__:<genexpr>" in fetched()

        wait_until(stored, timeout=90, what="the collector to store samples")
    finally:
        for process in background:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
