"""Walking one thread's stack into frame ids, reusing what the previous tick walked.

What a tick saw of a thread is kept in its ``ThreadState``; the next walk stops at the first
frame that was on the thread's stack then and takes the callers seen then. The sampler's own
frames are left out (``hide_code``), and a stack's label set is its innermost tagged frame's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import FrameType

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

# Frames of these code objects (by id; the objects are kept alive by their owner) are left out
# of every walk: the sampler's own wrappers of the host's functions (sampler._stalls), the
# launcher's frames above a program run under it (sampler.__main__). See hide_code.
HIDDEN_CODE_IDS: set[int] = set()

# Generator and coroutine frames can be resumed by a different caller: never reuse past them.
# (inspect.CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR, without importing inspect)
RESUMABLE = 0x20 | 0x80 | 0x200


class ThreadState:
    """What the previous tick saw of one thread: its CPU clock and the last stack walked.

    The frames of the last walk are kept (so their ids stay unique) until the next tick that
    walks the thread, and dropped at any tick that finds the thread did not run; the top frame
    is replaced at every tick the thread moved. So a finished frame's locals are never kept
    alive for long: one tick, or RECHECK seconds for a thread that did not move.
    """

    __slots__ = (
        "cpu",
        "read_at",
        "idle",
        "top",
        "lasti",
        "key",
        "frames",
        "ids",
        "truncated",
        "pending",
        "pending_key",
        "before_key",
        "ran",
        "wait_key",
        "wait_base",
    )

    def __init__(self, cpu: float) -> None:
        self.cpu = cpu
        self.read_at = 0.0
        self.idle = False  # sat still and used no CPU at the last read: blocked
        # CPU read at the last tick, charged at the next one: to ``pending_key`` (where the thread
        # was seen), or to ``before_key`` (where it was seen the tick before) if it turns out to
        # be blocked where it was seen, since then it spent that CPU before it got there.
        self.pending = 0.0
        self.pending_key: tuple[int, tuple[int, ...]] | None = None
        self.before_key: tuple[int, tuple[int, ...]] | None = None
        self.top: FrameType | None = None  # the thread's top frame at the last tick (live then)
        self.lasti = -1
        self.key: tuple[int, tuple[int, ...]] | None = None  # the stack key of ``top``
        self.frames: list[FrameType] | None = None
        self.ids: list[int] = []
        self.truncated = False
        # wall mode: CPU it used since the last tick; the key of its last waiting sample (its
        # stack under [waiting] and what it waits on) and the stack key that was built from.
        self.ran = 0.0
        self.wait_key: tuple[int, tuple[int, ...]] | None = None
        self.wait_base: tuple[int, tuple[int, ...]] | None = None


def walk(
    frame: FrameType | None,
    state: ThreadState,
    tags: Mapping[int, int],
    *,
    frame_id: Callable[[FrameType], int],
    code_ids: dict[Any, int],
    lineno: bool,
    max_depth: int,
) -> int:
    """Walks the stack ending in ``frame`` into ``state``; returns its label set id.

    ``frame_id`` names a frame (interning it); ``code_ids`` are the ids of code objects already
    named, looked up first when frames are named without their line.

    Walking stops at the first frame that was on this thread's stack at the last walk:
    from there on the callers are the ones seen then.
    """
    previous = state.frames
    positions = None
    if previous and not state.truncated:
        positions = dict(zip(map(id, previous), range(len(previous)), strict=True))
    frames: list[FrameType] = []
    ids: list[int] = []
    label = 0
    hidden = HIDDEN_CODE_IDS
    while frame is not None:
        if hidden and id(frame.f_code) in hidden:
            frame = frame.f_back
            continue
        if positions is not None:
            index = positions.get(id(frame))
            if index is not None and not frame.f_code.co_flags & RESUMABLE:
                assert previous is not None
                if tags and not label:
                    label = _label_in(previous, index, tags)
                frames += previous[index:]
                ids += state.ids[index:]
                break
        if len(ids) == max_depth:
            state.truncated = True
            if tags and not label:
                label = _label_in_chain(frame, tags)
            break
        if tags and not label:
            label = tags.get(id(frame), 0)
        known = None if lineno else code_ids.get(id(frame.f_code))
        ids.append(frame_id(frame) if known is None else known)
        frames.append(frame)
        frame = frame.f_back
    else:
        state.truncated = False
    state.frames, state.ids = frames, ids
    return label


def _label_in(frames: list[FrameType], start: int, tags: Mapping[int, int]) -> int:
    for frame in frames[start:]:
        label = tags.get(id(frame), 0)
        if label:
            return label
    return 0


def _label_in_chain(frame: FrameType | None, tags: Mapping[int, int]) -> int:
    while frame is not None:
        label = tags.get(id(frame), 0)
        if label:
            return label
        frame = frame.f_back
    return 0


def hide_code(code: Any, engine: str) -> None:
    """Leaves the frames of ``code`` out of every walk, by this engine and the python one."""
    HIDDEN_CODE_IDS.add(id(code))
    if engine == "native":
        from . import _native

        _native.hide_code(code)


def folded_stack(frame: FrameType | None) -> str:
    """Returns the folded stack of ``frame`` and its callers (hidden code left out)."""
    from .profile import escape_frame

    names = []
    while frame is not None:
        if id(frame.f_code) not in HIDDEN_CODE_IDS:
            module = frame.f_globals.get("__name__") or frame.f_code.co_filename
            qualname = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
            names.append(escape_frame(f"{module}:{qualname}"))
        frame = frame.f_back
    return ";".join(reversed(names))
