"""Requests: per route, latency and queueing sketches, the slowest requests and their stacks.

The middleware (``sampler.middleware``) times each request on its own thread and hands this
module a tuple; everything else happens later on a thread of its own (``fleetflame-requests``,
started by the first request, gone after a minute without requests) or when
``/requests.json`` is read: the sketches, the route's p99 estimate, and the stacks of the requests slower than it (the
"slowest 1%") or among the route's slowest, taken from the native engine's recent samples of
the same thread (an event loop's: of any thread, with the request's route label) over the same
time, as the stall watcher does. So a request pays two clock reads, a tag and an append.

Everything served is cumulative for one ``series`` (new at process start and after a fork), so
a poller differences two reads; sketches merge across workers (sampler/_sketch.py). What is
counted of each route is in ``_request_routes``.
"""

from __future__ import annotations

import heapq
import os
import sys
import threading
import time
from collections import deque

from . import _labels
from ._cpuclock import thread_name
from ._log import log
from ._osthread import green_threads, own_thread
from ._request_routes import TOP, WINDOW, Route, SlowRequest, queue_delay, status_code

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

    from ._stacks import StackKey

__all__ = [
    "MAX_RAW_PATHS",
    "OVERFLOW",
    "UNMATCHED",
    "WINDOW",
    "Recorder",
    "Route",
    "queue_delay",
    "recorder",
]

FORMAT = "fleetflame.requests/1"
# Distinct routes kept (templates and raw paths together); past that they count under OVERFLOW.
MAX_ROUTES = 200
# Of which raw paths, for apps whose routes the middleware cannot see: a path is not a template,
# so only the first ones seen get a route of their own.
MAX_RAW_PATHS = 50
MAX_PATH = 100
OVERFLOW = "[other]"
UNMATCHED = "[unmatched]"
# Distinct stacks in the slowest 1% counts, over all routes; then [other].
MAX_SLOW_STACKS = 5000
# Requests waiting for the recorder; past that they are dropped (and counted).
MAX_PENDING = 100_000
# The recorder's thread wakes this often and counts what waits. A wake costs ~150-300 us of its
# thread's CPU on these VMs whatever the batch (the wake and the GIL, the engine's catch-up for
# the slow requests' stacks, a split chunk, cold caches), so at 1,000 requests a second a 0.2 s
# period cost ~1 us a request more than 0.5 s (docs/worst-cases.md). A reader counts what waits
# first, so /requests.json is as fresh; what waits is bounded by MAX_PENDING, and the slow
# requests' samples must still be in the engine's recent ones (RECENT_SAMPLES, ~10 s of 8 busy
# threads) PERIOD after they end.
PERIOD = 0.5
# The thread goes after this long without requests (it costs nothing much while it waits, and a
# thread that comes and goes churns the engines' thread lists).
IDLE_EXIT = 60.0
# Samples are ordered by when they were drained, not quite by when they were taken.
SLACK = 0.05

# One finished request: route, monotonic start, seconds, request-start header, epoch seconds at
# start (when the header is there), thread ident, whether stacks are found by the route label
# (an event loop's requests) rather than by thread, HTTP status (a WSGI status line or a
# number; 0: the app raised), raw path.
if TYPE_CHECKING:
    Finished = tuple[str, float, float, "str | None", float, int, bool, "int | str", str]


class Recorder:
    """Receives finished requests from the middleware and keeps what /requests.json serves."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.series = os.urandom(8).hex()
        self.routes: dict[str, Route] = {}
        self.names: dict[str, str] = {}  # what the middleware saw -> the route it counts under
        self._raw_paths = 0
        self.pending: deque[Finished] = deque()
        self.dropped = 0
        self.failures = 0
        self._next_id = 1
        self._slow_stack_count = 0
        self._lock = threading.Lock()  # the counts above, while a batch or a reader works
        self._wake_lock = threading.Lock()
        self._awake = False
        self._start_failed = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._folded: dict[StackKey, str] = {}
        self._table: Any = None
        self._route_of_set: dict[int, str | None] = {}

    # -- on the request's thread --------------------------------------------------------------

    def route_name(self, seen: str, raw: bool = False) -> str:
        """The route a template (or, with ``raw``, a path) counts under: bounded in number."""
        name = self.names.get(seen)
        if name is not None:
            return name
        with self._wake_lock:
            if seen in self.names:
                return self.names[seen]
            if len(self.names) >= MAX_ROUTES or (raw and self._raw_paths >= MAX_RAW_PATHS):
                return OVERFLOW
            name = seen[:MAX_PATH] if raw else seen
            self._raw_paths += raw
            self.names[seen] = name
            return name

    def finish(self, request: Finished) -> None:
        """Hands over a finished request (the middleware calls this, on the request's thread).
        The C middleware calls it for the first request of a batch only: one that finds others
        queued is appended as here (a thread to count them was woken by the first)."""
        pending = self.pending
        if len(pending) >= MAX_PENDING:
            self.dropped += 1
            return
        pending.append(request)
        # Not while the interpreter finalizes (a request ended by its coroutine's finalizer):
        # a thread started then is never run, and its start() waits for it for ever.
        if not self._awake and not sys.is_finalizing():
            self._wake()

    def _wake(self) -> None:
        with self._wake_lock:
            if self._awake:
                return
            self._awake = True
            self._stopping.clear()
            thread = threading.Thread(target=self._run, name="fleetflame-requests", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # no thread to be had (a limit on threads, memory, shutdown)
                self._awake = False
                self._drop_pending()
                if not self._start_failed:  # once: every request after would try again
                    self._start_failed = True
                    log.warning(
                        "fleetflame: the request recorder's thread could not start; the "
                        "requests that waited for it are dropped (counted)"
                    )
                return
            self._thread = thread

    def _drop_pending(self) -> None:
        # What waits with no thread to count it is dropped, counted: the queue empty, the next
        # request's hand-over calls finish, which wakes a thread again (the C middleware
        # appends to a non-empty queue without calling finish: it holds that a non-empty queue
        # has a thread that reads it).
        pending = self.pending
        while pending:
            pending.popleft()
            self.dropped += 1

    # -- the recorder's thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException:
            # The thread dies (it returns only with the queue empty): what waits is not left
            # for a thread that is gone.
            with self._wake_lock:
                self._awake = False
                self._drop_pending()
            self.failures += 1
            raise

    def _serve(self) -> None:
        from ._process import running

        own_thread()
        idle_since = time.monotonic()
        excluded_from = None
        while True:
            stopping = self._stopping.wait(PERIOD)
            sampler = running()
            if sampler is not None and sampler is not excluded_from:
                excluded_from = sampler
                _exclude(sampler, True)
            if self.pending:
                try:
                    self.process()
                except Exception:  # noqa: BLE001 - never let the recorder fail the host
                    self.failures += 1
                    if self.failures == 1:
                        log.exception("fleetflame: the request recorder failed (counted after)")
                idle_since = time.monotonic()
            elif stopping or time.monotonic() - idle_since > IDLE_EXIT:
                with self._wake_lock:
                    if not self.pending:
                        self._awake = False
                        if excluded_from is not None:
                            _exclude(excluded_from, False)
                        return

    def stop(self) -> None:
        """Counts what waits and stops the recorder's thread (it starts again when needed)."""
        thread = self._thread
        self._stopping.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        self.process()

    def after_fork_in_child(self) -> None:
        """Starts over in a forked child: a new series, nothing counted, no thread."""
        self._reset()

    def reset(self) -> None:
        """Stops the thread and forgets everything counted: a new series starts."""
        self.stop()
        self._reset()

    # -- counting ---------------------------------------------------------------------------------

    def process(self) -> None:
        """Counts the finished requests that wait, and finds the stacks of the slow ones."""
        with self._lock:
            batch = []
            pending = self.pending
            while pending:
                batch.append(pending.popleft())
            if not batch:
                return
            # Per route, the requests that may be among its slowest: slower than the p99, or
            # than the slowest kept before this batch; only the batch's TOP slowest of those
            # are (a first batch after a quiet spell holds thousands).
            by_route: dict[str, list[Finished]] = {}
            for request in batch:
                by_route.setdefault(request[0], []).append(request)
            found: dict[Route, list[tuple[Finished, bool]]] = {}
            routes = self.routes
            for name, requests in by_route.items():
                route = routes.get(name)
                if route is None:
                    route = routes[name] = Route()
                candidates = route.add_batch(requests)
                if candidates:
                    found[route] = candidates
            wanted: list[tuple[Route, SlowRequest, Finished, bool, bool]] = []
            for route, candidates in found.items():
                tops = {id(c[0]) for c in heapq.nlargest(TOP, candidates, key=_elapsed)}
                for request, slow in candidates:
                    top = id(request) in tops
                    if slow or top:
                        queue = queue_delay(request[3], request[4]) if request[3] else None
                        wanted.append(
                            (route, SlowRequest(0.0, request[2], queue), request, slow, top)
                        )
            if wanted:
                self._add_stacks(wanted)

    def _add_stacks(self, wanted: list[tuple[Route, SlowRequest, Finished, bool, bool]]) -> None:
        samples, table = self._samples_since(min(request[1] for _, _, request, _, _ in wanted))
        clock_offset = time.time() - time.monotonic()
        # Greenlets (gevent's or eventlet's patch) take turns on one OS thread, as an event
        # loop's tasks do: a request's samples are those of its route, not of its thread.
        green = green_threads() is not None
        for route, slow_request, request, slow, top in wanted:
            _, started, elapsed, header, _, ident, by_label, status, path = request
            by_label = by_label or green
            ended = started + elapsed
            stacks = slow_request.stacks
            for at, sampled, key, weight in samples:
                if started <= at <= ended and (
                    self._route_label(key[0]) == request[0] if by_label else sampled == ident
                ):
                    stack = self._folded_of(key, table)
                    stacks[stack] = stacks.get(stack, 0.0) + weight
            if slow:
                counts = route.slow_stacks
                for stack, weight in stacks.items():
                    if stack not in counts:
                        if self._slow_stack_count >= MAX_SLOW_STACKS:
                            stack = "[other]"
                        else:
                            self._slow_stack_count += 1
                    counts[stack] = counts.get(stack, 0.0) + weight
            if top:
                slow_request.started = clock_offset + started
                slow_request.id = self._next_id
                self._next_id += 1
                slow_request.thread = thread_name(ident)
                slow_request.status = status_code(status)
                slow_request.path = path[:MAX_PATH]
                if len(route.slowest) < TOP:
                    heapq.heappush(route.slowest, slow_request)
                elif slow_request.duration > route.slowest[0].duration:
                    heapq.heapreplace(route.slowest, slow_request)

    def _samples_since(self, oldest: float) -> tuple[list[tuple[float, int, Any, float]], Any]:
        """The native engine's samples taken from ``oldest`` on (none with the python engine)."""
        from ._process import running

        sampler = running()
        if sampler is None or sampler.engine.name != "native" or sampler.table.recent is None:
            return [], None
        found = []
        with sampler._lock:
            table = sampler.table
            if not table.stopped:
                try:
                    sampler.engine.catch_up()
                except OSError:  # the engine's own trouble: the samples drained so far serve
                    pass
            # Newest first, as far back as needed: holding the lock, as the drain appends.
            for sample in reversed(table.recent or ()):
                if sample[0] < oldest - SLACK:
                    break
                found.append(sample)
        return found, table

    def _folded_of(self, key: StackKey, table: Any) -> str:
        if table is not self._table:
            self._folded.clear()
            self._table = table
        folded = self._folded.get(key)
        if folded is None:
            folded = table.folded(key)
            if len(self._folded) < 4 * MAX_SLOW_STACKS:
                self._folded[key] = folded
        return folded

    def _route_label(self, set_id: int) -> str | None:
        route = self._route_of_set.get(set_id, "")
        if route == "":
            route = self._route_of_set[set_id] = _labels.label_set(set_id).get("route")
        return route

    # -- reading ----------------------------------------------------------------------------------

    def document(self) -> dict[str, Any]:
        """Everything counted so far, as /requests.json serves it (docs/wire-format.md)."""
        from ._process import running

        self.process()
        sampler = running()
        native = sampler is not None and sampler.engine.name == "native"
        with self._lock:
            routes = {name: route.document() for name, route in self.routes.items()}
            next_id = self._next_id
        return {
            "format": FORMAT,
            "series": self.series,
            "instance": sampler.instance["id"] if sampler is not None else None,
            "labels": sampler.labels if sampler is not None else None,
            "pid": os.getpid(),
            "time": round(time.time(), 3),
            "stacks": "native" if native else None,
            "dropped": self.dropped,
            "failures": self.failures,
            "next": next_id,
            "routes": routes,
        }


def _exclude(sampler: Any, excluded: bool) -> None:
    """Leaves the recorder's own thread out of the sampler's profile (or back in)."""
    try:
        if excluded:
            sampler._excluded.add(threading.get_ident())
        else:
            sampler._excluded.discard(threading.get_ident())
    except OSError:  # the native engine could not pause it: its samples are counted
        pass


def _elapsed(candidate: tuple[Finished, bool]) -> float:
    return candidate[0][2]


def on_greenlet() -> bool:
    """Whether the caller runs on a greenlet other than its thread's main one: gevent's or
    eventlet's hub switches between such, so requests take turns on one OS thread (with
    threading patched or not: patch_all(thread=False), uWSGI's gevent loop)."""
    module = sys.modules.get("greenlet")
    if module is None:
        return False
    try:
        return module.getcurrent().parent is not None
    except Exception:  # noqa: BLE001 - never fail the host's request
        return False


recorder = Recorder()
os.register_at_fork(after_in_child=recorder.after_fork_in_child)
