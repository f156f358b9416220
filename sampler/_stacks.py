"""The sampler's hot path: walking thread stacks and counting them, with no string formatting.

A stack is kept as a tuple of small integers, one per frame, leaf first; a frame's name is
formatted once per code object and interned. Folded text is produced only when someone reads.
"""

from __future__ import annotations

import inspect
import sys
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any

from . import _labels
from .profile import escape_frame

TRUNCATED = "[truncated]"
OTHER = "[other]"
TOO_MANY_NAMES = "[names-over-limit]"
# Distinct frame names kept; code generated at run time (exec, templates) must not grow memory.
MAX_NAMES = 200_000
# Between two timely ticks the whole process uses at most 1.5 intervals of CPU (the jitter's
# ceiling). More than this from a thread other than the one ticking means the tick came late:
# the signal could not be handled while that CPU ran.
LATE = 2.0
# A blocked thread (it sat still and used no CPU) gets its clock read this often only:
# reading another thread's CPU clock is a system call (2-10 us here). A busy thread is read at
# every tick, even when it looks still (a loop stopped at the same instruction), because its
# CPU must be charged to where it is now, not to where it goes next.
RECHECK = 0.5
IDLE = 0.01  # less than this many intervals of CPU since the last read: it did not run
# Code objects whose names are cached; past this the cache starts again (names stay interned).
_MAX_CODE_CACHE = 100_000

try:
    _thread_cpu_clock = time.pthread_getcpuclockid
except AttributeError:  # pragma: no cover - platforms without per-thread CPU clocks
    _thread_cpu_clock = None  # type: ignore[assignment]


# Generator and coroutine frames can be resumed by a different caller: never reuse past them.
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class _ThreadState:
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


class StackTable:
    """Cumulative sample counts per (label set, stack), bounded in size."""

    def __init__(
        self,
        *,
        mode: str,
        interval: float,
        max_depth: int,
        max_stacks: int,
        lineno: bool,
        thread_frames: bool,
    ) -> None:
        self.mode = mode
        self.interval = interval
        self.max_depth = max_depth
        self.max_stacks = max_stacks
        self.lineno = lineno
        self.thread_frames = thread_frames
        # Weights are exact (time used / interval), as floats: rounding each tick to whole
        # samples would alias with periodic work. Readers round; a rounded growing number grows.
        self.counts: dict[tuple[int, tuple[int, ...]], float] = {}
        # The tick that last added to each count, so a reader can ask for what changed since
        # a tick it already read (GET /profile.json?since=); the tick counter is `generation`.
        self.touched: dict[tuple[int, tuple[int, ...]], int] = {}
        self.generation = 0
        self.stopped = False  # set at stop: readers then read, and take no tick
        self.total = 0.0
        self.late = 0.0  # samples that arrived late (see LATE)
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        # id(code) -> frame id; _code_refs keeps those code objects alive so no id is reused.
        # Keyed by id because a code object hashes its whole bytecode, slowly, every time.
        self._code_ids: dict[Any, int] = {}
        self._code_refs: list[Any] = []
        self._threads: dict[int, _ThreadState] = {}
        self._last_wall = time.perf_counter()
        self.cpu_clocks = mode == "cpu" and _thread_cpu_clock is not None
        self._intern(TOO_MANY_NAMES)
        self._truncated = self._intern(TRUNCATED)
        self._other = (self._intern(OTHER),)

    def baseline(self, excluded: set[int]) -> None:
        """Records the CPU every existing thread used so far, so it is not counted."""
        for ident in sys._current_frames():
            if ident not in excluded:
                self._threads[ident] = _ThreadState(self._thread_cpu(ident))

    def rebaseline(self, excluded: set[int]) -> int:
        """Forgets time not yet attributed (no tick could see where it went); returns it in samples."""
        if not self.cpu_clocks:
            now = time.perf_counter()
            lost_wall, self._last_wall = now - self._last_wall, now
            return int(lost_wall / self.interval)
        lost = 0.0
        for ident in sys._current_frames():
            if ident in excluded:
                continue
            state = self._threads.get(ident)
            if state is None:
                state = self._threads[ident] = _ThreadState(0.0)
            cpu = self._thread_cpu(ident)
            lost += cpu - state.cpu + state.pending * self.interval
            state.cpu, state.read_at, state.pending = cpu, 0.0, 0.0
        return int(lost / self.interval)

    def _intern(self, name: str) -> int:
        name_id = self._name_ids.get(name)
        if name_id is None:
            if len(self.names) >= MAX_NAMES:
                return self._name_ids[TOO_MANY_NAMES]
            name_id = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return name_id

    def _frame_id(self, frame: FrameType) -> int:
        code = frame.f_code
        key: Any = (id(code), frame.f_lineno) if self.lineno else id(code)
        frame_id = self._code_ids.get(key)
        if frame_id is None:
            module = frame.f_globals.get("__name__") or code.co_filename
            name = f"{module}:{getattr(code, 'co_qualname', code.co_name)}"
            if self.lineno:
                name = f"{name}:{frame.f_lineno}"
            if len(self._code_ids) >= _MAX_CODE_CACHE:
                self._code_ids.clear()
                self._code_refs.clear()
            self._code_refs.append(code)
            frame_id = self._code_ids[key] = self._intern(escape_frame(name))
        return frame_id

    def _thread_cpu(self, ident: int) -> float:
        if not self.cpu_clocks:
            return 0.0
        try:
            return time.clock_gettime(_thread_cpu_clock(ident))
        except OSError:
            return 0.0

    def _walk(self, frame: FrameType | None, state: _ThreadState, tags: Mapping[int, int]) -> int:
        """Walks the stack ending in ``frame`` into ``state``; returns its label set id.

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
        code_ids = self._code_ids
        lineno = self.lineno
        max_depth = self.max_depth
        while frame is not None:
            if positions is not None:
                index = positions.get(id(frame))
                if index is not None and not frame.f_code.co_flags & _RESUMABLE:
                    assert previous is not None
                    if tags and not label:
                        label = self._label_in(previous, index, tags)
                    frames += previous[index:]
                    ids += state.ids[index:]
                    break
            if len(ids) == max_depth:
                state.truncated = True
                if tags and not label:
                    label = self._label_in_chain(frame, tags)
                break
            if tags and not label:
                label = tags.get(id(frame), 0)
            frame_id = None if lineno else code_ids.get(id(frame.f_code))
            ids.append(self._frame_id(frame) if frame_id is None else frame_id)
            frames.append(frame)
            frame = frame.f_back
        else:
            state.truncated = False
        state.frames, state.ids = frames, ids
        return label

    @staticmethod
    def _label_in(frames: list[FrameType], start: int, tags: Mapping[int, int]) -> int:
        for frame in frames[start:]:
            label = tags.get(id(frame), 0)
            if label:
                return label
        return 0

    @staticmethod
    def _label_in_chain(frame: FrameType | None, tags: Mapping[int, int]) -> int:
        while frame is not None:
            label = tags.get(id(frame), 0)
            if label:
                return label
            frame = frame.f_back
        return 0

    def _thread_root(self, ident: int) -> int:
        thread = threading._active.get(ident)  # type: ignore[attr-defined]
        name = thread.name if thread is not None else str(ident)
        return self._intern(escape_frame(f"[thread:{name}]"))

    def sample(
        self, frames: Mapping[int, FrameType], excluded: set[int], *, reader: bool = False
    ) -> float:
        """Counts one tick over ``frames`` (thread ident -> top frame); returns samples added.

        ``reader=True`` is a reader catching up (see ``settle``): not a timer tick, so CPU read
        over a long gap is not evidence of late ticks."""
        self.generation += 1
        interval = self.interval
        threads = self._threads
        tags = _labels.frame_tags
        now = time.perf_counter()
        wall_weight = (now - self._last_wall) / interval
        self._last_wall = now
        added = 0.0
        me = threading.get_ident()
        cpu_clocks = self.cpu_clocks
        for ident, frame in frames.items():
            if ident in excluded:
                continue
            state = threads.get(ident)
            if state is None:
                # A thread born after the baseline: all its CPU time is new.
                state = threads[ident] = _ThreadState(0.0)
            moved = (
                frame is not state.top
                or frame.f_lasti != state.lasti
                or frame.f_code.co_flags & _RESUMABLE
            )
            if moved:
                state.top, state.lasti, state.key = frame, frame.f_lasti, None
            if cpu_clocks:
                if state.idle and not moved and now - state.read_at < RECHECK:
                    continue  # blocked where it was; CPU it uses there is read later
                cpu = time.thread_time() if ident == me else self._thread_cpu(ident)
                state.read_at = now
                count = (cpu - state.cpu) / interval
                state.cpu = cpu
                idle = not moved and count < IDLE
                if state.pending:
                    added += self._charge(state, idle)
                state.idle = idle
                if count > LATE and ident != me and not reader:
                    self.late += count
            else:
                count = wall_weight
            if count <= 0 or (cpu_clocks and state.idle):
                state.frames = None
                continue
            key = state.key
            if key is None:
                label = self._walk(frame, state, tags)
                stack = tuple(state.ids)
                if state.truncated:
                    stack += (self._truncated,)
                if self.thread_frames:
                    stack += (self._thread_root(ident),)
                key = state.key = (label, stack)
            if cpu_clocks:
                state.pending, state.before_key, state.pending_key = count, state.pending_key, key
            else:
                self._add(key, count)
                added += count
        if len(threads) > len(frames):
            for ident in [i for i in threads if i not in frames]:
                state = threads.pop(ident)
                if state.pending:
                    added += self._charge(state, False)
        self.total += added
        return added

    def _add(self, key: tuple[int, tuple[int, ...]], count: float) -> None:
        counts = self.counts
        if key in counts:
            counts[key] += count
        elif len(counts) < self.max_stacks:
            counts[key] = count
        else:
            key = (key[0], self._other)
            counts[key] = counts.get(key, 0.0) + count
        self.touched[key] = self.generation

    def _charge(self, state: _ThreadState, blocked_there: bool) -> float:
        key = (
            state.before_key
            if blocked_there and state.before_key is not None
            else state.pending_key
        )
        count, state.pending = state.pending, 0.0
        if key is not None:
            self._add(key, count)
        return count

    def settle(self, frames: Mapping[int, FrameType], excluded: set[int], period: float) -> None:
        """Brings the counts up to date for a reader: in cpu mode, takes a tick if none came
        for two tick periods (an idle process gets no CPU-timer ticks, so the CPU used after
        the last one, and the weights left pending, would wait indefinitely for one)."""
        if (
            self.cpu_clocks
            and not self.stopped
            and time.perf_counter() - self._last_wall >= 2 * period
        ):
            self.sample(frames, excluded, reader=True)

    def flush(self) -> None:
        """Charges the CPU read at the last tick, so the counts are complete (at stop)."""
        self.generation += 1
        for state in self._threads.values():
            if state.pending:
                self.total += self._charge(state, False)

    def forget_frames(self) -> None:
        """Drops the references to frames kept from the last tick (their locals stay alive)."""
        for state in self._threads.values():
            state.frames = state.top = state.key = None

    def folded(self, key: tuple[int, tuple[int, ...]]) -> str:
        """Formats one stack key as a folded stack, root first."""
        names = self.names
        return ";".join([names[i] for i in reversed(key[1])])

    def snapshot(self) -> dict[tuple[int, tuple[int, ...]], float]:
        """Returns a copy of the counts, in samples, not yet rounded."""
        return dict(self.counts)
