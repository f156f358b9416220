"""Stalls: what kept a thread from answering, when, for how long, and what it was doing.

Three kinds, watched from the moment the sampler starts, with no change to the host's code:

- ``event-loop``: an asyncio callback (a task step, a protocol callback) that ran longer than
  the threshold: nothing else on that loop ran meanwhile.
- ``request``: a WSGI server's worker (gunicorn's sync and gthread workers, werkzeug, wsgiref,
  waitress) busy with one request for longer than the request threshold.
- ``gil``: the GIL held so long that the watcher thread, taking it back after short sleeps,
  waited longer than the threshold (C code that never lets it go: a big regex, a sort).

Callbacks and requests are timed exactly, by wrapping ``asyncio.events.Handle._run`` and the
servers' request handling methods once their modules are loaded: two clock reads each (uvloop's
handles are not seen; the wrappers are ``_stall_timing``'s), so no profile shows them. The watcher reads the stack of every thread whose call is
within its lead of its threshold or past it, then at every period while it runs (``wall``
samples: a thread blocked in a system call uses no CPU, so only these show where it waits), so
a stall usually has one. The Python loop wakes every period (25 ms), its lead a period; the
native loop sleeps until a call is 5 ms from its threshold, at most the smallest threshold less
5 ms, and the engine's ticks wake it for a GIL hold another thread waits through (watch.c,
gil.c; bench/bench_watcher.py measures its cost). When a stall ends, the engine's
CPU samples of the same thread over the same time are added from its recent history (``cpu``;
the native engine keeps one). Stalls are kept in a bounded ring, served worst first.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque

from ._cpuclock import thread_name
from ._log import log
from ._osthread import own_thread
from ._stall_kinds import TIMED, gil_what
from ._stall_timing import Limit, running_calls, timed

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ._core import Sampler

    # _native.watch_wait -> (threads, waited, the holder's ident, its CPU seconds, the GIL's
    # handoffs, the monotonic clock)
    WatchWait = Callable[..., tuple[dict[int, Any], float, int | None, float | None, int, float]]

MAX_STALLS = 500
# Stacks read from one stalled thread, at most (2.5 minutes at the watcher's pace).
MAX_WALL_READS = 6000
# A stall's stacks: at most this many distinct ones of each source are kept.
MAX_STACKS_PER_STALL = 50
# With the native loop, a call's stack is read from this long before its limit on (watch.c's
# LEAD): the loop sleeps until then, not a period at a time.
NATIVE_LEAD = 0.005


class Stall:
    """One stall: its kind, thread, start (epoch seconds), duration and stacks."""

    __slots__ = ("id", "kind", "ident", "thread", "started", "duration", "what", "wall", "cpu")

    def __init__(self, kind: str, ident: int | None, started: float, duration: float) -> None:
        self.id = 0
        self.kind = kind
        self.ident = ident
        self.thread = thread_name(ident)
        self.started = started
        self.duration = duration
        self.what = ""
        self.wall: dict[str, int] = {}
        self.cpu: dict[str, float] = {}

    def document(self) -> dict[str, Any]:
        """The stall as /stalls.json lists it."""
        return {
            "id": self.id,
            "kind": self.kind,
            "thread": self.thread,
            "what": self.what,
            "start": round(self.started, 4),
            "duration": round(self.duration, 4),
            "stacks": {
                "wall": _top(self.wall),
                "cpu": {stack: round(weight, 2) for stack, weight in _top(self.cpu).items()},
            },
        }


class StallWatcher:
    """Watches the process for stalls and keeps the worst of them."""

    threshold = Limit("event-loop")
    request_threshold = Limit("request")

    def __init__(
        self,
        sampler: Sampler,
        threshold: float = 0.05,
        request_threshold: float = 0.5,
        period: float = 0.025,
    ) -> None:
        self._sampler = sampler
        # thread ident -> (kind, monotonic start) of the callback or request it runs now, and
        # kind -> seconds: made first, as setting a limit sets it in both
        self._running = running_calls()
        self._limits: dict[str, float] = {}
        self.threshold = threshold
        self.request_threshold = request_threshold
        self.period = period
        self.stalls: deque[Stall] = deque(maxlen=MAX_STALLS)
        self._next_id = 1
        self._lock = threading.Lock()
        # Stalls a timed call reported, waiting for the watcher's stacks; a signal when none do.
        self._pending: deque[tuple[Stall, float, float]] = deque()
        self._settled = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._failed = False  # the watcher thread failed: timing stopped, nothing pending
        self._thread: threading.Thread | None = None
        # thread ident -> (the start of the call it was read in, its stacks read since, their
        # distinct texts: each kept once, and gone with the call's entry)
        self._wall: dict[int, tuple[float, list[tuple[float, str]], dict[str, str]]] = {}
        # (module, class, method) -> the original method, for what is wrapped now
        self._wrapped: dict[tuple[str, str, str], Any] = {}
        self._modules_seen = 0
        self._watch_wait: WatchWait | None = None
        self._watch_wake: Callable[[], None] | None = None
        self._clock_offset = time.time() - time.monotonic()

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Starts watching: times callbacks and requests, and starts the watcher thread."""
        self._wrap_loaded()
        if self._sampler.engine.name == "native":
            from . import _native

            self._watch_wait, self._watch_wake = _native.watch_wait, _native.watch_wake
        self._thread = threading.Thread(target=self._run, name="fleetflame-stalls", daemon=True)
        self._thread.start()

    def after_fork_in_child(self) -> None:
        """Stops watching in a forked child (its thread is gone; a new watcher starts after)."""
        self._unwrap_all()
        self._thread = None

    def stop(self) -> None:
        """Stops watching (the stalls seen stay readable)."""
        self._stopping.set()  # the thread first: it must not wrap again after the unwrap
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._unwrap_all()
        self._thread = None
        self._finish_pending()

    # -- timing callbacks and requests ----------------------------------------------------------

    def _wrap_loaded(self) -> None:
        """Wraps what TIMED names in every module loaded since the last look."""
        if len(sys.modules) == self._modules_seen:
            return
        self._modules_seen = len(sys.modules)
        for where, (kind, describe) in TIMED.items():
            module = sys.modules.get(where[0])
            owner = getattr(module, where[1], None)
            original = getattr(owner, where[2], None)
            if where in self._wrapped or original is None or self._stopping.is_set():
                continue
            while getattr(original, "__fleetflame_timed__", False):  # one left: replaced
                original = original.__wrapped__
            setattr(owner, where[2], timed(original, kind, self, describe))
            self._wrapped[where] = original

    def _unwrap_all(self) -> None:
        # The wrappers' code stays hidden: a call running one may be on a stack until it ends.
        for (module_name, owner_name, name), original in self._wrapped.items():
            owner = getattr(sys.modules.get(module_name), owner_name, None)
            current = getattr(owner, name, None)
            if getattr(current, "__wrapped__", None) is original:
                setattr(owner, name, original)
        self._wrapped.clear()
        self._modules_seen = 0

    def finished(self, kind: str, ident: int, started: float, elapsed: float, what: str) -> None:
        """Called by a wrapper when a call it timed ran past its threshold: the stall waits for
        the watcher thread to add its stacks."""
        if self._failed:
            return
        stall = Stall(kind, ident, self._clock_offset + started, elapsed)
        stall.what = what
        self._pending.append((stall, started, started + elapsed))
        if self._failed:  # the watcher failed since the look above: nothing will read it
            self._pending.clear()
            return
        self._wake()

    def _wake(self) -> None:
        # The native loop sleeps up to a second with large thresholds: it has work now.
        if self._watch_wake is not None:
            self._watch_wake()

    def limit(self, kind: str) -> float:
        """The threshold of a kind of call."""
        return self._limits[kind]

    @property
    def lead(self) -> float:
        """How long before its limit a call's stack is read (then at every wake while it runs):
        the native loop wakes for it (watch.c's LEAD); the Python loop wakes every period."""
        return min(self.period, NATIVE_LEAD) if self._watch_wait is not None else self.period

    # -- the watcher thread -------------------------------------------------------------------

    def _run(self) -> None:
        self._sampler._excluded.run_as_own(self._watch)

    def _watch(self) -> None:
        own_thread()
        while not self._stopping.is_set():
            try:
                threads, waited, *holder, now = self._wait()
                if waited > self.threshold:
                    self._gil_held(now - waited, now, threads, *holder)
                self._wrap_loaded()
                # Stalls that ended first, with the stacks read in them; then the calls running.
                self._finish_pending()
                self._read_stalled(now)
            except Exception:  # noqa: BLE001 - never let the watcher fail the host
                log.exception("fleetflame sampler: the stall watcher failed; stalls not watched")
                # Nothing would read what the wrappers report: they go, and what they report
                # from calls still running is dropped, not kept for good.
                self._failed = True
                self._unwrap_all()
                self._pending.clear()
                return

    def _wait(self) -> tuple[dict[int, Any], float, int | None, float | None, int, float]:
        """Sleeps a period without the GIL (the native engine's loop, in C: as long as the
        calls running allow, again and again while no wake brings work); returns the threads before the last sleep, how long getting the
        GIL back took, who held it, its seconds on a CPU and the GIL's handoffs meanwhile (the
        native engine reads them), and the monotonic clock then."""
        if self._watch_wait is not None:
            active = threading._active  # type: ignore[attr-defined]
            return self._watch_wait(self, active, sys.modules)
        threads = dict(threading._active)  # type: ignore[attr-defined]
        started = time.monotonic()
        time.sleep(self.period)
        now = time.monotonic()
        # Without the native engine this is any lateness, the scheduler's included.
        return threads, max(0.0, now - started - self.period), None, None, 0, now

    def _gil_held(self, started: float, ended: float, threads: Any, *hold: Any) -> None:
        # The thread holding the GIL as the watcher asked for it back (the native engine
        # reads it), else the one sampled most meanwhile; named as before the hold (it may end).
        # Where the holder let the GIL go, read first: the catch-up may wait for the sampler's
        # lock, and meanwhile the holder move on, or end and a new thread take its ident.
        holder, on_cpu, handoffs = hold
        frame = sys._current_frames().get(holder) if holder is not None else None
        self._catch_up()
        # Threads taking turns (each at most a switch interval while others wait) filled half
        # the wait or more: contention, and the busiest thread is named.
        contended = handoffs * sys.getswitchinterval() >= (ended - started) / 2
        if holder is None or contended:
            frame = None  # the thread named is the busiest, not the one that let the GIL go
            per_thread: dict[int, float] = {}
            for at, ident, _, weight in self._recent():
                if started <= at <= ended:
                    per_thread[ident] = per_thread.get(ident, 0.0) + weight
            holder = max(per_thread, key=per_thread.__getitem__) if per_thread else None
        stall = Stall("gil", holder, self._clock_offset + started, ended - started)
        stall.thread = threads[holder].name if holder in threads else stall.thread
        stall.what = gil_what(ended - started, holder, on_cpu, handoffs if contended else 0)
        # A holder that did not run (a call that kept the GIL, a thread off the CPU) has no CPU
        # sample to say where it was: this says it.
        if frame is not None:
            from ._stack_walk import folded_stack

            stall.wall[folded_stack(frame)] = 1
        self._finish(stall, started, ended)

    def _read_stalled(self, now: float) -> None:
        """Reads the stack of every thread whose call could still turn into a stall before the
        next look (it has run its threshold less the lead): a call that stalls is read at least
        once unless it ends within moments of its threshold."""
        lead = self.lead
        watched = [
            (ident, started)
            for ident, (kind, started) in list(self._running.items())
            if now - started > self.limit(kind) - lead
        ]
        if not watched and not self._wall:
            return
        from ._stack_walk import folded_stack

        frames = sys._current_frames()
        for ident, started in watched:
            frame = frames.get(ident)
            call, read, texts = self._wall.get(ident, (None, None, {}))
            if call != started or read is None:  # a new call: the last one's reads are spent
                read = []
                texts = {}
                self._wall[ident] = (started, read, texts)
            if frame is not None and len(read) < MAX_WALL_READS:
                text = folded_stack(frame)  # each text kept once: a stalled thread's repeats
                read.append((now, texts.setdefault(text, text)))
        for ident in [ident for ident in self._wall if ident not in frames]:
            del self._wall[ident]  # the thread has ended

    # -- keeping stalls ---------------------------------------------------------------------------

    def _catch_up(self) -> None:
        # The native engine's samples of the last moments may still wait for its drain (the
        # python engine keeps no history, and its catch-up would sample this very thread).
        sampler = self._sampler
        if sampler.engine.name != "native":
            return
        with sampler._lock:
            if not sampler.table.stopped:
                sampler.engine.catch_up()

    def _finish_pending(self) -> None:
        # A reader waits only while stalls are pending (see document): with none, no one is
        # told (a Condition's notify is Python code: ~7 us at each of 40 wake-ups a second).
        if not self._pending:
            return
        self._catch_up()
        while self._pending:
            self._finish(*self._pending.popleft())
        with self._settled:
            self._settled.notify_all()

    def _finish(self, stall: Stall, started: float, ended: float) -> None:
        ident = stall.ident
        call, read, _ = (
            self._wall.get(ident, (None, [], {})) if ident is not None else (None, [], {})
        )
        if call == started:  # the stall is that call: its reads are spent
            del self._wall[ident]  # type: ignore[arg-type]
        for at, stack in read:
            if started <= at <= ended + self.period:
                stall.wall[stack] = stall.wall.get(stack, 0) + 1
        table = self._sampler.table
        for at, sampled, key, weight in self._recent():
            if sampled == ident and started <= at <= ended:
                stack = table.folded(key)
                stall.cpu[stack] = stall.cpu.get(stack, 0.0) + weight
        with self._lock:
            stall.id = self._next_id
            self._next_id += 1
            self.stalls.append(stall)

    def _recent(self) -> list[tuple[float, int, Any, float]]:
        recent = self._sampler.table.recent
        return list(recent) if recent is not None else []

    def document(self, since: int = 0) -> dict[str, Any]:
        """The stalls after id ``since``, worst first, as /stalls.json serves them (those
        reported but not yet finished by the watcher are waited for, a period or two)."""
        with self._settled:
            if self._pending and self._thread is not None:
                self._settled.wait(timeout=10 * self.period)
            stalls = [s for s in self.stalls if s.id > since]
            next_id = self._next_id
        stalls.sort(key=lambda s: s.duration, reverse=True)
        return {
            "threshold": self.threshold,
            "request_threshold": self.request_threshold,
            "next": next_id,
            "stalls": [s.document() for s in stalls],
        }


def _top(stacks: dict[str, Any]) -> dict[str, Any]:
    ranked = sorted(stacks.items(), key=lambda item: item[1], reverse=True)
    return dict(ranked[:MAX_STACKS_PER_STALL])
