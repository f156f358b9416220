"""The Sampler: ties the stack table, an engine and the HTTP endpoint together.

What it serves is made by ``_stack_text``; the process's one sampler, started, stopped and
carried over ``fork()``, is kept by ``_process``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from . import _labels
from ._budget import OverheadBudget
from ._engine_python import PythonEngine
from ._log import log
from ._stack_text import StackText
from ._stack_text import merged as merged_counts
from ._stacks import StackTable
from .profile.frames import MAX_LABELS, MAX_NAME, label_text

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

    from ._stacks import StackKey


# Samples kept with their time and thread (StackTable.recent): ~10 s of 8 busy threads.
RECENT_SAMPLES = 8192


class SamplerError(RuntimeError):
    """The sampler could not start; the message says what to change."""


class _ExcludedThreads(set[int]):
    """Thread idents left out of the profile (the sampler's own, and host threads while they
    serve the endpoint); an engine that must act on a change sets ``on_change``."""

    on_change: Callable[[int, bool], None] | None = None

    def add(self, ident: int) -> None:
        super().add(ident)
        if self.on_change is not None:
            self.on_change(ident, True)

    def discard(self, ident: object) -> None:
        super().discard(ident)
        if self.on_change is not None and isinstance(ident, int):
            self.on_change(ident, False)

    def run_as_own(self, body: Callable[[], None]) -> None:
        """Runs ``body`` on the calling thread, one of the sampler's own, left out while it
        runs: idents are reused, and a host thread started after this one ends may get its."""
        ident = threading.get_ident()
        self.add(ident)
        try:
            body()
        finally:
            try:
                self.discard(ident)
            except OSError:  # the engine could not be told: it stopped
                pass


class Sampler:
    """A running sampler: its settings, its counts, its engine and its endpoint."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.mode: str = settings["mode"]
        self.interval: float = settings["interval"]
        self.host_name = os.uname().nodename  # gethostname(), without importing socket
        service = label_text(settings["service"] or _program_name(), MAX_NAME)
        # Bounded as the wire bounds them (a label too many or too long and the collector
        # would refuse the worker's whole profile): the first in key order, beside these two.
        given = sorted(settings["labels"].items())[: MAX_LABELS - 2]
        self.labels = {"service": service, "host": label_text(self.host_name, MAX_NAME)}
        self.labels |= {key: value for key, value in given if key not in self.labels}
        self.server: Any = None
        self.stalls: Any = None
        self._excluded = _ExcludedThreads()
        self.engine_reason: str | None = None
        self._fresh_state()

    def _fresh_state(self) -> None:
        s = self.settings
        self.instance = {
            "id": os.urandom(8).hex(),
            "pid": os.getpid(),
            "start_time": round(time.time(), 3),
            "host": self.host_name,
        }
        self._lock = threading.Lock()
        # Between a fall back (on the native engine's drain thread) and stop(): a stop in the
        # middle of one must stop the engine that takes over, not one not yet started.
        self._engine_lock = threading.Lock()
        self._engine_stopped = False
        self.table = StackTable.from_settings(
            s, mode=self.mode, interval=self.interval, recent=RECENT_SAMPLES
        )
        self._text = StackText(self.table)
        self.ticks = 0
        self.dropped = 0
        self.errors = 0
        self._started = time.monotonic()
        self.budget = OverheadBudget(self.interval, s["overhead_budget"], self._arm)
        self.engine: Any = self._make_engine()

    def _make_engine(self) -> Any:
        wanted = self.settings["engine"]
        if wanted == "auto" and self.settings["driver"] != "auto":
            self.engine_reason = f"driver={self.settings['driver']} is a python engine driver"
            return PythonEngine(self)
        if wanted != "python":
            from ._engine_native import NativeEngine, unavailable

            reason = unavailable()
            if reason is None:
                return NativeEngine(self)
            if wanted == "native":
                raise SamplerError(f"engine='native' cannot run here: {reason}")
            self.engine_reason = reason
        return PythonEngine(self)

    def _arm(self, interval: float) -> None:
        self.engine.arm(interval)

    @property
    def effective_interval(self) -> float:
        """The interval in force: the configured one, or what the overhead budget stretched it to."""
        return self.budget.effective_interval

    @property
    def driver(self) -> Any:
        """The python engine's driver (signal or thread); the native engine has none."""
        return getattr(self.engine, "driver", None)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Starts sampling, watching for stalls and, unless the port is none, the endpoint."""
        self._start_server()
        self._start_engine()
        self._start_stalls()

    def _start_stalls(self) -> None:
        if not self.settings["stalls"]:
            return
        from ._stalls import StallWatcher

        self.stalls = StallWatcher(
            self, self.settings["stall_threshold"], self.settings["request_stall_threshold"]
        )
        self.stalls.start()

    def _start_engine(self) -> None:
        try:
            self.engine.start(self.effective_interval)
        except Exception as exc:
            from ._engine_native import NativeEngineError

            if not isinstance(exc, NativeEngineError) or self.settings["engine"] == "native":
                raise SamplerError(f"the sampler could not start: {exc}") from exc
            self.engine_reason = str(exc)
            log.warning("fleetflame sampler: %s; using the python engine", exc)
            self.engine = PythonEngine(self)
            self.engine.start(self.effective_interval)

    def fall_back(self, reason: str) -> None:
        """Moves to the python engine after the native one failed, with one logged line; not
        once stopped."""
        with self._engine_lock:
            if self._engine_stopped:
                return
            log.warning("fleetflame sampler: %s; using the python engine from now on", reason)
            self.engine_reason = reason
            failed, engine = self.engine, PythonEngine(self)
            try:
                failed.stop()
            except Exception:  # noqa: BLE001 - it failed already; what it counted is kept
                pass
            engine.start(self.effective_interval)
            self.engine = engine  # running: a stop from now on stops it

    def log_tick_failure(self) -> None:
        """Logs the first failed tick (further failures are counted in /info)."""
        log.exception("fleetflame sampler: a tick failed (further failures are counted)")

    def _start_server(self, in_child: bool = False) -> None:
        ports = self.settings["port"]
        if ports is None:
            return
        from ._server import start_server

        self.server = start_server(
            self,
            self.settings["host"],
            ports,
            self.settings["token"],
            self._excluded.add,
            in_child=in_child,
        )

    def stop(self) -> None:
        """Stops the engine and the endpoint; the counts and stalls stay readable."""
        if self.stalls is not None:
            self.stalls.stop()
        with self._engine_lock:  # after a fall back under way, stops the engine it started
            self._engine_stopped = True
            engine = self.engine
        engine.stop()  # without the lock: the native engine's stop joins its drain thread
        with self._lock:
            self.table.stopped = True
        if self.server is not None:
            self.server.stop()
            self.server = None

    def after_fork_in_child(self) -> None:
        """Starts over in a forked child: fresh counts and id, own engine and endpoint."""
        old_server, self.server = self.server, None
        if old_server is not None:
            old_server.close_inherited()
        self.engine.after_fork_in_child()
        if self.stalls is not None:
            self.stalls.after_fork_in_child()
        self._excluded = _ExcludedThreads()
        self._fresh_state()
        try:
            self._start_server(in_child=True)
        except SamplerError as exc:
            log.warning(
                "fleetflame sampler in child %d: %s; sampling without endpoint", os.getpid(), exc
            )
        self._start_engine()
        self._start_stalls()

    # -- reading ---------------------------------------------------------------------------

    def _snapshot(self) -> dict[StackKey, int]:
        return self._read()[0]

    def _read(self, touched: bool = False) -> tuple[dict[StackKey, int], int, dict[StackKey, int]]:
        """Returns a settled copy of the counts, the tick it is complete up to, and (when asked)
        a copy of the tick that last changed each count, all taken together."""
        with self._lock:
            if not self.table.stopped:
                self.engine.catch_up()
            table = self.table
            return table.snapshot(), table.generation, dict(table.touched) if touched else {}

    def folded(self, counts: dict[StackKey, int] | None = None) -> dict[str, int]:
        """Returns the cumulative counts per folded stack, merged over label sets."""
        merged = merged_counts(self._snapshot() if counts is None else counts)
        return {self._text.raw(stack).decode(): count for stack, count in merged}

    def folded_text(self, seconds: float = 0.0) -> bytes:
        """Returns folded-stack text (``stack count`` lines, in no particular order), as bytes:
        cumulative, or of the next ``seconds`` seconds."""
        return self._text.folded_text(self.counts_for(seconds) if seconds else self._snapshot())

    def counts_for(self, seconds: float) -> dict[StackKey, int]:
        """Returns the samples of the next ``seconds`` seconds, per (label set, stack)."""
        before = self._snapshot()
        table = self.table
        time.sleep(seconds)
        after = self._snapshot()
        if self.table is not table:  # the process forked meanwhile: everything is new
            return after
        return {key: count - before.get(key, 0) for key, count in after.items()}

    def folded_for(self, seconds: float) -> dict[str, int]:
        """Returns a fresh profile of the next ``seconds`` seconds."""
        return self.folded(self.counts_for(seconds))

    def _document(self, since: int = 0) -> tuple[dict[str, Any], list[bytes]]:
        """Returns the document's head, and its stacks as JSON pieces (see
        ``StackText.document_stacks``): with ``since``, only the stacks counted after tick
        ``since`` (a generation a reader already has)."""
        from .profile import document_head  # loaded on first use, as json is

        counts, generation, touched = self._read(touched=bool(since))
        stacks, label_sets, total = self._text.document_stacks(counts, touched, since)
        head = document_head(
            instance=self.instance,
            labels=self.labels,
            mode=self.mode,
            interval=self.interval,
            effective_interval=self.effective_interval,
            time=round(time.time(), 3),
            total_samples=total,
            dropped_samples=self.dropped,
            generation=generation,
            since=since,
            label_sets=label_sets,
        )
        return head, stacks

    def profile_json(self, since: int = 0, instance: str = "") -> bytes:
        """Returns the /profile.json document as UTF-8 JSON (see docs/wire-format.md): all
        stacks, or with ``since`` and this process's ``instance`` id, those counted after tick
        ``since`` (another process, or a generation not reached yet, gets all stacks)."""
        from .profile import encode_document

        if instance != self.instance["id"] or not 0 < since <= self.table.generation:
            since = 0
        return encode_document(*self._document(since))

    def profile(self) -> dict[str, Any]:
        """Returns the /profile.json document as a dict."""
        import json

        head, stacks = self._document()
        head["stacks"] = json.loads(b"[" + b"".join(stacks) + b"]")
        return head

    def info(self) -> dict[str, Any]:
        """Returns health and self-metrics (see docs/wire-format.md)."""
        with self._lock:
            if not self.table.stopped:
                self.engine.catch_up()
        uptime = time.monotonic() - self._started
        return {
            "status": "ok",
            "instance": dict(self.instance),
            "labels": dict(self.labels),
            "mode": self.mode,
            "engine": self.engine.name,
            "engine_reason": self.engine_reason,
            **self.engine.info(),
            "interval": self.interval,
            "effective_interval": self.effective_interval,
            "uptime_seconds": round(uptime, 3),
            "ticks": self.ticks,
            "total_samples": int(self.table.total),
            "dropped_samples": self.dropped,
            "tick_errors": self.errors,
            "distinct_stacks": len(self.table.counts),
            "max_stacks": self.table.max_stacks,
            "label_sets": _labels.label_set_count(),
            **self.budget.summary(),
            "overhead_budget_percent": self.settings["overhead_budget"],
            "samples_per_second": round(self.table.total / uptime, 2) if uptime else 0.0,
            "endpoint": self.server.url if self.server is not None else None,
        }

    @property
    def url(self) -> str | None:
        """The endpoint's base URL, or None without an endpoint."""
        return self.server.url if self.server is not None else None


def _program_name() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    name = name[:-3] if name.endswith(".py") else name
    return name if name and name != "-c" else "python"
