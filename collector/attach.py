"""``fleetflame attach``: profile a process that cannot import the sampler, with py-spy.

It runs ``py-spy record --format raw`` in short windows against the process, accumulates the
counts, and serves the sampler's own endpoints (``/profile.json``, ``/stacks``,
``/flamegraph.svg``, ``/info``) through ``sampler.make_wsgi_app``, so the collector polls it
like any worker. py-spy needs ptrace access to the process; when it is denied the command says
which permission is missing and exits with status 3.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from collector.logs import log_event, setup_logging
from sampler.profile import escape_frame, format_folded

__all__ = ["AttachError", "Attacher", "convert_raw", "main", "permission_help"]

log = logging.getLogger("collector.attach")

EXIT_DENIED = 3
EXIT_GONE = 4

_PYSPY_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


class AttachError(Exception):
    """py-spy could not profile the process; ``exit_code`` says why (3: denied, 4: gone)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _module_of(filename: str) -> str:
    """Turns py-spy's short filename (``json/encoder.py``) into a module name (``json.encoder``)."""
    name = filename.replace("\\", "/")
    for suffix in (".py", ".pyx", ".pyc"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    name = name.strip("/").replace("/", ".")
    if name.endswith(".__init__"):
        name = name[: -len(".__init__")]
    return name or "?"


def convert_frame(frame: str) -> str:
    """Converts a py-spy frame ``qualname (file.py:12)`` to the wire format's ``module:qualname``."""
    match = _PYSPY_FRAME.match(frame)
    if match is None:
        return escape_frame(frame)  # "process 12:..." and native frames: kept as they are
    return escape_frame(f"{_module_of(match['file'])}:{match['name']}")


def convert_raw(text: str) -> dict[str, int]:
    """Parses py-spy's raw (folded) output into folded counts in the wire format's frame names."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        stack, sep, count_text = line.strip().rpartition(" ")
        if not sep or not stack or not count_text.isdigit():
            continue
        folded = ";".join(convert_frame(frame) for frame in stack.split(";"))
        counts[folded] = counts.get(folded, 0) + int(count_text)
    return counts


def _ptrace_scope() -> str | None:
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return None


def permission_help(pid: int, stderr: str = "") -> str:
    """Explains which permission py-spy lacks to read ``pid`` and how to grant it."""
    scope = _ptrace_scope()
    scope_text = {
        None: "the Yama LSM is not enabled",
        "0": "kernel.yama.ptrace_scope = 0 (any process of the same user)",
        "1": "kernel.yama.ptrace_scope = 1 (only descendants, unless CAP_SYS_PTRACE)",
        "2": "kernel.yama.ptrace_scope = 2 (only with CAP_SYS_PTRACE)",
        "3": "kernel.yama.ptrace_scope = 3 (ptrace disabled entirely, until reboot)",
    }.get(scope, f"kernel.yama.ptrace_scope = {scope}")
    detail = stderr.strip().splitlines()[0] if stderr.strip() else ""
    return (
        f"permission denied: py-spy cannot read process {pid} ({detail or 'ptrace refused'}). "
        "py-spy uses ptrace, which needs one of: running as root; the CAP_SYS_PTRACE capability "
        "(docker run --cap-add SYS_PTRACE; Kubernetes securityContext.capabilities.add: "
        '["SYS_PTRACE"]); or running as the same user as the process with '
        f"kernel.yama.ptrace_scope = 0 (sysctl -w kernel.yama.ptrace_scope=0). Here: {scope_text}, "
        f"running as uid {os.getuid()}."
    )


def find_process(pattern: str, *, exclude: Iterable[int] = ()) -> int | None:
    """Returns the oldest process whose command line matches ``pattern`` (a regex), if any."""
    regex = re.compile(pattern)
    skip = {os.getpid(), os.getppid(), *exclude}
    found: list[tuple[int, int]] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            raw = Path(entry.path, "cmdline").read_bytes()
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        cmdline = raw.replace(b"\x00", b" ").decode("utf-8", "replace").strip()
        if not cmdline or "py-spy" in cmdline or not regex.search(cmdline):
            continue
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        found.append((start_ticks, int(entry.name)))
    if len(found) > 1:
        log_event(
            log,
            logging.WARNING,
            "several processes match; attaching to the oldest",
            pattern=pattern,
            pids=",".join(str(pid) for _, pid in sorted(found)),
        )
    return min(found)[1] if found else None


def _process_start_time(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return time.time()


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
    ) -> None:
        if (pid is None) == (match is None):
            raise ValueError("give exactly one of pid and match")
        self.match = match
        self.window = window
        self.rate = rate
        self.mode = "wall" if idle else "cpu"
        self.interval = 1.0 / rate
        self.py_spy = py_spy
        self._service = service
        self._extra_labels = dict(labels or {})
        self._lock = threading.Lock()
        self._excluded: set[int] = set()  # make_wsgi_app's thread bookkeeping (unused here)
        self._counts: dict[str, int] = {}
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
        with self._lock:
            self.pid = pid
            self._counts = {}
            self.instance = {
                "id": secrets.token_hex(8),
                "pid": pid,
                "start_time": _process_start_time(pid),
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
        pid = find_process(self.match)
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
                "--nonblocking",
                "--output",
                output,
            ]
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
        counts = convert_raw(text)
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
        """Returns the /profile.json document (docs/wire-format.md)."""
        with self._lock:
            counts = dict(self._counts)
            instance = dict(self.instance)
            labels = dict(self.labels)
        return {
            "format": "fleetflame.profile/1",
            "instance": instance,
            "labels": labels,
            "mode": self.mode,
            "interval": self.interval,
            "effective_interval": self.interval,
            "time": time.time(),
            "total_samples": sum(counts.values()),
            "dropped_samples": 0,
            "label_sets": [{}],
            "stacks": [[0, stack, count] for stack, count in counts.items()],
        }

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


class _QuietHandler(WSGIRequestHandler):
    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(attacher: Attacher, host: str, port: int, token: str | None) -> _Server:
    """Serves the attacher through the sampler's WSGI app on a daemon thread."""
    from sampler import make_wsgi_app

    server = _Server((host, port), _QuietHandler)
    server.set_app(make_wsgi_app(attacher, token))
    threading.Thread(
        target=server.serve_forever, name="fleetflame-attach-http", daemon=True
    ).start()
    return server


def build_parser() -> argparse.ArgumentParser:
    """Returns the argument parser of ``fleetflame attach``."""
    parser = argparse.ArgumentParser(
        prog="fleetflame attach",
        description="Profile a running Python process with py-spy and serve the sampler's "
        "endpoints for the collector.",
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--pid", type=int, help="process id to profile")
    target.add_argument(
        "--match",
        help="regex on process command lines; the oldest match, re-resolved when it exits",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on [127.0.0.1]")
    parser.add_argument("--port", type=int, default=8021, help="port to serve on, 0 for any [8021]")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per py-spy run [10]")
    parser.add_argument("--rate", type=int, default=100, help="samples per second [100]")
    parser.add_argument("--idle", action="store_true", help="wall mode: include idle threads")
    parser.add_argument("--service", help="service label (default: the process name)")
    parser.add_argument("--labels", default="", help="more labels as key=value,key=value")
    parser.add_argument("--token", default=None, help="bearer token required by the endpoint")
    parser.add_argument("--py-spy", default=None, help="py-spy command (default: found on PATH)")
    parser.add_argument("--log-format", default="kv", choices=("kv", "json"))
    return parser


def _default_py_spy() -> str:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else (shutil.which("py-spy") or "py-spy")


def main(argv: list[str] | None = None) -> int:
    """Runs ``fleetflame attach`` until SIGTERM/SIGINT or until the process cannot be profiled."""
    args = build_parser().parse_args(argv)
    setup_logging("info", args.log_format)
    labels = dict(
        item.split("=", 1) for item in filter(None, args.labels.split(",")) if "=" in item
    )
    if args.pid is not None and not Path(f"/proc/{args.pid}").exists():
        print(f"fleetflame attach: no process {args.pid}", file=sys.stderr)
        return EXIT_GONE
    attacher = Attacher(
        pid=args.pid,
        match=args.match,
        window=args.window,
        rate=args.rate,
        idle=args.idle,
        service=args.service,
        labels=labels,
        py_spy=args.py_spy or _default_py_spy(),
    )
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.token:
        print(
            "fleetflame attach: serving stack traces beyond localhost needs --token",
            file=sys.stderr,
        )
        return 2
    try:
        server = serve(attacher, args.host, args.port, args.token)
    except OSError as exc:
        print(f"fleetflame attach: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    # The port goes to stdout first, so scripts (and tests) can read where it serves.
    print(server.server_address[1], flush=True)
    log_event(log, logging.INFO, "serving", url=f"http://{args.host}:{server.server_address[1]}")

    def on_signal(signum: int, _frame: Any) -> None:
        attacher.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        attacher.run()
    finally:
        server.shutdown()
        server.server_close()
    if attacher.error is not None:
        print(f"fleetflame attach: {attacher.error}", file=sys.stderr)
        return attacher.error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
