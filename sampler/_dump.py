"""``/dump``: every thread's stack right now, as text like ``py-spy dump``, or as JSON.

``threads_of`` and the two renderers are pure: they take frames and thread facts and give
data or text. ``take`` reads the live process (its frames, its threads, their CPU clocks).
Every name that comes from the program (frames, files, thread names) is escaped with
``escape_frame`` in the text, so no name can add a line or fake a thread.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from types import FrameType

from ._cpuclock import native_id_of, thread_cpu_time
from .profile import escape_frame

FORMAT = "fleetflame.dump/1"
# A thread that used at least this share of one CPU during the look is "active".
ACTIVE_SHARE = 0.05
LOOK_SECONDS = 0.01


@dataclass(frozen=True)
class ThreadInfo:
    """What ``threading`` and the CPU clocks say about a thread."""

    name: str
    native_id: int | None
    daemon: bool | None
    state: str  # "active", "idle" or "unknown" (no CPU clock)


@dataclass(frozen=True)
class Frame:
    """One frame of a dumped stack."""

    name: str  # module:qualname, escaped like every frame of the wire format
    file: str
    line: int | None


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a dump: who it is and its frames, leaf first."""

    id: int
    name: str
    native_id: int | None
    daemon: bool | None
    state: str
    frames: list[Frame]


UNKNOWN = ThreadInfo(name="?", native_id=None, daemon=None, state="unknown")


def threads_of(
    frames: Mapping[int, FrameType], threads: Mapping[int, ThreadInfo]
) -> list[ThreadStack]:
    """Returns the stack of every thread in ``frames`` (by thread id), oldest thread first."""
    stacks = []
    for ident, frame in frames.items():
        info = threads.get(ident, UNKNOWN)
        stacks.append(
            ThreadStack(ident, info.name, info.native_id, info.daemon, info.state, _frames(frame))
        )
    stacks.sort(key=lambda stack: (stack.native_id is None, stack.native_id or 0, stack.id))
    return stacks


def _frames(frame: FrameType | None) -> list[Frame]:
    found = []
    while frame is not None:
        code = frame.f_code
        module = frame.f_globals.get("__name__", "?")
        qualname = getattr(code, "co_qualname", code.co_name)
        found.append(Frame(escape_frame(f"{module}:{qualname}"), code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return found


def render_text(stacks: list[ThreadStack], pid: int) -> str:
    """Renders a dump as text: a line per thread, then a line per frame, leaf first."""
    count = f"{len(stacks)} thread" + ("" if len(stacks) == 1 else "s")
    lines = [f"Process {pid}: {count} (the sampler's own left out)"]
    for stack in stacks:
        facts = [f"native {stack.native_id}" if stack.native_id is not None else "native ?"]
        if stack.daemon:
            facts.append("daemon")
        facts.append(stack.state)
        lines.append("")
        lines.append(f'Thread {stack.id} "{escape_frame(stack.name)}" ({", ".join(facts)})')
        for frame in stack.frames:
            line = "?" if frame.line is None else frame.line
            lines.append(f"    {frame.name} ({escape_frame(frame.file)}:{line})")
    return "\n".join(lines) + "\n"


def render_json(stacks: list[ThreadStack], pid: int, now: float) -> bytes:
    """Renders a dump as JSON (docs/wire-format.md, ``/dump``)."""
    document = {
        "format": FORMAT,
        "pid": pid,
        "time": round(now, 3),
        "threads": [asdict(stack) for stack in stacks],
    }
    try:
        return json.dumps(document, indent=1, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate in a file or thread name: JSON escapes it
        return json.dumps(document, indent=1).encode()


def take(leave_out: Collection[int], look: float = LOOK_SECONDS) -> list[ThreadStack]:
    """Returns every thread's stack now, but those of ``leave_out``, with whether each ran CPU
    during the ``look`` seconds before."""
    known = {t.ident: t for t in threading.enumerate() if t.ident is not None}
    before = {ident: _cpu(ident) for ident in known if ident not in leave_out}
    started = time.monotonic()
    time.sleep(look)
    frames = sys._current_frames()
    elapsed = time.monotonic() - started
    me = threading.get_ident()
    frames = {i: f for i, f in frames.items() if i not in leave_out and i != me}
    threads = {}
    for ident in frames:
        thread = known.get(ident)
        if thread is None:
            continue
        used_before, used_after = before.get(ident), _cpu(ident)
        if used_before is None or used_after is None:
            state = "unknown"
        elif used_after - used_before >= ACTIVE_SHARE * elapsed:
            state = "active"
        else:
            state = "idle"
        threads[ident] = ThreadInfo(thread.name, native_id_of(ident), thread.daemon, state)
    return threads_of(frames, threads)


def _cpu(ident: int) -> float | None:
    return thread_cpu_time(ident)
