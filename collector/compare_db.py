"""``fleetflame compare``'s database forms: the two sides' replicates read from the store.

    fleetflame compare --database-url URL --service S --a-label version:1.4.1 --b-label version:1.4.2 [--from --to]
    fleetflame compare --database-url URL --service S --a-from ... --a-to ... --b-from ... --b-to ...

A replicate is one instance's profile over one step of the side's window (a bucket, 60 s,
widened so that a side has at most ``MAX_REPLICATES``): samples of one process in one minute
are not independent draws, so the unit is the (instance, bucket) profile, not the sample
(collector/stats/__init__.py). Empty replicates are left out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from collector.query import Filters, Query
from collector.store import Store, StoreError
from collector.store.engines.sqlite import sqlite_path
from sampler.profile import WindowError, align_up, parse_label, parse_window, split_frames

__all__ = ["Side", "frames_of", "read_sides", "replicates_in"]

MAX_REPLICATES = 400


@dataclass(frozen=True)
class Side:
    """One side of a comparison: its window, label filter and replicates' names."""

    start: int
    end: int
    label: tuple[str, str] | None
    names: list[str]


class SideError(ValueError):
    """A side that cannot be read; the message says why."""


def read_sides(
    url: str,
    service: str,
    *,
    windows: dict[str, tuple[str | None, str | None]],
    labels: dict[str, str | None],
    shared: tuple[str, str],
    bucket: int = 60,
) -> tuple[list[dict[str, int]], list[dict[str, int]], Side, Side]:
    """Reads sides "a" and "b" from the store at ``url``: their replicates and descriptions."""
    now = int(time.time())
    missing = _missing_sqlite_file(url)
    if missing is not None:  # opening it would make an empty one
        raise SideError(f"no database at {missing} (--database-url {url})")
    try:
        store = Store(url)
    except StoreError as exc:
        raise SideError(str(exc)) from None
    try:
        query = Query(store)
        out: list[tuple[list[dict[int, int]], Side]] = []
        for side in ("a", "b"):
            start_text = windows[side][0] or shared[0]
            end_text = windows[side][1] or shared[1]
            try:
                window = parse_window(start_text, end_text, now)
            except WindowError as exc:
                raise SideError(f"side {side.upper()}: {exc}") from None
            label = _label(labels[side], side)
            out.append(_side(query, service, window.start, window.end, label, bucket))
        (a, side_a), (b, side_b) = out
        text = query.stack_names({sid for side in (a, b) for counts in side for sid in counts})
    except StoreError as exc:
        raise SideError(str(exc)) from None
    finally:
        store.close()
    folded = [[{text[sid]: n for sid, n in counts.items()} for counts in side] for side in (a, b)]
    return folded[0], folded[1], side_a, side_b


def _missing_sqlite_file(url: str) -> str | None:
    """The path of a SQLite URL's file (``file:`` URIs too) when there is none, else None."""
    try:
        path = sqlite_path(url)
    except sa.exc.ArgumentError:
        return None  # Store names what is wrong with the URL
    return str(path) if path is not None and not path.exists() else None


def _label(text: str | None, side: str) -> tuple[str, str] | None:
    """A side's label, read exactly as the web UI's ``label`` parameter is (parse_label)."""
    if text is None:
        return None
    label = parse_label(text)
    if label is None or not label[0]:
        raise SideError(
            f"side {side.upper()}: --{side}-label wants key:value (a key holding ':' as a "
            f'JSON string, "k:1":value), got {text!r}'
        )
    return label


def replicates_in(
    query: Query,
    filters: Filters,
    start: int,
    end: int,
    bucket: int = 60,
    most: int = MAX_REPLICATES,
) -> tuple[list[dict[int, int]], list[str]]:
    """The replicates of the samples ``filters`` selects in [start, end): one profile (counts
    by stack id) per instance and step (``bucket`` seconds, widened so that there are at most
    ``most``, or one per instance when there are more instances), with their names
    (``instance@step start``). Empty ones are left out."""
    start = align_up(start, bucket)  # the buckets that start in the window, as every view
    if start >= end:
        return [], []
    instances = query.label_values(start, end, filters).get("instance", [])
    buckets = max(1, math.ceil((end - start) / bucket))
    # Each instance's window in as many steps as ``most`` leaves it (one at least).
    per_instance = max(1, most // max(1, len(instances)))
    step = bucket * math.ceil(buckets / per_instance)
    by_step = query.replicate_counts(start, end, filters, step)
    names = sorted(key for key, counts in by_step.items() if any(c > 0 for c in counts.values()))
    return [by_step[key] for key in names], [f"{instance}@{t}" for instance, t in names]


def frames_of(query: Query, *sides: list[dict[int, int]]) -> Callable[[int], list[str]]:
    """The frames of each stack id the sides hold, root first: how the statistics read them."""
    text = query.stack_names({sid for side in sides for counts in side for sid in counts})
    return lambda sid: split_frames(text[sid])


def _side(
    query: Query,
    service: str,
    start: int,
    end: int,
    label: tuple[str, str] | None,
    bucket: int,
    most: int = MAX_REPLICATES,
) -> tuple[list[dict[int, int]], Side]:
    filters = Filters(services=(service,), labels=(label,) if label else ())
    replicates, names = replicates_in(query, filters, start, end, bucket, most)
    return replicates, Side(align_up(start, bucket), end, label, names)
