"""The two ways a trace's events reach the per-thread buffers of ``_trace_record``.

``sys.monitoring`` (Python 3.12+: one set of callbacks for the whole process) and
``sys.setprofile`` (older Pythons, or when other tools hold the monitoring ids it may take:
one closure per thread, handed to threads started later by ``threading.setprofile`` and to the
threads already running by ``sys._setprofileallthreads`` on 3.12+ or ``_trace_threads`` on 3.10
and 3.11). A C method is named by ``(its type, its name)``, never kept itself: the bound method
the profiler is handed holds its instance, and keeping it would keep every object whose C
method was called alive until the trace is written. A C method of a class (``datetime.now``,
``dict.fromkeys``) is named by ``(the class, its name)``: its bound method is a new object at
every call, and keeping those would break the memory bound.
"""

from __future__ import annotations

import sys
import threading
from time import perf_counter_ns
from types import BuiltinFunctionType, MethodDescriptorType, ModuleType

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ._trace_record import Buffer, Recorder

    ProfileFunction = Callable[..., Any]

# The sys.monitoring events a trace listens to, in the order their callbacks are registered.
_EVENTS = (
    "PY_START",
    "PY_RESUME",
    "PY_THROW",
    "PY_RETURN",
    "PY_YIELD",
    "PY_UNWIND",
    "CALL",
    "C_RETURN",
    "C_RAISE",
)


# The sys.monitoring tool ids a trace may take, in order: first the two no convention gives a
# tool, so that the traced program's own profiler (cProfile on PROFILER_ID), coverage
# (COVERAGE_ID) or debugger (DEBUGGER_ID) still finds its slot free; PROFILER_ID last.
TOOL_IDS = (3, 4, 2)


def _free_tools(monitoring: Any) -> list[int]:
    return [i for i in TOOL_IDS if monitoring.get_tool(i) is None]


class ProfileBackend:
    """Records through ``sys.setprofile``: a closure per thread appends to that thread's buffer."""

    name = "sys.setprofile"

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.notes: list[str] = []
        self._threading_previous: ProfileFunction | None = None
        self._own: dict[int, tuple[ProfileFunction, ProfileFunction | None, Buffer]] = {}
        self._starter = 0

    def start(self, all_threads: bool = True) -> None:
        """Records in the calling thread, and with ``all_threads`` in every other thread."""
        previous = sys.getprofile()
        self._starter = threading.get_ident()
        profile = self._profile_for(self.recorder.new_buffer(), previous)
        profile_others = None
        if all_threads and not hasattr(sys, "_setprofileallthreads"):
            from ._trace_threads import other_threads_profiler

            profile_others, problem = other_threads_profiler()
            if profile_others is None:
                self.notes.append(f"threads running before the trace not recorded: {problem}")
        self.recorder.start_ns = perf_counter_ns()
        if all_threads:
            self._threading_previous = threading.getprofile()
            threading.setprofile(self._bootstrap)
            if hasattr(sys, "_setprofileallthreads"):  # 3.12+
                # Every thread gets the bootstrap, this one too; it then takes its closure.
                sys._setprofileallthreads(self._bootstrap)
            elif profile_others is not None:
                _, skipped = profile_others(self._bootstrap)
                if skipped:
                    self.notes.append(
                        f"{skipped} thread(s) with a profile function of their own not recorded"
                    )
        sys.setprofile(profile)

    def stop(self) -> None:
        """Stops recording; the calling thread gets back the profile function it had."""
        if threading.getprofile() == self._bootstrap:
            threading.setprofile(self._threading_previous)
        mine = self._own.get(threading.get_ident())
        if mine is None or mine[2].released:
            return
        if sys.getprofile() is mine[0]:
            sys.setprofile(mine[1])
            mine[2].released = True
        else:
            # Taken away while recording: an exception raised inside it (CPython then removes
            # a profile function: a RecursionError near the limit, a signal handler's
            # exception, which runs inside it), or the program's own sys.setprofile.
            mine[2].lost = True

    def _bootstrap(self, frame: Any, event: str, arg: Any) -> None:
        # A thread's first event: it gets a buffer and a closure of its own.
        ident = threading.get_ident()
        if ident == self._starter and ident in self._own:
            return  # 3.12+ gave it the bootstrap too; start() is about to give it its closure
        if self.recorder.stopped or ident in self.recorder.excluded:
            sys.setprofile(None)
            return
        profile = self._profile_for(self.recorder.new_buffer(), None)
        sys.setprofile(profile)
        profile(frame, event, arg)

    def _profile_for(self, buffer: Buffer, previous: ProfileFunction | None) -> ProfileFunction:
        recorder = self.recorder
        t_append = buffer.t
        o_append = buffer.o
        now = perf_counter_ns
        module_type = ModuleType
        type_type = type
        intern = recorder.c_keys.setdefault
        setprofile = sys.setprofile
        left = 0

        def profile(frame: Any, event: str, arg: Any) -> None:
            nonlocal left
            if left:
                left -= 1
                if event == "call":
                    o_append(frame.f_code)
                    t_append(now())
                elif event == "c_call":
                    owner = arg.__self__
                    kind = owner.__class__
                    if kind is module_type or owner is None:
                        o_append(arg)
                    elif kind is type_type:  # a class's C method: a new bound method each call
                        key = (owner, arg.__name__)
                        o_append(intern(key, key))
                    else:
                        key = (kind, arg.__name__)
                        o_append(intern(key, key))
                    t_append(now())
                else:  # return, c_return, c_exception
                    t_append(now())
                    o_append(None)
                return
            left = recorder.take(buffer)
            if left:
                profile(frame, event, arg)
            else:
                buffer.released = True
                setprofile(previous)

        def halt() -> None:
            nonlocal left
            left = 0

        recorder.halts.append(halt)
        self._own[buffer.ident] = (profile, previous, buffer)
        return profile


class MonitoringBackend:
    """Records through ``sys.monitoring`` (3.12+): one set of callbacks for every thread."""

    name = "sys.monitoring"

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.notes: list[str] = []
        self._tool = -1

    @staticmethod
    def unavailable() -> str | None:
        """Says why this backend cannot run here, or None."""
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is None:
            return "sys.monitoring needs Python 3.12+"
        if not _free_tools(monitoring):
            held = ", ".join(f"{i} by {monitoring.get_tool(i)!r}" for i in TOOL_IDS)
            return f"the sys.monitoring tool ids a trace takes are held ({held})"
        return None

    def start(self, all_threads: bool = True) -> None:
        """Records in every thread (monitoring cannot be set for one thread only)."""
        monitoring = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        events = monitoring.events
        for tool in _free_tools(monitoring):
            try:
                monitoring.use_tool_id(tool, "fleetflame trace")
                break
            except ValueError:  # taken since: the next
                continue
        else:
            raise RuntimeError(MonitoringBackend.unavailable() or "no sys.monitoring tool id free")
        self._tool = tool
        on_start, on_end, on_call, on_c_end = self._callbacks()
        callbacks = (on_start,) * 3 + (on_end,) * 3 + (on_call, on_c_end, on_c_end)
        self.recorder.start_ns = perf_counter_ns()
        mask = 0
        for name, callback in zip(_EVENTS, callbacks, strict=True):
            event = getattr(events, name)
            monitoring.register_callback(tool, event, callback)
            mask |= event
        monitoring.set_events(tool, mask)

    def stop(self) -> None:
        """Stops every callback at once and gives the tool id back."""
        if self._tool < 0:
            return
        monitoring = sys.monitoring  # type: ignore[attr-defined,unused-ignore]
        monitoring.set_events(self._tool, 0)
        for name in _EVENTS:
            monitoring.register_callback(self._tool, getattr(monitoring.events, name), None)
        monitoring.free_tool_id(self._tool)
        self._tool = -1

    def _callbacks(self) -> tuple[Callable[..., None], ...]:
        recorder = self.recorder
        local = threading.local()
        now = perf_counter_ns
        builtin = BuiltinFunctionType
        descriptor = MethodDescriptorType
        module_type = ModuleType
        type_type = type
        intern = recorder.c_keys.setdefault

        def join() -> Buffer:
            buffer = local.b = recorder.new_buffer()
            return buffer

        # The same predicate for a C call and its return, as CPython's own setprofile-over-
        # monitoring has it: builtin functions and method descriptors, not classes.
        def on_start(code: Any, offset: int, exception: Any = None) -> None:
            try:
                b = local.b
            except AttributeError:
                b = join()
            if b.left:
                b.left -= 1
                b.o(code)
                b.t(now())
            else:
                b.left = recorder.take(b)
                if b.left:
                    on_start(code, offset)

        def on_end(code: Any, offset: int, value: Any) -> None:
            try:
                b = local.b
            except AttributeError:
                b = join()
            if b.left:
                b.left -= 1
                b.t(now())
                b.o(None)
            else:
                b.left = recorder.take(b)
                if b.left:
                    on_end(code, offset, value)

        def on_call(code: Any, offset: int, function: Any, arg0: Any) -> None:
            kind = type(function)
            if kind is builtin:
                owner = function.__self__
                owner_kind = owner.__class__
                if owner_kind is type_type:  # a class's C method: a new bound method each call
                    key = (owner, function.__name__)
                    function = intern(key, key)
                elif not (owner_kind is module_type or owner is None):
                    key = (owner_kind, function.__name__)
                    function = intern(key, key)
            elif kind is not descriptor:
                return
            on_start(function, offset)  # recorded as a Python start is, the C function for code

        def on_c_end(code: Any, offset: int, function: Any, arg0: Any) -> None:
            kind = type(function)
            if kind is builtin or kind is descriptor:
                on_end(code, offset, None)

        return on_start, on_end, on_call, on_c_end
