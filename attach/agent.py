"""The attach agent: py-spy windows of one process, accumulated and served as a sampler would.

``Attacher`` runs ``py-spy record --format raw`` in short windows against the process, adds up
the counts, and answers what the sampler's endpoint asks of a profile source (``folded``,
``profile_json``, ``info``); ``serve`` puts it behind the sampler's own WSGI app and HTTP
server, so the collector polls it like any worker.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from attach.pyspy import (
    EXIT_DENIED,
    EXIT_GONE,
    AttachError,
    convert_raw,
    find_process,
    main_files_of,
    permission_help,
    process_start_time,
)
from collector.logs import log_event
from sampler import make_wsgi_app
from sampler.profile import build_document, format_folded
from sampler.serving import Server

__all__ = ["Attacher", "serve"]

log = logging.getLogger("attach")


class Attacher:
    """Accumulates py-spy windows of one process and answers the sampler's endpoint questions."""

    def __init__(
        self,
        *,
        pid: int | None = None,
        match: str | None = None,
        window: float = 10.0,
        rate: int = 100,
        idle: bool = False,
        service: str | None = None,
        labels: dict[str, str] | None = None,
        py_spy: str = "py-spy",
        nonblocking: bool = False,
    ) -> None:
        if (pid is None) == (match is None):
            raise ValueError("give exactly one of pid and match")
        if rate < 1:
            raise ValueError(f"rate must be 1 or more samples per second, got {rate}")
        self.match = match
        self.window = window
        self.rate = rate
        self.mode = "wall" if idle else "cpu"
        self.interval = 1.0 / rate
        self.py_spy = py_spy
        # py-spy pauses the process while it reads a stack, so every stack is whole; without
        # the pause, stacks read while they change come out torn (rootless, or frames of two).
        self.nonblocking = nonblocking
        self._service = service
        self._extra_labels = dict(labels or {})
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._main_files: frozenset[str] = frozenset()  # py-spy's names of __main__'s file
        self._told: set[int] = set()  # processes --match skipped, not Python, and said so
        self._stop = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None
        self.error: AttachError | None = None
        self.windows = 0
        self.pid = -1
        self.instance: dict[str, Any] = {}
        self.labels: dict[str, str] = {}
        if pid is not None:
            self._attach(pid)

    def _attach(self, pid: int) -> None:
        """Starts a new counter series for ``pid`` (a new instance id, counts from zero)."""
        host = socket.gethostname()
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            comm = f"pid{pid}"
        main_files = main_files_of(pid)
        with self._lock:
            self.pid = pid
            self._main_files = main_files
            self._counts = {}
            self.instance = {
                "id": secrets.token_hex(8),
                "pid": pid,
                "start_time": process_start_time(pid),
                "host": host,
            }
            self.labels = {
                "service": self._service or comm,
                "host": host,
                **self._extra_labels,
                "profiler": "py-spy",
            }
        log_event(log, logging.INFO, "attached", pid=pid, instance=self.instance["id"])

    def _resolve(self) -> bool:
        if self.match is None:
            return self.pid > 0
        pid = find_process(self.match, told=self._told)
        if pid is None:
            return False
        if pid != self.pid:
            self._attach(pid)
        return True

    def record_window(self, seconds: float | None = None) -> None:
        """Runs one py-spy window and adds its counts; raises AttachError when it cannot."""
        seconds = seconds or self.window
        with tempfile.TemporaryDirectory(prefix="fleetflame-attach-") as tmp:
            output = os.path.join(tmp, "raw.txt")
            os.chmod(tmp, 0o777)  # a py-spy wrapper running as another user can write there
            command = [
                *self.py_spy.split(),
                "record",
                "--pid",
                str(self.pid),
                "--format",
                "raw",
                "--duration",
                str(max(1, round(seconds))),
                "--rate",
                str(self.rate),
                "--nolineno",
                "--output",
                output,
            ]
            if self.nonblocking:
                command.append("--nonblocking")
            if self.mode == "wall":
                command.append("--idle")
            try:
                self._child = subprocess.Popen(
                    command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                )
            except FileNotFoundError:
                raise AttachError(
                    f"cannot run {self.py_spy!r}: install py-spy (pip install py-spy) "
                    "or give its path with --py-spy",
                    2,
                ) from None
            _, stderr_bytes = self._child.communicate()
            code, self._child = self._child.returncode, None
            stderr = stderr_bytes.decode("utf-8", "replace")
            if self._stop.is_set():
                return
            if code != 0:
                raise self._classify(stderr)
            try:
                text = Path(output).read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                text = ""  # no samples at all in this window (an idle process)
        counts = convert_raw(text, self._main_files)
        with self._lock:
            for stack, count in counts.items():
                self._counts[stack] = self._counts.get(stack, 0) + count
            self.windows += 1

    def _classify(self, stderr: str) -> AttachError:
        lowered = stderr.lower()
        if (
            "permission" in lowered
            or "operation not permitted" in lowered
            or "os error 1)" in lowered
        ):
            return AttachError(permission_help(self.pid, stderr), EXIT_DENIED)
        if not Path(f"/proc/{self.pid}").exists() or "no such file" in lowered:
            return AttachError(f"process {self.pid} is gone", EXIT_GONE)
        first = stderr.strip().splitlines()[0] if stderr.strip() else "no message"
        return AttachError(f"py-spy failed on process {self.pid}: {first}", 1)

    def run(self) -> None:
        """Records windows until ``stop()``; sets ``error`` and returns when it cannot go on."""
        while not self._stop.is_set():
            if not self._resolve():
                if self.match is None:
                    self.error = AttachError(f"process {self.pid} is gone", EXIT_GONE)
                    return
                self._stop.wait(1.0)  # --match: wait for a process to appear
                continue
            try:
                self.record_window()
            except AttachError as exc:
                if exc.exit_code == EXIT_GONE and self.match is not None:
                    log_event(
                        log, logging.INFO, "process exited; looking for a new one", pid=self.pid
                    )
                    self.pid = -1
                    continue
                self.error = exc
                return

    def stop(self) -> None:
        """Stops recording (terminating a running py-spy window)."""
        self._stop.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.terminate()

    # The sampler's endpoint interface (sampler._server.ProfileSource).

    def folded(self) -> dict[str, int]:
        """Returns the cumulative folded counts since attaching."""
        with self._lock:
            return dict(self._counts)

    def folded_for(self, seconds: float) -> dict[str, int]:
        """Returns what the next ``seconds`` added (windows complete every ``window`` seconds)."""
        before = self.folded()
        time.sleep(seconds)
        after = self.folded()
        return {k: c - before.get(k, 0) for k, c in after.items() if c > before.get(k, 0)}

    def folded_text(self, seconds: float = 0.0) -> bytes:
        return format_folded(self.folded_for(seconds) if seconds else self.folded()).encode()

    def profile_json(self, since: int = 0, instance: str = "") -> bytes:
        """Returns the whole document: py-spy windows have no tick numbers to read since."""
        return json.dumps(self.profile(), separators=(",", ":")).encode()

    def profile(self) -> dict[str, Any]:
        """Returns the /profile.json document (docs/wire-format.md), built by the profile core."""
        with self._lock:
            counts = dict(self._counts)
            instance = dict(self.instance)
            labels = dict(self.labels)
        return build_document(
            ((0, stack, count) for stack, count in counts.items()),
            instance=instance,
            labels=labels,
            mode=self.mode,
            interval=self.interval,
            effective_interval=self.interval,
            time=time.time(),
        )

    def info(self) -> dict[str, Any]:
        """Returns health information in the shape of the sampler's /info."""
        with self._lock:
            total, distinct = sum(self._counts.values()), len(self._counts)
        return {
            "status": "ok" if self.error is None else "error",
            "instance": dict(self.instance),
            "labels": dict(self.labels),
            "mode": self.mode,
            "driver": "py-spy",
            "interval": self.interval,
            "effective_interval": self.interval,
            "windows": self.windows,
            "window_seconds": self.window,
            "total_samples": total,
            "dropped_samples": 0,
            "distinct_stacks": distinct,
        }


def serve(attacher: Attacher, host: str, port: int, token: str | None) -> Server:
    """Serves the attacher through the sampler's WSGI app and HTTP server, on daemon threads."""
    return Server(make_wsgi_app(attacher, token), host, port, name="fleetflame-attach")
