"""Reads the times people type into a URL: ISO 8601, epoch seconds, or relative like ``-1h``."""

from __future__ import annotations

import re
from datetime import datetime, timezone

__all__ = ["choose_step", "fill_timeline", "parse_duration", "parse_time"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(?:(\d+)([smhdw]))")
_RELATIVE = re.compile(r"(?:now)?-((?:\d+[smhdw])+)")
_EPOCH = re.compile(r"\d+(?:\.\d+)?")
# Epoch values above this are milliseconds (as Grafana sends them): 10**11 s is year 5138.
_MILLIS_ABOVE = 10**11
_FORMS = "ISO 8601 (2026-01-31T12:00:00Z), epoch seconds, 'now', or relative like -15m, -1h, -7d"


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
    and ISO 8601 dates and times (without a zone they are UTC). Raises ValueError otherwise.
    """
    text = text.strip()
    if text == "now":
        return now
    relative = _RELATIVE.fullmatch(text)
    if relative:
        return now - parse_duration(relative.group(1))
    if _EPOCH.fullmatch(text):
        value = float(text)
        if value > _MILLIS_ABOVE:
            value /= 1000
        return int(value)
    iso = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        raise ValueError(f"{text[:60]!r} is not a time: use {_FORMS}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() // 1)


# Timeline steps people read easily; each is rounded up to a multiple of the bucket width.
_NICE_STEPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 7 * 86400)


def choose_step(start: int, end: int, bucket_seconds: int, max_points: int = 400) -> int:
    """Returns the timeline step for a window: the finest nice step giving <= max_points."""
    span = max(end - start, 1)
    for step in (bucket_seconds, *_NICE_STEPS):
        step = -(-step // bucket_seconds) * bucket_seconds
        if span / step <= max_points:
            return step
    return -(-span // max_points // bucket_seconds) * bucket_seconds


def fill_timeline(
    points: list[tuple[int, int]], start: int, end: int, step: int
) -> list[tuple[int, int]]:
    """Returns one (bucket start, samples) per step over [start, end), zero where none."""
    counts = dict(points)
    first = start - start % step
    return [(t, counts.get(t, 0)) for t in range(first, end, step)]
