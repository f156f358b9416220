"""Time buckets and windows: where a sample's bucket starts, and the windows people ask for.

Times are integer epoch seconds, UTC; a window is half-open, ``[start, end)``, and a bucket
counts in a window when its start lies in it. The collector writes each poll's samples into
the bucket of the poll's time; the store rolls buckets up into wider ones (every width a
multiple of the finer); the web UI reads windows typed into a URL. The current time is
always passed in.
"""

from __future__ import annotations

import re

__all__ = [
    "BUCKET_SECONDS",
    "Window",
    "WindowError",
    "align_down",
    "align_up",
    "bucket_of",
    "bucket_starts",
    "buckets_in",
    "choose_step",
    "fill_timeline",
    "is_settled",
    "parse_duration",
    "parse_time",
    "parse_window",
]

# The finest bucket's default width (the collector's and web UI's setting bucket_seconds).
BUCKET_SECONDS = 60
# A window whose end is at least this many finest buckets old gets no more samples: a poll
# writes into the bucket of its time, and the last one may land just after the bucket ends.
_SETTLED_BUCKETS = 2

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:(\d+)([smhdw]))")
_RELATIVE = re.compile(r"(?:now)?-((?:\d+[smhdw])+)")
_EPOCH = re.compile(r"\d+(?:\.\d+)?")
# Epoch values above this are milliseconds (as Grafana sends them): 10**11 s is year 5138.
_MILLIS_ABOVE = 10**11
# The last second of the year 9999, the latest time accepted (datetime's own limit).
_LATEST = 253402300799
_FORMS = "ISO 8601 (2026-01-31T12:00:00Z), epoch seconds, 'now', or relative like -15m, -1h, -7d"
# Timeline steps people read easily; each is rounded up to a multiple of the bucket width.
_NICE_STEPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 7 * 86400)


class WindowError(ValueError):
    """A window's start or end is not a time, or the window is empty; ``side`` says which
    end is wrong (``start`` or ``end``)."""

    def __init__(self, side: str, message: str) -> None:
        super().__init__(message)
        self.side = side


def align_down(t: int, width: int) -> int:
    """Returns the start of the bucket of ``width`` seconds holding second ``t``."""
    return t - t % width


def align_up(t: int, width: int) -> int:
    """Returns the first bucket start of ``width`` seconds at or after second ``t``."""
    return -(-t // width) * width


def bucket_of(t: float, width: int = BUCKET_SECONDS) -> int:
    """Returns the start of the bucket holding the moment ``t`` (epoch seconds, fractional)."""
    return align_down(int(t // 1), width)


def buckets_in(start: int, end: int, width: int) -> int:
    """Returns how many buckets of ``width`` seconds start in ``[start, end)``."""
    return max(0, align_up(end, width) // width - align_up(start, width) // width)


def bucket_starts(start: int, end: int, width: int) -> range:
    """Returns the starts of the buckets of ``width`` seconds that overlap ``[start, end)``."""
    return range(align_down(start, width), end, width)


def is_settled(end: int, now: float, bucket_seconds: int = BUCKET_SECONDS) -> bool:
    """Tells whether a window ending at ``end`` ended long enough before ``now`` to get no
    more samples."""
    return end <= now - _SETTLED_BUCKETS * bucket_seconds


class Window:
    """A half-open window of epoch seconds, ``[start, end)``, not empty."""

    __slots__ = ("start", "end")

    def __init__(self, start: int, end: int) -> None:
        if end <= start:
            raise WindowError("start", f"the window must start before it ends ({start} >= {end})")
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"Window({self.start}, {self.end})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Window):
            return NotImplemented
        return (self.start, self.end) == (other.start, other.end)

    def __hash__(self) -> int:
        return hash((self.start, self.end))

    @property
    def seconds(self) -> int:
        """How long the window is."""
        return self.end - self.start

    def __contains__(self, t: object) -> bool:
        return isinstance(t, (int, float)) and self.start <= t < self.end

    def aligned(self, width: int) -> Window:
        """Returns the smallest window of whole buckets of ``width`` seconds holding this one."""
        return Window(align_down(self.start, width), align_up(self.end, width))


def parse_duration(text: str) -> int:
    """Returns the seconds in a duration like ``90s``, ``15m``, ``1h30m``, ``7d`` or ``2w``.

    Raises ValueError when it is not one.
    """
    text = text.strip()
    if not text or _DURATION.sub("", text):
        raise ValueError(f"{text!r} is not a duration like 30s, 15m, 1h, 7d")
    return sum(int(n) * _UNITS[unit] for n, unit in _DURATION.findall(text))


def parse_time(text: str, now: int) -> int:
    """Returns the epoch second ``text`` names, relative forms counted back from ``now``.

    Accepts ``now``, ``-15m`` / ``now-1h30m``, epoch seconds (or milliseconds, above 10**11),
    and ISO 8601 dates and times (without a zone they are UTC), from 1970 to the year 9999.
    Raises ValueError otherwise.
    """
    moment = _parse_time(text, now)
    if not 0 <= moment <= _LATEST:
        raise ValueError(f"{text.strip()[:60]!r} is out of range: times run from 1970 to 9999")
    return moment


def _parse_time(text: str, now: int) -> int:
    text = text.strip()
    if text == "now":
        return now
    relative = _RELATIVE.fullmatch(text)
    if relative:
        return now - parse_duration(relative.group(1))
    if _EPOCH.fullmatch(text):
        value = float(text)  # 309 digits or more: inf
        if value > _MILLIS_ABOVE:
            value /= 1000
        return int(value) if value <= _LATEST else _LATEST + 1
    # Imported here: the sampler imports this package, and most of it never reads a date.
    from datetime import datetime, timezone

    iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(f"{text[:60]!r} is not a time: use {_FORMS}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() // 1)


def parse_window(start_text: str, end_text: str, now: int) -> Window:
    """Returns the window between two times as people type them (see parse_time); raises
    WindowError naming the side that is wrong."""
    bounds = []
    for side, text in (("start", start_text), ("end", end_text)):
        try:
            bounds.append(parse_time(text, now))
        except ValueError as exc:
            raise WindowError(side, str(exc)) from None
    return Window(*bounds)


def choose_step(start: int, end: int, bucket_seconds: int, max_points: int = 400) -> int:
    """Returns the timeline step for a window: the finest nice step giving <= max_points."""
    span = max(end - start, 1)
    for step in (bucket_seconds, *_NICE_STEPS):
        step = align_up(step, bucket_seconds)
        if span / step <= max_points:
            return step
    return align_up(-(-span // max_points), bucket_seconds)


def fill_timeline(
    points: list[tuple[int, int]], start: int, end: int, step: int
) -> list[tuple[int, int]]:
    """Returns one (bucket start, samples) per step over [start, end), zero where none."""
    counts = dict(points)
    return [(t, counts.get(t, 0)) for t in bucket_starts(start, end, step)]
