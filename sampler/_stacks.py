"""The sampler's hot path: walking thread stacks and counting them, with no string formatting.

A stack is kept as a tuple of small integers, one per frame, leaf first; a frame's name is
formatted once per code object and interned. Folded text is produced only when someone reads.
Walking one thread's stack is in ``_stack_walk``; the counting, and the CPU each thread used
between ticks, are here.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Mapping
from types import CodeType, FrameType

from . import _cpuclock, _labels, _waits
from ._stack_walk import RESUMABLE, ThreadState, walk
from .profile import escape_frame, thread_frame

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

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

StackKey = tuple[int, tuple[int, ...]]  # (label set id, frame name ids leaf first)


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
        recent: int = 0,
    ) -> None:
        self.mode = mode
        self.interval = interval
        self.max_depth = max_depth
        self.max_stacks = max_stacks
        self.lineno = lineno
        self.thread_frames = thread_frames
        # Whole samples per stack (see add: weights are rounded without bias as they come).
        self.counts: dict[StackKey, int] = {}
        self.residues: dict[StackKey, float] = {}  # in (-1, 1): exact weight - count
        import random  # here, not at import: it costs ~2 ms

        self._random = random.Random().random
        # The tick that last added to each count, so a reader can ask for what changed since
        # a tick it already read (GET /profile.json?since=); the tick counter is `generation`.
        self.touched: dict[tuple[int, tuple[int, ...]], int] = {}
        # The last ``recent`` samples as (monotonic seconds, thread ident, key, weight), for
        # what a stall or a slow request was doing (the native engine keeps them).
        self.recent: deque[tuple[float, int, StackKey, float]] | None = (
            deque(maxlen=recent) if recent else None
        )
        self.generation = 0
        self.stopped = False  # set at stop: readers then read, and take no tick
        self.total = 0
        self.late = 0.0  # samples that arrived late (see LATE)
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        # id(code) -> frame id; _code_refs keeps those code objects alive so no id is reused.
        # Keyed by id because a code object hashes its whole bytecode, slowly, every time.
        self._code_ids: dict[Any, int] = {}
        self._code_refs: list[Any] = []
        self._threads: dict[int, ThreadState] = {}
        self._last_wall = time.perf_counter()
        self.cpu_clocks = mode == "cpu" and _cpuclock.AVAILABLE
        # wall mode: a thread that used under a fifth of its wall time in CPU waited
        self.wall_clocks = mode == "wall" and _cpuclock.AVAILABLE
        self.intern(TOO_MANY_NAMES)
        self.truncated_id = self.intern(TRUNCATED)
        self.other = (self.intern(OTHER),)

    @classmethod
    def from_settings(
        cls, settings: Mapping[str, Any], *, mode: str, interval: float, recent: int = 0
    ) -> StackTable:
        """Returns a table bounded as the sampler's resolved settings say (``_settings.resolve``)."""
        return cls(
            mode=mode,
            interval=interval,
            max_depth=settings["max_depth"],
            max_stacks=settings["max_stacks"],
            lineno=settings["lineno"],
            thread_frames=settings["thread_frames"],
            recent=recent,
        )

    def baseline(self, excluded: set[int]) -> None:
        """Records the CPU every existing thread used so far, so it is not counted."""
        for ident in sys._current_frames():
            if ident not in excluded:
                self._threads[ident] = ThreadState(self._thread_cpu(ident))

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
                state = self._threads[ident] = ThreadState(0.0)
            cpu = self._thread_cpu(ident)
            lost += cpu - state.cpu + state.pending * self.interval
            state.cpu, state.read_at, state.pending = cpu, 0.0, 0.0
        return int(lost / self.interval)

    def intern(self, name: str) -> int:
        """Returns the id of a frame name, adding it (bounded: past MAX_NAMES, one shared id)."""
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
            if len(self._code_ids) >= _MAX_CODE_CACHE:
                self._code_ids.clear()
                self._code_refs.clear()
            frame_id = self._code_ids[key] = self.intern_frame(
                frame.f_globals.get("__name__"), code, frame.f_lineno if self.lineno else -1
            )
            self._code_refs.append(code)
        return frame_id

    def intern_frame(self, module: str | None, code: CodeType, line: int) -> int:
        """Returns the id of a frame's name: ``module:qualname`` (``:line`` with lineno)."""
        name = f"{module or code.co_filename}:{getattr(code, 'co_qualname', code.co_name)}"
        if self.lineno:
            name = f"{name}:{line}"
        return self.intern(escape_frame(name))

    def _thread_cpu(self, ident: int) -> float:
        if not (self.cpu_clocks or self.wall_clocks):
            return 0.0
        return _cpuclock.thread_cpu_time(ident) or 0.0

    def thread_root(self, ident: int) -> int:
        """Returns the id of the root frame naming a thread, ``[thread:NAME]``."""
        return self.intern(thread_frame(_cpuclock.thread_name(ident)))

    def sample(
        self, frames: Mapping[int, FrameType], excluded: set[int], *, reader: bool = False
    ) -> int:
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
        added = 0
        me = _cpuclock.os_thread_ident()  # sys._current_frames' key, whoever patched threading
        cpu_clocks, wall_clocks = self.cpu_clocks, self.wall_clocks
        waiting = False
        for ident, frame in frames.items():
            if ident in excluded:
                continue
            state = threads.get(ident)
            if state is None:
                # A thread born after the baseline: all its CPU time is new.
                state = threads[ident] = ThreadState(0.0)
            moved = (
                frame is not state.top
                or frame.f_lasti != state.lasti
                or frame.f_code.co_flags & RESUMABLE
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
                waiting = wall_clocks and ident != me and self._waited(ident, state, count)
            if count <= 0 or (cpu_clocks and state.idle):
                state.frames = None
                continue
            key = state.key
            if key is None:
                label = walk(
                    frame,
                    state,
                    tags,
                    frame_id=self._frame_id,
                    code_ids=self._code_ids,
                    lineno=self.lineno,
                    max_depth=self.max_depth,
                )
                stack = tuple(state.ids)
                if state.truncated:
                    stack += (self.truncated_id,)
                if self.thread_frames:
                    stack += (self.thread_root(ident),)
                key = state.key = (label, stack)
            if cpu_clocks:
                state.pending, state.before_key, state.pending_key = count, state.pending_key, key
            else:
                if waiting:
                    key = self._waiting_key(ident, state, key)
                added += self.add(key, count)
        if len(threads) > len(frames):
            for ident in [i for i in threads if i not in frames]:
                state = threads.pop(ident)
                if state.pending:
                    added += self._charge(state, False)
        self.total += added
        return added

    def _waited(self, ident: int, state: ThreadState, weight: float) -> bool:
        """Wall mode: whether a thread used under a fifth of its ``weight`` intervals in CPU."""
        cpu = self._thread_cpu(ident)
        state.ran, state.cpu = cpu - state.cpu, cpu
        return state.ran * 5 < weight * self.interval

    def _waiting_key(self, ident: int, state: ThreadState, key: StackKey) -> StackKey:
        """The key of a waiting sample: the stack under ``[waiting]`` and what it waits on,
        read again whenever the thread moved or ran since it was last read waiting."""
        if state.wait_base is key and not state.ran and state.wait_key is not None:
            return state.wait_key
        name = _waits.REASONS[_waits.reason_of(_cpuclock.native_id_of(ident))]
        marks: tuple[int, ...] = (self.intern(_waits.WAITING),)
        if name is not None:
            marks = (self.intern(name), *marks)
        state.wait_base, state.wait_key = key, (key[0], marks + key[1])
        return state.wait_key

    def add(self, key: StackKey, weight: float) -> int:
        """Adds a sample of ``weight`` intervals to a stack; returns the whole samples added.

        Counts are whole numbers, so a profile's stacks add up to its total and only grow.
        Each stack carries its fractional remainder; when the remainder is positive it is
        rounded up with its own probability. So a count is always within one sample of the
        stack's exact weight, and right on average (rounding every weight the same way would
        skew stacks whose samples come late)."""
        counts = self.counts
        if key not in counts and len(counts) >= self.max_stacks:
            key = (key[0], self.other)
        count = int(weight)
        if weight != count:
            residue = self.residues.get(key, 0.0) + (weight - count)
            if residue > 0.0 and self._random() < residue:
                count += 1
                residue -= 1.0
            self.residues[key] = residue
        if count <= 0:
            return 0
        counts[key] = counts.get(key, 0) + count
        self.touched[key] = self.generation
        return count

    def _charge(self, state: ThreadState, blocked_there: bool) -> int:
        key = (
            state.before_key
            if blocked_there and state.before_key is not None
            else state.pending_key
        )
        weight, state.pending = state.pending, 0.0
        return self.add(key, weight) if key is not None else 0

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

    def snapshot(self) -> dict[StackKey, int]:
        """Returns a copy of the counts, in samples."""
        return dict(self.counts)
