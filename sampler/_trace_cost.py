"""What tracing costs the traced program: measured at the start, estimated at the end.

Two costs, measured before each trace by running small loops untraced and traced here, on
this interpreter and backend (the fastest of several rounds of each):

- every event (a call, a return, a C call) costs ``per_event_ns``: the interpreter's dispatch
  to the recorder and the recorder's own work;
- with ``sys.setprofile`` (CPython 3.11 and older), all Python code runs slower while a profile
  function is set, events or not, because the interpreter leaves its specialized instructions
  for its tracing path: ``bytecode_factor`` (about 2 here; 1 under ``sys.monitoring``, which
  instruments only the instructions it watches).

The estimate applies them to the CPU time the process used while it was traced: ``events x
per_event_ns``, and the rest of that CPU time taken as Python code slowed by the factor. It is
an estimate: C code the program runs is not slowed by the factor, the loops run from warm
caches where a large program does not, and a thread waiting for the GIL while another records
is slowed without using CPU. docs/trace.md compares it with measured slowdowns.
"""

from __future__ import annotations

import threading
from time import perf_counter_ns

from . import _trace_record

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from ._trace_backends import MonitoringBackend, ProfileBackend

    Backend = type[ProfileBackend | MonitoringBackend]

ROUNDS = 5
CALLS = 300  # of a function of the usual kinds of calls: ~34 events each
LOOP = 15_000  # iterations of a loop making no call

EXPLANATION = (
    "events x per_event_ns, plus the rest of the CPU time used while tracing taken as Python "
    "code slowed by bytecode_factor; both measured at start with small loops, untraced and "
    "traced. It leaves out that C code is not slowed by the factor, the program's own cache "
    "and memory effects (in docs/trace.md's benchmark a large program paid up to 1.8x the "
    "calibrated cost an event), and threads waiting for the GIL while another records"
)


class _Item:
    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value

    def double(self) -> int:
        return self.value * 2


def _numbers(count: int) -> Iterator[int]:
    yield from range(count)


def _leaf() -> str:
    # Calls of functions, methods, a class, a generator and a comprehension (each a frame), C
    # functions of a module and C methods of instances, as most programs make them.
    items = [_Item(i) for i in _numbers(3)]
    total = sum([item.double() for item in items])
    parts: list[str] = []
    parts.append(str(total))
    return "".join(parts) + str(len(items))


def _calls(count: int) -> None:
    leaf = _leaf
    for _ in range(count):
        leaf()


def _no_calls(count: int) -> int:
    total = 0
    table = {"a": 1}
    items = [1, 2, 3]
    for i in range(count):
        total = total + i * 2 % 7 + table["a"] + items[1]
        if total > 1000:
            total = 0
    return total


def _fastest(run: Any, count: int, backend_class: Backend | None) -> tuple[int, int]:
    """Times ``run(count)`` ROUNDS times, traced with the backend if any; returns the fastest
    time and the events this thread recorded in a round."""
    best = 1 << 62
    events = 0
    for _ in range(ROUNDS):
        recorder = backend = None
        if backend_class is not None:
            recorder = _trace_record.Recorder(1 << 20)
            backend = backend_class(recorder)
            backend.start(all_threads=False)
        started = perf_counter_ns()
        run(count)
        took = perf_counter_ns() - started
        if recorder is not None and backend is not None:
            recorder.stop("end")
            backend.stop()
            ident = threading.get_ident()
            events = sum(len(b.times) for b in recorder.buffers if b.ident == ident)
        best = min(best, took)
    return best, events


def calibrate(backend_class: Backend) -> dict[str, Any]:
    """Measures ``per_event_ns`` and ``bytecode_factor`` for this backend here (~50 ms)."""
    loop_untraced, _ = _fastest(_no_calls, LOOP, None)
    loop_traced, _ = _fastest(_no_calls, LOOP, backend_class)
    factor = max(1.0, loop_traced / max(loop_untraced, 1))
    calls_untraced, _ = _fastest(_calls, CALLS, None)
    calls_traced, events = _fastest(_calls, CALLS, backend_class)
    per_event = max(0.0, (calls_traced - factor * calls_untraced) / max(events, 1))
    return {
        "per_event_ns": round(per_event, 1),
        "bytecode_factor": round(factor, 3),
        "rounds": ROUNDS,
        "events_per_round": events,
        "calls_untraced_ns": calls_untraced,
        "calls_traced_ns": calls_traced,
        "loop_untraced_ns": loop_untraced,
        "loop_traced_ns": loop_traced,
    }


def estimate(calibration: dict[str, Any], events: int, cpu_seconds: float) -> dict[str, Any]:
    """Estimates the CPU time the tracing took of ``cpu_seconds``, and the slowdown."""
    per_event = calibration.get("per_event_ns", 0.0) * events / 1e9
    factor = calibration.get("bytecode_factor", 1.0)
    rest = max(0.0, cpu_seconds - per_event)
    overhead = min(cpu_seconds, per_event + rest * (1 - 1 / factor))
    untraced = cpu_seconds - overhead
    return {
        "estimated_overhead_cpu_seconds": round(overhead, 6),
        "estimated_slowdown": round(cpu_seconds / untraced, 2) if untraced > 0 else None,
    }
