"""Exact call timelines of short runs: ``sampler.trace()`` and ``python -m sampler trace``.

Sampling is for production; for the first seconds of a benchmark this records every Python
call and return, and every call of a C function, in every thread, and writes them in the Trace
Event Format that Perfetto and ``chrome://tracing`` open (see docs/trace.md). Recording is in
``_trace_record`` and ``_trace_backends``, the file written by ``_trace_write``, its lines made
by ``_trace_format``. Never on unless asked for.

Tracing slows the program down. Before recording, ``_trace_cost`` measures what it costs
here; the trace reports its wall and CPU time, its events and an estimate of the CPU time the
tracing itself took, in the file's ``otherData`` and on stderr.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from time import perf_counter_ns

from . import _trace_cost, _trace_record, _trace_write
from ._trace_backends import MonitoringBackend, ProfileBackend

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any, TextIO

# 16 bytes an event in memory (an 8-byte time and a list slot): 2.5 million is ~40 MB, and a
# file of ~220 MB (~88 bytes an event), under chrome://tracing's 256 MB (google/trace-viewer#627)
# and well within what Perfetto's web UI holds in a browser tab.
DEFAULT_MAX_EVENTS = 2_500_000

_active: Trace | None = None
_active_lock = threading.Lock()


class TraceError(RuntimeError):
    """A trace could not start; the message says what to change."""


class Trace:
    """Records every call of every thread from ``start()`` to ``stop()`` and writes the file.

    As a context manager, records the block and writes the file when it ends. With
    ``seconds``, recording stops that long after the start (the program goes on untraced) and
    the file is written then. When ``max_events`` have been recorded, recording stops and the
    file says so.
    """

    def __init__(
        self,
        output: str,
        seconds: float | None = None,
        max_events: int | None = None,
        *,
        backend: str | None = None,
        main_file: str | None = None,
        process_name: str | None = None,
        report: TextIO | None = None,
    ) -> None:
        if seconds is not None and not 0 < seconds < float("inf"):
            raise ValueError(f"seconds must be a positive number, got {seconds!r}")
        max_events = DEFAULT_MAX_EVENTS if max_events is None else max_events
        if max_events < 1:
            raise ValueError(f"max_events must be at least 1, got {max_events!r}")
        if backend not in (None, "sys.monitoring", "sys.setprofile"):
            raise ValueError(f"backend must be sys.monitoring or sys.setprofile, got {backend!r}")
        problem = _trace_write.output_problem(output)
        if problem:
            raise ValueError(problem)
        self.output = output
        self.seconds = seconds
        self.max_events = max_events
        self.metadata: dict[str, Any] = {}
        self._backend_name = backend
        self._main_file = main_file
        self._process_name = process_name or " ".join(sys.argv) or sys.executable
        self._report = report
        self._recorder: _trace_record.Recorder | None = None
        self._backend: ProfileBackend | MonitoringBackend | None = None
        self._timer: threading.Thread | None = None
        self._wake = threading.Event()
        self._begun = threading.Event()
        self._write_lock = threading.Lock()
        self._written = False
        self._calibration: dict[str, Any] = {}
        self._cpu = [0.0, 0.0]  # process CPU time at the start and at the end of recording
        self._notes: list[str] = []

    def __enter__(self) -> Trace:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> Trace:
        """Calibrates, then starts recording every thread; returns the trace."""
        global _active
        if self._recorder is not None:
            raise TraceError("this trace has already recorded: make a new one")
        own = sys.getprofile()
        if own is not None and not callable(own):
            # A C profiler (cProfile before 3.12): sys.getprofile() gives its object, which
            # sys.setprofile could not put back; the trace would also take its place.
            kind = type(own)
            raise TraceError(
                f"a profiler written in C holds this thread's profile function ("
                f"{kind.__module__}.{kind.__qualname__}): disable it before tracing and enable "
                "it after (one profile function per thread)"
            )
        with _active_lock:
            if _active is not None:
                raise TraceError(
                    "a trace is already recording in this process: stop it first "
                    "(one trace at a time, as one profile function per thread)"
                )
            _active = self
        try:
            backend_class = self._choose_backend()
            self._calibration = _trace_cost.calibrate(backend_class)
            excluded: set[int] = set()
            if self.seconds is not None:
                self._timer = threading.Thread(
                    target=self._time_limit, name="fleetflame-trace-timer", daemon=True
                )
                self._timer.start()
                if self._timer.ident is not None:
                    excluded.add(self._timer.ident)
            recorder = self._recorder = _trace_record.Recorder(self.max_events, excluded)
            backend = self._backend = backend_class(recorder)
            recorder.on_stop = self._recording_stopped
            self._cpu[0] = time.process_time()
            self._begun.set()  # before recording, so as not to be recorded
            backend.start()  # sets recorder.start_ns just before the first event can come
        except BaseException:
            self._wake.set()
            self._begun.set()
            if self._timer is not None:
                self._timer.join()
            self._recorder = None
            with _active_lock:
                _active = None
            raise
        return self

    def close(self) -> None:
        """Stops recording if it still runs, and writes the file once: when the ``seconds``
        timer is writing it, waits until it is written (the program may be about to exit)."""
        if self._recorder is None:
            return
        try:
            self._recorder.stop("end")
            if self._backend is not None:
                self._backend.stop()  # this thread gets its own profile function back now
            self._wake.set()
            timer = self._timer
            if timer is not None and timer is not threading.current_thread():
                timer.join()
            self._write()  # after the timer's: does nothing then
        finally:
            self._release()

    def _release(self) -> None:
        # Recording has stopped and the file is written: another trace may start.
        global _active
        with _active_lock:
            if _active is self:
                _active = None

    def _forget(self) -> None:
        # In a child forked while recording: the parent writes the file, the child stops.
        self._written = True
        self._write_lock = threading.Lock()  # the parent's timer thread may have held it
        if self._recorder is not None:
            self._recorder.stop("fork")
            for buffer in self._recorder.buffers:
                del buffer.times[:]
                buffer.objs.clear()
        if self._backend is not None:
            self._backend.stop()

    def _choose_backend(
        self,
    ) -> type[ProfileBackend | MonitoringBackend]:
        monitoring_problem = MonitoringBackend.unavailable()
        if self._backend_name == "sys.setprofile":
            return ProfileBackend
        if self._backend_name == "sys.monitoring" and monitoring_problem:
            raise TraceError(f"cannot trace with sys.monitoring: {monitoring_problem}")
        if monitoring_problem is None:
            return MonitoringBackend
        if hasattr(sys, "monitoring"):
            self._notes.append(f"sys.setprofile used: {monitoring_problem}")
        return ProfileBackend

    def _recording_stopped(self) -> None:
        # Runs in whichever thread stopped the recording, perhaps inside a profile callback.
        self._cpu[1] = time.process_time()
        if self._backend is not None:
            self._backend.stop()

    def _time_limit(self) -> None:
        assert self.seconds is not None
        self._begun.wait()
        recorder = self._recorder
        if recorder is None:
            return
        # Woken a little before the recording starts (backend.start() sets start_ns): the
        # seconds count from then, however few they are.
        while not recorder.start_ns:
            if self._wake.wait(0.0005):
                return
        deadline = recorder.start_ns + self.seconds * 1e9
        while (now := perf_counter_ns()) < deadline:
            if self._wake.wait((deadline - now) / 1e9):
                return
        if recorder.stop("seconds"):
            try:
                self._write()
            except OSError as exc:
                print(f"fleetflame trace: could not write {self.output}: {exc}", file=sys.stderr)
            finally:
                self._release()

    def _write(self) -> None:
        with self._write_lock:
            if self._written or self._recorder is None:
                return
            self._written = True
            recorder = self._recorder
            started = time.perf_counter()
            cpu = self._cpu[1] - self._cpu[0]
            metadata = self.metadata = _trace_write.metadata(
                recorder, self._backend, self._notes, cpu, self._calibration
            )
            lost: list[str] = []
            lines, calls = _trace_write.trace_lines(
                recorder,
                self._main_file,
                self._process_name,
                lost,
                releases=isinstance(self._backend, ProfileBackend),
            )

            def finished() -> dict[str, Any]:
                metadata["calls"] = calls[0]
                metadata["notes"] += lost
                return metadata

            metadata["file_bytes"] = _trace_write.write_atomically(self.output, lines, finished)
            self.metadata["write_seconds"] = round(time.perf_counter() - started, 3)
            for buffer in recorder.buffers:  # the memory goes now, not when the trace object does
                del buffer.times[:]
                buffer.objs.clear()
            recorder.c_keys.clear()
            _trace_write.say(self.metadata, self.output, self._report)


def _after_fork_in_child() -> None:
    global _active
    trace, _active = _active, None
    if trace is not None:
        trace._forget()


os.register_at_fork(after_in_child=_after_fork_in_child)
