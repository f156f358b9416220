"""What is counted of one route: requests and errors, latency and queueing sketches, the
p99 estimate, and the slowest requests with their stacks (the parts of /requests.json).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from operator import itemgetter

from ._sketch import Sketch

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms (see sampler/__init__.py)
if TYPE_CHECKING:
    from typing import Any

    from ._requests import Finished

# The slowest requests kept per route, with their stacks.
TOP = 5
# The p99 estimate: of the last WINDOW to 2 * WINDOW requests of the route, refreshed every
# REFRESH requests, from MIN_FOR_P99 requests on.
WINDOW = 5000
REFRESH = 100
MIN_FOR_P99 = 100
MAX_STACKS_SHOWN = 20  # stacks listed per slow request in /requests.json
# Queueing delays beyond this are a header that is not a request-start time.
MAX_QUEUE = 3600.0


def queue_delay(header: str, now: float) -> float | None:
    """Seconds between a request-start header (``t=...`` or a bare number, in seconds, ms, us
    or ns since the epoch, told apart by magnitude) and ``now``, 0 if it is later than ``now``;
    None if it is not one."""
    try:  # float() takes the white space around; most proxies write t= and seconds
        value = float(header[2:] if header.startswith("t=") else header)
    except ValueError:
        text = header.strip()
        if text.startswith("t="):
            text = text[2:]
        try:  # "t=..., D=..." (Apache's mod_headers adds D=)
            value = float(text.split(",", 1)[0].split(" ", 1)[0])
        except ValueError:
            return None
    if not value > 0:  # nan too
        return None
    if value < 1e11:
        delay = now - value
    else:
        for scale in (1e3, 1e6, 1e9):  # seconds are ~1.8e9 in this century
            if value < 1e11 * scale:
                delay = now - value / scale
                break
        else:
            return None
    if not -MAX_QUEUE < delay < MAX_QUEUE:
        return None
    return max(delay, 0.0)  # a proxy's clock ahead of ours: no time queued, not less than none


def _nth_slowest(chunk: list[Finished]) -> float:
    return heapq.nlargest(TOP, [request[2] for request in chunk])[-1]


def _below(value: float) -> float:
    # The threshold is exclusive (slower than it): ties with the value are kept.
    return math.nextafter(value, -math.inf)


def _is_error(code: int) -> bool:
    return code == 0 or code >= 500


try:
    from . import _native
except ImportError:  # not built: the Python path counts
    _native = None  # type: ignore[assignment]

# Of a finished request (sampler._requests.Finished): its seconds, its status.
_elapsed = itemgetter(2)
_status = itemgetter(7)


def status_code(status: int | str) -> int:
    """The HTTP status of a request as the middleware saw it (a WSGI status line, an ASGI
    number, 0 when the app raised)."""
    if isinstance(status, int):
        return status
    try:
        return int(status[:3])
    except ValueError:
        return 0


class SlowRequest:
    """One of a route's slowest requests, with the stacks sampled while it ran."""

    __slots__ = ("id", "started", "duration", "queue", "thread", "status", "path", "stacks")

    def __init__(self, started: float, duration: float, queue: float | None) -> None:
        self.id = 0
        self.started = started
        self.duration = duration
        self.queue = queue
        self.thread = ""
        self.status = 0
        self.path = ""
        self.stacks: dict[str, float] = {}

    def __lt__(self, other: SlowRequest) -> bool:
        return (self.duration, self.id) < (other.duration, other.id)

    def document(self) -> dict[str, Any]:
        """The request as /requests.json lists it."""
        ranked = sorted(self.stacks.items(), key=lambda item: item[1], reverse=True)
        return {
            "id": self.id,
            "start": round(self.started, 4),
            "duration": round(self.duration, 6),
            "queue": None if self.queue is None else round(self.queue, 6),
            "thread": self.thread,
            "status": self.status,
            "path": self.path,
            "stacks": {stack: round(w, 3) for stack, w in ranked[:MAX_STACKS_SHOWN]},
        }


class Route:
    """What is known of one route: counts, sketches, the p99 estimate, the slowest requests."""

    __slots__ = (
        "count",
        "errors",
        "latency",
        "queue",
        "total",
        "marks",
        "p99",
        "slow_count",
        "slow_stacks",
        "slowest",
    )

    def __init__(self) -> None:
        self.count = 0
        self.errors = 0
        self.latency = Sketch()
        self.queue = Sketch()
        self.total = Sketch()  # queue + latency, of the requests with a request-start header
        # Copies of ``latency`` every WINDOW requests, the last two: the p99 estimate is of the
        # requests after the older one.
        self.marks: deque[Sketch] = deque(maxlen=2)
        self.p99: float | None = None
        self.slow_count = 0
        self.slow_stacks: dict[str, float] = {}
        self.slowest: list[SlowRequest] = []  # a min-heap on duration

    def add(self, elapsed: float, queue: float | None, status: int) -> None:
        """Counts one request and keeps the p99 estimate fresh."""
        self.latency.add(elapsed)
        if queue is not None:
            self.queue.add(queue)
            self.total.add(queue + elapsed)
        self._counted(1, _is_error(status))

    def add_batch(self, requests: list[Finished]) -> list[tuple[Finished, bool]]:
        """Counts finished requests, in order, as ``add`` would one by one; returns those that
        may be among the route's slowest or were slower than the p99 estimate of their time,
        each with whether it was."""
        slowest = self.slowest
        full = len(slowest) >= TOP
        floor = slowest[0].duration if full else -math.inf
        count_chunk = self._count_in_c if _native is not None else self._count_in_python
        candidates = []
        at = 0
        while at < len(requests):
            # Up to the next refresh of the p99: the requests in between are judged by one.
            chunk = requests[at : at + REFRESH - self.count % REFRESH]
            at += len(chunk)
            p99 = self.p99
            # Among the route's slowest, only what is among its chunk's slowest: while fewer
            # than TOP are kept (a new route), not every request of the chunk.
            top = floor if full or len(chunk) <= TOP else _below(_nth_slowest(chunk))
            over = top if p99 is None else min(top, p99)
            for request in count_chunk(chunk, over):
                slow = p99 is not None and request[2] > p99
                self.slow_count += slow
                candidates.append((request, slow))
            self._counted(len(chunk), 0)
        return candidates

    def _count_in_python(self, chunk: list[Finished], threshold: float) -> list[Finished]:
        # Counts the chunk into the sketches and errors; returns its requests over threshold.
        queued = [
            (delay, request[2])
            for request in chunk
            if request[3] and (delay := queue_delay(request[3], request[4])) is not None
        ]
        self.latency.add_all(list(map(_elapsed, chunk)))
        if queued:
            self.queue.add_all([queue for queue, _ in queued])
            self.total.add_all([queue + seconds for queue, seconds in queued])
        self.errors += sum(
            count
            for status, count in Counter(map(_status, chunk)).items()
            if _is_error(status_code(status))
        )
        return [request for request in chunk if request[2] > threshold]

    def _count_in_c(self, chunk: list[Finished], threshold: float) -> list[Finished]:
        # The same in C (sampler/_native_src/counting.c): one call a chunk.
        latency, queue, total = self.latency, self.queue, self.total
        errors, queued, in_latency, in_queue, in_total, over = _native.count_requests(
            chunk,
            threshold,
            latency.bins,
            queue.bins,
            total.bins,
            latency.scale,  # the three sketches are alike
            latency.min_value,
            queue_delay,
            status_code,
            MAX_QUEUE,
        )
        latency.counted(len(chunk), *in_latency)
        queue.counted(queued, *in_queue)
        total.counted(queued, *in_total)
        self.errors += errors
        return [chunk[at] for at in over]

    def _counted(self, count: int, errors: int) -> None:
        # Requests counted into the sketches: up to the next refresh of the p99 at most.
        self.count += count
        self.errors += errors
        if self.count % REFRESH == 0:
            since = self.marks[0] if len(self.marks) == 2 else None
            if self.count >= MIN_FOR_P99:
                self.p99 = self.latency.quantile(0.99, since)
            if self.count % WINDOW == 0:
                self.marks.append(self.latency.copy())

    def document(self) -> dict[str, Any]:
        """The route as /requests.json lists it."""
        ranked = sorted(self.slow_stacks.items(), key=lambda item: item[1], reverse=True)
        return {
            "count": self.count,
            "errors": self.errors,
            "latency": self.latency.document(),
            "queue": self.queue.document(),
            "total": self.total.document(),
            "p99": self.p99,
            "slow": {"count": self.slow_count, "stacks": {s: round(w, 3) for s, w in ranked}},
            "slowest": [r.document() for r in sorted(self.slowest, reverse=True)],
        }
