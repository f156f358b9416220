"""The Sampler: ties the stack table, a driver and the HTTP endpoint together.

At most one sampler runs per process. It survives ``fork()``: the child starts over with fresh
counts, a new instance id, its own timer and its own endpoint (gunicorn's ``preload_app``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from types import FrameType
from typing import Any

from . import _labels, _settings
from ._drivers import make_driver
from ._stacks import StackTable

log = logging.getLogger("sampler")

WIRE_FORMAT = "fleetflame.profile/1"
# Bytes of folded text kept ready for serving (see Sampler._quoted).
_MAX_QUOTED_BYTES = 16_000_000
# How far the overhead budget may stretch the tick: at most this many times the interval.
_MAX_STRETCH = 50.0


class SamplerError(RuntimeError):
    """The sampler could not start; the message says what to change."""


class Sampler:
    """A running sampler: its settings, its counts and its endpoint."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.mode: str = settings["mode"]
        self.interval: float = settings["interval"]
        self.effective_interval = self.interval
        self.host_name = socket.gethostname()
        service = settings["service"] or _program_name()
        self.labels = {"service": service, "host": self.host_name, **settings["labels"]}
        self.server: Any = None
        self._excluded: set[int] = set()
        self._fresh_state()

    def _fresh_state(self) -> None:
        s = self.settings
        self.instance = {
            "id": secrets.token_hex(8),
            "pid": os.getpid(),
            "start_time": round(time.time(), 3),
            "host": self.host_name,
        }
        self._lock = threading.Lock()
        self._main_ident = threading.main_thread().ident or 0  # a forked child has its own
        self.table = StackTable(
            mode=self.mode,
            interval=self.interval,
            max_depth=s["max_depth"],
            max_stacks=s["max_stacks"],
            lineno=s["lineno"],
            thread_frames=s["thread_frames"],
        )
        # Stack -> its folded text as a UTF-8 JSON string literal, built once: serving is then
        # joining cached pieces. Capped so a huge profile cannot double the memory it takes.
        self._quoted: dict[tuple[int, ...], bytes] = {}
        self._quoted_bytes = 0
        self.ticks = 0
        self.dropped = 0
        self.errors = 0
        self._started = time.monotonic()
        self._busy = 0.0
        self._window_start = time.perf_counter()
        self._window_ticks = 0
        # (seconds of wall time, seconds in the tick, ticks) per window of about a second.
        self._history: deque[tuple[float, float, int]] = deque(maxlen=60)
        self.driver = make_driver(
            s["driver"],
            self.mode,
            self.tick,
            self._excluded.add,
            self._on_driver_switch,
            self._lateness,
        )

    def _lateness(self) -> tuple[float, float]:
        return self.table.late, self.table.total

    def _on_driver_switch(self) -> None:
        with self._lock:
            self.dropped += self.table.rebaseline(self._excluded)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Starts sampling and, unless the port is none, the HTTP endpoint."""
        self._start_server()
        self.table.baseline(self._excluded)
        self.driver.start(self.effective_interval)

    def _start_server(self) -> None:
        ports = self.settings["port"]
        if ports is None:
            return
        from ._server import start_server

        self.server = start_server(
            self, self.settings["host"], ports, self.settings["token"], self._excluded.add
        )

    def stop(self) -> None:
        """Stops the driver and the endpoint; the counts stay readable."""
        self.driver.stop()
        with self._lock:
            self.table.flush()
            self.table.forget_frames()
            self.table.stopped = True
        if self.server is not None:
            self.server.stop()
            self.server = None

    def after_fork_in_child(self) -> None:
        """Starts over in a forked child: fresh counts and id, own timer and endpoint."""
        old_server, self.server = self.server, None
        if old_server is not None:
            old_server.close_inherited()
        self.driver.stop()
        self._excluded.clear()
        self._fresh_state()
        try:
            self._start_server()
        except SamplerError as exc:
            log.warning(
                "fleetflame sampler in child %d: %s; sampling without endpoint", os.getpid(), exc
            )
        self.table.baseline(set())
        self.driver.start(self.effective_interval)

    # -- the tick ----------------------------------------------------------------------------

    def tick(self, frame: FrameType | None) -> None:
        """Takes one sample of every thread; never raises, never blocks."""
        # The tick's own CPU, not wall time: on a loaded host the tick can be preempted, and
        # the budget must not stretch the interval for time other processes took.
        started = time.thread_time()
        try:
            if not self._lock.acquire(blocking=False):
                self.dropped += 1
                return
            try:
                frames = sys._current_frames()
                if frame is not None:
                    # Called from the signal handler: the main thread's stack is the handler's
                    # own; the interrupted frame is the host's.
                    frames[self._main_ident] = frame
                self.table.sample(frames, self._excluded)
                self.ticks += 1
                self._window_ticks += 1
            finally:
                self._lock.release()
        except Exception:  # noqa: BLE001 - the host program must never see the sampler fail
            self.errors += 1
            if self.errors == 1:
                log.exception("fleetflame sampler: a tick failed (further failures are counted)")
        self._busy += time.thread_time() - started
        now = time.perf_counter()
        if now - self._window_start >= 1.0:
            self._close_window(now)

    def _close_window(self, now: float) -> None:
        elapsed = now - self._window_start
        self._history.append((elapsed, self._busy, self._window_ticks))
        percent = 100.0 * self._busy / elapsed
        self._busy, self._window_ticks, self._window_start = 0.0, 0, now
        budget = self.settings["overhead_budget"]
        stretched = self.effective_interval
        if percent > budget:
            stretched = min(self.interval * _MAX_STRETCH, stretched * percent / budget * 1.2)
        elif percent < budget / 2 and stretched > self.interval:
            stretched = max(self.interval, stretched / 1.5)
        if stretched != self.effective_interval:
            self.effective_interval = stretched
            self.driver.arm(stretched)

    # -- reading ---------------------------------------------------------------------------

    def _settle(self, frames: dict[int, FrameType]) -> None:
        # A reader's catch-up tick (StackTable.settle) costs like a tick: it counts in the budget.
        started = time.thread_time()
        self.table.settle(frames, self._excluded, self.effective_interval)
        self._busy += time.thread_time() - started

    def _snapshot(self) -> dict[tuple[int, tuple[int, ...]], float]:
        return self._read()[0]

    def _read(
        self, touched: bool = False
    ) -> tuple[
        dict[tuple[int, tuple[int, ...]], float], int, dict[tuple[int, tuple[int, ...]], int]
    ]:
        """Returns a settled copy of the counts, the tick it is complete up to, and (when asked)
        a copy of the tick that last changed each count, all taken together."""
        frames = sys._current_frames()
        with self._lock:
            self._settle(frames)
            table = self.table
            return table.snapshot(), table.generation, dict(table.touched) if touched else {}

    def _quote(self, stack: tuple[int, ...]) -> bytes:
        quoted = self._quoted.get(stack)
        if quoted is None:
            # Frame names are escaped (sampler.profile.escape_frame): no character in them needs
            # JSON escaping, so the JSON string is the text in quotes.
            quoted = b'"' + self.table.folded((0, stack)).encode() + b'"'
            if self._quoted_bytes < _MAX_QUOTED_BYTES:
                self._quoted[stack] = quoted
                self._quoted_bytes += len(quoted)
        return quoted

    def _raw(self, stack: tuple[int, ...]) -> bytes:
        return self._quote(stack)[1:-1]

    def _merged(
        self, counts: dict[tuple[int, tuple[int, ...]], float]
    ) -> Iterable[tuple[tuple[int, ...], int]]:
        """Yields (stack, whole count) merged over label sets, leaving out zero counts."""
        if any(label_set for label_set, _ in counts):
            merged: dict[tuple[int, ...], float] = {}
            for (_, stack), count in counts.items():
                merged[stack] = merged.get(stack, 0.0) + count
            pairs: Iterable[tuple[tuple[int, ...], float]] = merged.items()
        else:
            # No labels in use: one entry per stack already (hashing long tuples is slow).
            pairs = ((stack, count) for (_, stack), count in counts.items())
        return ((stack, whole) for stack, count in pairs if (whole := int(count + 0.5)) > 0)

    def folded(
        self, counts: dict[tuple[int, tuple[int, ...]], float] | None = None
    ) -> dict[str, int]:
        """Returns the cumulative counts per folded stack, merged over label sets."""
        merged = self._merged(self._snapshot() if counts is None else counts)
        return {self._raw(stack).decode(): count for stack, count in merged}

    def folded_text(self, seconds: float = 0.0) -> bytes:
        """Returns folded-stack text (``stack count`` lines, in no particular order), as bytes:
        cumulative, or of the next ``seconds`` seconds."""
        merged = self._merged(self.counts_for(seconds) if seconds else self._snapshot())
        cached, quote = self._quoted.get, self._quote
        parts: list[bytes | memoryview] = []
        append = parts.append
        for stack, count in merged:
            append(memoryview(cached(stack) or quote(stack))[1:-1])  # no copy until the join
            append(b" %d\n" % count)
        return b"".join(parts)

    def counts_for(self, seconds: float) -> dict[tuple[int, tuple[int, ...]], float]:
        """Returns the samples of the next ``seconds`` seconds, per (label set, stack)."""
        before = self._snapshot()
        table = self.table
        time.sleep(seconds)
        after = self._snapshot()
        if self.table is not table:  # the process forked meanwhile: everything is new
            return after
        return {key: count - before.get(key, 0.0) for key, count in after.items()}

    def folded_for(self, seconds: float) -> dict[str, int]:
        """Returns a fresh profile of the next ``seconds`` seconds."""
        return self.folded(self.counts_for(seconds))

    def _document(self, since: int = 0) -> tuple[dict[str, Any], list[bytes]]:
        """Returns the document's head, and its stacks as JSON pieces: an opening ``[index,``
        (with the separating comma), the cached stack, and ``,count]``, three per stack, so
        the cached bytes are copied once, by the final join. With ``since``, only the stacks
        counted after tick ``since`` (a generation a reader already has) are listed."""
        counts, generation, touched = self._read(touched=bool(since))
        set_index: dict[int, int] = {0: 0}
        label_sets: list[dict[str, str]] = [{}]
        stacks: list[bytes] = []
        append = stacks.append
        total = 0
        cached, quote = self._quoted.get, self._quote
        for key, weight in counts.items():
            count = int(weight + 0.5)  # _whole(), inlined: this loop is the cost of serving
            if count <= 0:
                continue
            total += count
            if since and touched.get(key, 0) <= since:
                continue
            label_set, stack = key
            index = set_index.get(label_set)
            if index is None:
                index = set_index[label_set] = len(label_sets)
                label_sets.append(_labels.label_set(label_set))
            append(b",[%d," % index)
            append(cached(stack) or quote(stack))
            append(b",%d]" % count)
        if stacks:
            stacks[0] = stacks[0][1:]  # no comma before the first
        head = {
            "format": WIRE_FORMAT,
            "instance": dict(self.instance),
            "labels": dict(self.labels),
            "mode": self.mode,
            "interval": self.interval,
            "effective_interval": self.effective_interval,
            "time": round(time.time(), 3),
            "total_samples": total,
            "dropped_samples": self.dropped,
            "generation": generation,
            "since": since,
            "label_sets": label_sets,
        }
        return head, stacks

    def profile_json(self, since: int = 0, instance: str = "") -> bytes:
        """Returns the /profile.json document as UTF-8 JSON (see docs/wire-format.md): all
        stacks, or with ``since`` and this process's ``instance`` id, those counted after tick
        ``since`` (another process, or a generation not reached yet, gets all stacks)."""
        if instance != self.instance["id"] or not 0 < since <= self.table.generation:
            since = 0
        head, stacks = self._document(since)
        text = json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode()
        stacks.insert(0, text[:-1] + b',"stacks":[')
        stacks.append(b"]}")
        return b"".join(stacks)

    def profile(self) -> dict[str, Any]:
        """Returns the /profile.json document as a dict."""
        head, stacks = self._document()
        head["stacks"] = json.loads(b"[" + b"".join(stacks) + b"]")
        return head

    def info(self) -> dict[str, Any]:
        """Returns health and self-metrics (see docs/wire-format.md)."""
        wall = sum(h[0] for h in self._history)
        busy = sum(h[1] for h in self._history)
        ticks = sum(h[2] for h in self._history)
        uptime = time.monotonic() - self._started
        return {
            "status": "ok",
            "instance": dict(self.instance),
            "labels": dict(self.labels),
            "mode": self.mode,
            "driver": self.driver.name,
            "interval": self.interval,
            "effective_interval": self.effective_interval,
            "uptime_seconds": round(uptime, 3),
            "ticks": self.ticks,
            "total_samples": _whole(self.table.total),
            "dropped_samples": self.dropped,
            "tick_errors": self.errors,
            "distinct_stacks": len(self.table.counts),
            "max_stacks": self.table.max_stacks,
            "label_sets": _labels.label_set_count(),
            "overhead_percent": round(100.0 * busy / wall, 4) if wall else 0.0,
            "overhead_budget_percent": self.settings["overhead_budget"],
            "ticks_per_second": round(ticks / wall, 2) if wall else 0.0,
            "samples_per_second": round(self.table.total / uptime, 2) if uptime else 0.0,
            "endpoint": self.server.url if self.server is not None else None,
        }

    @property
    def url(self) -> str | None:
        """The endpoint's base URL, or None without an endpoint."""
        return self.server.url if self.server is not None else None


def _whole(samples: float) -> int:
    # Rounds half up: the rounded value of a growing count never goes down.
    return int(samples + 0.5)


def _program_name() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    name = name[:-3] if name.endswith(".py") else name
    return name if name and name != "-c" else "python"


# -- the process-wide sampler -----------------------------------------------------------------

_running: Sampler | None = None
_start_lock = threading.Lock()
_fork_hooks_installed = False


def start(**overrides: Any) -> Sampler:
    """Starts sampling and the HTTP endpoint; returns the running Sampler (the same one twice)."""
    global _running, _fork_hooks_installed
    with _start_lock:
        if _running is not None:
            return _running
        settings = _settings.resolve(overrides)
        host, token = settings["host"], settings["token"]
        if (
            settings["port"] is not None
            and not token
            and host not in ("127.0.0.1", "localhost", "::1")
        ):
            raise _settings.ConfigError(
                f"binding the sampler endpoint to {host!r} exposes stack traces: set a token "
                "(token=... or FLEETFLAME_TOKEN) or bind to 127.0.0.1"
            )
        sampler = Sampler(settings)
        sampler.start()
        _running = sampler
        if not _fork_hooks_installed:
            os.register_at_fork(
                before=_before_fork,
                after_in_parent=_after_fork_parent,
                after_in_child=_after_fork_child,
            )
            atexit.register(stop)
            _fork_hooks_installed = True
        return sampler


def stop() -> None:
    """Stops the running sampler, if any, restoring any previous signal handler."""
    global _running
    with _start_lock:
        sampler, _running = _running, None
    if sampler is not None:
        sampler.stop()


def running() -> Sampler | None:
    """Returns the running sampler, or None."""
    return _running


def start_from_env() -> Sampler | None:
    """Starts the sampler if FLEETFLAME_PORT or FLEETFLAME_ENABLE is set; never raises."""
    if not (
        os.environ.get("FLEETFLAME_PORT")
        or _settings.parse_bool(os.environ.get("FLEETFLAME_ENABLE", "0"))
    ):
        return None
    try:
        return start()
    except (SamplerError, _settings.ConfigError) as exc:
        log.warning("fleetflame sampler not started: %s", exc)
        return None


def _before_fork() -> None:
    sampler = _running
    if sampler is not None:
        # The child must not inherit the lock taken, nor counts half copied.
        sampler._lock.acquire()


def _after_fork_parent() -> None:
    sampler = _running
    if sampler is not None:
        sampler._lock.release()


def _after_fork_child() -> None:
    global _running
    sampler = _running
    if sampler is None:
        return
    try:
        if sampler.settings["follow_fork"]:
            sampler.after_fork_in_child()
        else:
            _running = None
            sampler._lock = threading.Lock()
            sampler.stop()
    except Exception:  # noqa: BLE001 - never break the host's fork
        log.exception("fleetflame sampler: could not restart after fork; sampling stopped")
        _running = None
