"""Child processes and threads for bench/accuracy.py: started in groups of their own, all stopped."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


class Processes:
    """Child processes, each in a process group of its own; all of them end on exit."""

    def __init__(self) -> None:
        self._children: list[subprocess.Popen[bytes]] = []

    def start(
        self, command: Sequence[str], env: Mapping[str, str], log: Path
    ) -> subprocess.Popen[bytes]:
        """Starts ``command`` in a new session, its output going to ``log``."""
        with open(log, "ab") as out:
            child = subprocess.Popen(
                list(command),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children.append(child)
        return child

    def stop(self, child: subprocess.Popen[bytes], grace: float = 10.0) -> None:
        """Sends SIGTERM to the child's group, then SIGKILL to what is left after ``grace``."""
        _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _group_alive(child):
            time.sleep(0.05)
        _signal_group(child, signal.SIGKILL)
        child.wait()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for child in reversed(self._children):
            self.stop(child, grace=5.0)
        self._children.clear()


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(child.pid, signum)  # the group's id is the leader's pid (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(child: subprocess.Popen[bytes]) -> bool:
    child.poll()  # reap the leader: a zombie would keep the group alive
    try:
        os.killpg(child.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def http_get(url: str, timeout: float) -> bytes:
    """The body of a GET to ``url``."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


def py_spy() -> str:
    """The py-spy executable next to this Python, or on PATH."""
    local = Path(sys.executable).parent / "py-spy"
    found = str(local) if local.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy not found: pip install py-spy")
    return found


class Background(threading.Thread):
    """Runs a function on a daemon thread; ``result()`` waits for it and re-raises its error."""

    def __init__(self, function: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._function = function
        self._value: Any = None
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            self._value = self._function()
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._error = exc

    def result(self) -> Any:
        """The function's return value (waits for it)."""
        self.join()
        if self._error is not None:
            raise self._error
        return self._value
