"""Running real Python processes under the sampler, and reading what they report."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sampler._engine_native import unavailable

WORKLOADS = Path(__file__).parent / "workloads"
# Both engines; the native one is skipped, with the reason, where it is not built.
ENGINES = [
    pytest.param(
        "native", marks=pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
    ),
    "python",
]
ROOT = Path(__file__).resolve().parents[2]


def env(**extra: str) -> dict[str, str]:
    """The environment for a child Python: the repo importable, FLEETFLAME_* cleared."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLEETFLAME_")}
    base["PYTHONPATH"] = str(ROOT) + os.pathsep + base.get("PYTHONPATH", "")
    base.update(extra)
    return base


def exits(status: int) -> list[str]:
    """The command line of workloads/exits.py, which checks its arguments, runs 0.3 s of CPU in
    ``busy_for_a_while`` and exits with ``status``."""
    return [str(WORKLOADS / "exits.py"), "--flag", "value", str(status)]


def run_sampled(
    tmp_path: Path, script: str, *args: str, options: tuple[str, ...] = (), timeout: float = 60
) -> dict[str, int]:
    """Runs a workload under ``python -m sampler run --output`` and returns its folded counts."""
    from sampler.profile import parse_folded

    out = tmp_path / "out.folded"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "sampler",
            "run",
            *options,
            "--output",
            str(out),
            str(WORKLOADS / script),
            *args,
        ],
        check=True,
        timeout=timeout,
        env=env(),
    )
    return parse_folded(out.read_text())


def run_python(*args: str) -> subprocess.CompletedProcess[str]:
    """Runs a child Python with ``args`` (60 s at most), its output captured; fails if it fails."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, env=env(), check=True
    )


def share(counts: dict[str, int], name: str, among: tuple[str, ...]) -> float:
    """Percentage of the samples in stacks containing any of ``among`` that contain ``name``."""

    def has(stack: str, frame: str) -> bool:
        return any(f.endswith(":" + frame) for f in stack.split(";"))

    relevant = {s: c for s, c in counts.items() if any(has(s, f) for f in among)}
    total = sum(relevant.values())
    assert total > 0, f"no samples in {among}: {sorted(counts)[:10]}"
    return 100.0 * sum(c for s, c in relevant.items() if has(s, name)) / total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HTTPStatusError(Exception):
    """A non-2xx answer, with its body read and its connection closed."""

    def __init__(self, code: int, body: str) -> None:
        super().__init__(f"{code}: {body}")
        self.code, self.body = code, body


def get(
    url: str,
    timeout: float = 10,
    headers: dict[str, str] | None = None,
    method: str = "GET",
    data: bytes | None = None,
) -> bytes:
    request = urllib.request.Request(url, headers=headers or {}, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            raise HTTPStatusError(exc.code, exc.read().decode()) from None


def get_json(url: str, timeout: float = 10) -> dict:
    return json.loads(get(url, timeout))


def wait_for(url: str, timeout: float = 30) -> None:
    """Polls ``url`` until it answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            get(url, timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
