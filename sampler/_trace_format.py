"""Recorded calls and returns as Trace Event Format lines, well nested per thread (pure).

The format is the JSON that Perfetto and ``chrome://tracing`` open: an object whose
``traceEvents`` are "B" (begin) and "E" (end) events with ``ts`` in microseconds, ``pid`` and
``tid``, and "M" events naming the process and threads. Every "E" closes the latest open "B" of
its thread, so a thread's events must nest: a return whose call came before the trace started
is left out, calls still open when the trace stopped end at that time, and the tracer's own
frames (``hidden``) are left out with everything they called.

Names are ``module:qualname`` (as the sampler's stacks have them: the module a function's
globals are, found by its file, or for exec'd code by ``module_by_code``) and the event's ``args``
hold ``file:line`` of the function's first line, the file relative to the ``sys.path`` entry
it was found under. Each is formatted once per function.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from types import CodeType, ModuleType

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any


class Names:
    """Formats each recorded function once: name, category and args of its "B" events."""

    def __init__(
        self,
        module_by_file: Mapping[str, str],
        roots: Sequence[str],
        hidden_files: Collection[str] = (),
        module_by_code: Callable[[CodeType], str | None] | None = None,
    ) -> None:
        self._modules = module_by_file
        self._by_code = module_by_code
        # Longest first, so a file is shown relative to the most specific entry holding it.
        self._roots = sorted({os.path.join(r, "") for r in roots if r}, key=len, reverse=True)
        self._hidden = frozenset(hidden_files)
        self._cache: dict[int, str | None] = {}

    def fragment(self, obj: Any) -> str | None:
        """Returns ``"name":...,"cat":...,"args":...`` for a recorded call, None for a hidden one."""
        key = id(obj)  # recorded objects stay alive while they are written: ids are unique
        try:
            return self._cache[key]
        except KeyError:
            pass
        if isinstance(obj, CodeType):
            if obj.co_filename in self._hidden:
                text = None
            else:
                name = f"{self.module(obj.co_filename, obj)}:{getattr(obj, 'co_qualname', obj.co_name)}"
                where = f"{self.short_path(obj.co_filename)}:{obj.co_firstlineno}"
                text = f'"name":{json.dumps(name)},"cat":"python","args":{{"file":{json.dumps(where)}}}'
        else:
            text = f'"name":{json.dumps(c_name(obj))},"cat":"c"'
        self._cache[key] = text
        return text

    def module(self, filename: str, code: CodeType | None = None) -> str:
        """Returns the module a source file was loaded as; for code from no module's file (exec,
        eval: ``<string>``) the one ``module_by_code`` gives (its globals' ``__name__``, as the
        sampler names it); else the file's name."""
        module = self._modules.get(filename)
        if module:
            return module
        if filename.startswith("<frozen ") and filename.endswith(">"):
            return filename[len("<frozen ") : -1]
        if code is not None and self._by_code is not None:
            module = self._by_code(code)
            if module:
                return module
        return filename

    def short_path(self, filename: str) -> str:
        """Returns the file relative to the ``sys.path`` entry it is under, else as it is."""
        for root in self._roots:
            if filename.startswith(root):
                return filename[len(root) :]
        return filename


def c_name(obj: Any) -> str:
    """Names a recorded C function: ``module:qualname`` (``builtins:list.append``)."""
    if isinstance(obj, tuple):  # (an instance's type or a class, a name): see _trace_backends
        kind, method = obj
        return f"{kind.__module__}:{kind.__qualname__}.{method}"
    owner = getattr(obj, "__self__", None)
    if owner is None:
        owner = getattr(obj, "__objclass__", None)  # a method descriptor
    module = getattr(obj, "__module__", None)  # a builtin function's module
    if not module:
        module = owner.__name__ if isinstance(owner, ModuleType) else None
        module = module or getattr(owner, "__module__", None) or "builtins"
    return f"{module}:{getattr(obj, '__qualname__', None) or getattr(obj, '__name__', repr(obj))}"


def thread_lines(
    times: Sequence[int],
    objs: Sequence[Any],
    start_ns: int,
    end_ns: int,
    pid: int,
    tid: int,
    fragment: Callable[[Any], str | None],
    stopped_early: list[int] | None = None,
) -> Iterator[str]:
    """Yields one thread's "B" and "E" events, well nested, up to ``end_ns``.

    ``objs[i]`` is what the event at ``times[i]`` was: None for a return, anything else for a
    call, formatted by ``fragment`` (None: a hidden call, left out with all it called).

    Given ``stopped_early`` (a thread whose recording may have stopped before the trace did),
    when its events end before ``end_ns`` the calls still open end at its last event, not at
    ``end_ns``, and the list gets that time and how many were open.
    """
    begin = f'{{"ph":"B","pid":{pid},"tid":{tid},"ts":'
    finish = f'{{"ph":"E","pid":{pid},"tid":{tid},"ts":'
    depth = 0
    hidden = 0  # the depth of the hidden call being skipped, 0 when none is
    last = start_ns
    for i in range(min(len(times), len(objs))):
        t = times[i]
        if t > end_ns:
            stopped_early = None  # recording went on to the end here
            break
        last = t
        obj = objs[i]
        if obj is None:
            if not depth:
                continue  # its call came before the trace
            depth -= 1
            if hidden:
                if depth < hidden:
                    hidden = 0
                continue
            yield f"{finish}{(t - start_ns) / 1000:.3f}}}"
        else:
            depth += 1
            if hidden:
                continue
            text = fragment(obj)
            if text is None:
                hidden = depth
                continue
            yield f"{begin}{(t - start_ns) / 1000:.3f},{text}}}"
    still_open = hidden - 1 if hidden else depth
    if stopped_early is not None:
        stopped_early += [last, still_open]
        end_ns = last
    end = f"{finish}{(end_ns - start_ns) / 1000:.3f}}}"
    for _ in range(still_open):
        yield end


def metadata_lines(pid: int, process: str, threads: Sequence[tuple[int, str]]) -> Iterator[str]:
    """Yields the "M" events naming the process and each ``(tid, name)`` thread, in order."""
    yield json.dumps(
        {"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": process}}
    )
    for index, (tid, name) in enumerate(threads):
        yield json.dumps(
            {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}
        )
        yield json.dumps(
            {
                "ph": "M",
                "pid": pid,
                "tid": tid,
                "name": "thread_sort_index",
                "args": {"sort_index": index},
            }
        )
