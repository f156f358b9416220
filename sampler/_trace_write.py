"""Writing a finished trace: its events as Trace Event Format lines, atomically, with its
``otherData`` (what was recorded, how, and what it cost) and a summary on stderr.
"""

from __future__ import annotations

import os
import sys
import threading
from types import CodeType, FunctionType

from . import _trace_cost, _trace_format

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any, TextIO

    from ._trace_backends import MonitoringBackend, ProfileBackend
    from ._trace_record import Recorder

# The tracer's own files: their frames are left out of the trace.
HIDDEN_FILES = tuple(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    for name in (
        "_trace.py",
        "_trace_backends.py",
        "_trace_cli.py",
        "_trace_cost.py",
        "_trace_record.py",
        "_trace_threads.py",
        "_trace_write.py",
    )
)


def metadata(
    recorder: Recorder,
    backend: ProfileBackend | MonitoringBackend | None,
    notes: list[str],
    cpu: float,
    calibration: dict[str, Any],
) -> dict[str, Any]:
    """Returns the trace's ``otherData``: what was recorded, how, and what it cost."""
    seconds = (recorder.end_ns - recorder.start_ns) / 1e9
    events = events_before(recorder)
    notes = notes + (backend.notes if backend is not None else [])
    full = recorder.reason == "max_events"
    if full:
        notes.append(
            f"buffer full: recording stopped after {events:,} events at {seconds:.3f} s; "
            "nothing after that was recorded (raise max_events)"
        )
    return {
        "tool": "fleetflame trace",
        "python": sys.version.split()[0],
        "backend": backend.name if backend is not None else "",
        "stopped_by": recorder.reason,
        "traced_seconds": round(seconds, 6),
        "cpu_seconds": round(cpu, 6),
        "events": events,
        "max_events": recorder.max_events,
        "buffer_full": full,
        "events_dropped": "all events after the buffer filled" if full else 0,
        "threads": sum(1 for b in recorder.buffers if not b.excluded and b.times),
        "per_event_ns": calibration["per_event_ns"],
        "bytecode_factor": calibration["bytecode_factor"],
        **_trace_cost.estimate(calibration, events, cpu),
        "overhead_estimate": _trace_cost.EXPLANATION,
        "calibration": calibration,
        "notes": notes,
    }


def trace_lines(
    recorder: Recorder,
    main_file: str | None,
    process_name: str,
    notes: list[str] | None = None,
    releases: bool = False,
) -> tuple[Any, list[int]]:
    """Returns the file's event lines, made as they are read, and the calls counted in them.

    ``releases``: the backend marks each thread whose recording stopped as it should
    (``sys.setprofile``'s); then a thread that has ended with calls open, or that is marked
    lost, stopped recording early, and ``notes`` gets what was lost, from when.
    """
    names = _trace_format.Names(
        module_map(main_file), sys.path, HIDDEN_FILES, module_by_code=modules_of_functions()
    )
    pid = os.getpid()
    buffers = [b for b in recorder.buffers if not b.excluded and b.times]
    live = {(t.ident, t.native_id): t.name for t in threading.enumerate()}
    running = set(sys._current_frames())
    main = threading.main_thread().ident
    buffers.sort(key=lambda b: (b.ident != main, b.times[0]))
    threads = [
        (b.native_id, live.get((b.ident, b.native_id)) or b.name or f"thread {b.native_id}")
        for b in buffers
    ]
    calls = [0]

    def generate() -> Any:
        yield from _trace_format.metadata_lines(pid, process_name, threads)
        for buffer, (_, thread_name) in zip(buffers, threads, strict=True):
            suspect = buffer.lost or (
                releases and not buffer.released and buffer.ident not in running
            )
            early: list[int] | None = [] if suspect else None
            for line in _trace_format.thread_lines(
                buffer.times,
                buffer.objs,
                recorder.start_ns,
                recorder.end_ns,
                pid,
                buffer.native_id,
                names.fragment,
                early,
            ):
                if line[7] == "B":
                    calls[0] += 1
                yield line
            if early and notes is not None and (buffer.lost or early[1]):
                notes.append(lost_note(thread_name, (early[0] - recorder.start_ns) / 1e9, early[1]))

    return generate(), calls


def lost_note(thread: str, seconds: float, still_open: int) -> str:
    """Says that a thread's recording stopped early, from when, and why it may have."""
    return (
        f"recording stopped early in thread {thread!r} at {seconds:.6f} s, its last event: "
        "its profile function was taken away, by an exception raised inside it (CPython "
        "then removes it: a RecursionError near the recursion limit, or an exception a signal "
        "handler raised, as a SIGALRM timeout or Ctrl-C, which Python runs inside it) or by "
        "the program's own sys.setprofile; nothing after that was recorded in that thread"
        + (f", and its {still_open} call(s) open then end there" if still_open else "")
    )


def say(meta: dict[str, Any], output: str, report: TextIO | None) -> None:
    """Prints what the trace recorded, where it went and what it cost, to ``report`` or stderr."""
    stream = report if report is not None else sys.stderr
    slowdown = meta["estimated_slowdown"]
    factor = meta["bytecode_factor"]
    lines = [
        f"fleetflame trace: {meta['events']:,} events ({meta['calls']:,} calls) in "
        f"{meta['threads']} thread(s) over {meta['traced_seconds']:.3f} s, written to "
        f"{output} ({meta['file_bytes'] / 1e6:.1f} MB in {meta['write_seconds']:.1f} s)",
        f"fleetflame trace: an estimated {meta['estimated_overhead_cpu_seconds']:.3f} of the "
        f"{meta['cpu_seconds']:.3f} CPU seconds used while tracing were the tracer's"
        + (f" (the program ran ~{slowdown:.1f}x slower)" if slowdown else "")
        + f": {meta['per_event_ns'] / 1000:.2f} us an event"
        + (f", Python code {factor:.1f}x slower" if factor >= 1.05 else "")
        + f" ({meta['backend']}, measured at start)",
    ]
    lines += [f"fleetflame trace: {note}" for note in meta["notes"]]
    print("\n".join(lines), file=stream, flush=True)


def events_before(recorder: Recorder) -> int:
    """Counts the events recorded up to the end of the trace (not those that raced past it)."""
    total = 0
    end = recorder.end_ns
    for buffer in recorder.buffers:
        if buffer.excluded:
            continue
        times = buffer.times
        count = min(len(times), len(buffer.objs))
        while count and times[count - 1] > end:
            count -= 1
        total += count
    return total


def module_map(
    main_file: str | None, resolve: Callable[[str], str] = os.path.abspath
) -> dict[str, str]:
    """Maps each loaded module's source file (as given and as ``resolve`` makes it) to the
    module's name."""
    modules: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str):
            modules.setdefault(path, name)
            modules.setdefault(resolve(path), name)
    if main_file:
        modules[main_file] = modules[os.path.abspath(main_file)] = "__main__"
    return modules


def modules_of_functions() -> Callable[[CodeType], str | None]:
    """Returns a function giving the module (globals' ``__name__``) code ran in, found from
    the live functions, for code compiled from no file (``<string>``: exec and eval, as a
    dataclass's ``__init__`` and a namedtuple's ``__new__`` are); None when none tells.

    The functions are looked for once, at the first call: a pass over the objects the
    collector tracks. Code nested in a function's (its closures, comprehensions) runs in the
    same globals, and code holding such code (the exec'd ``<module>``, dataclasses'
    ``__create_fn__``, gone once run) ran in them too.
    """
    table: dict[CodeType, str] | None = None

    def nested(code: CodeType) -> Iterator[CodeType]:
        for const in code.co_consts:
            if isinstance(const, CodeType):
                yield const
                yield from nested(const)

    def find(code: CodeType) -> str | None:
        nonlocal table
        if table is None:
            import gc

            table = {}
            for obj in gc.get_objects():
                if type(obj) is FunctionType:
                    name = obj.__globals__.get("__name__")
                    function_code = obj.__code__
                    if isinstance(name, str) and function_code.co_filename.startswith("<"):
                        table.setdefault(function_code, name)
                        for inner in nested(function_code):
                            table.setdefault(inner, name)
        found = table.get(code)
        if found is None:
            found = next((table[c] for c in nested(code) if c in table), None)
        return found

    return find


def output_problem(path: str) -> str | None:
    """What stops a file being written at ``path`` (its folder missing or not writable), so a
    run can refuse at once rather than lose what it recorded at its end; None when nothing."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"{path}: no such directory {folder!r}"
    if not os.access(folder, os.W_OK):
        return f"{path}: cannot write in {folder!r}"
    if os.path.isdir(path):
        return f"{path} is a directory"
    return None


def write_atomically(path: str, lines: Any, metadata: Callable[[], dict[str, Any]]) -> int:
    """Writes the trace to a temporary file beside ``path``, then renames it; returns its size.

    The metadata is asked for once the events are written, and goes last (the file's
    ``otherData``), so it can count them.

    A path ending in ``.gz`` is written gzip-compressed (Perfetto opens it as it is).
    """
    import json

    from ._files import temporary_beside

    fd, tmp = temporary_beside(path, ".fleetflame-trace-")
    try:
        with os.fdopen(fd, "wb") as raw:
            if path.endswith(".gz"):
                import gzip

                out: Any = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1)
            else:
                out = raw
            out.write(b'{"displayTimeUnit":"ms","traceEvents":[\n')
            batch: list[str] = []
            first = True
            for line in lines:
                batch.append(line)
                if len(batch) == 10_000:
                    out.write(((",\n" if not first else "") + ",\n".join(batch)).encode())
                    batch.clear()
                    first = False
            if batch:
                out.write(((",\n" if not first else "") + ",\n".join(batch)).encode())
            out.write(b'\n],\n"otherData":')
            out.write(json.dumps(metadata()).encode())
            out.write(b"}\n")
            if out is not raw:
                out.close()
        os.replace(tmp, path)
        return os.path.getsize(path)
    except BaseException:
        os.unlink(tmp)
        raise
