"""Worst cases of a window: stalls and slow requests (issue 16), as a page and its JSON API.

``/api/stalls``: the worst stalls with their stacks, the flamegraph of stall time only, and the
stall durations' p50, p99, p99.9 and max per bucket. ``/api/requests``: per route, latency
percentiles merged from every instance's sketches, queueing, errors, and the flamegraph of the
slowest 1% of requests; ``/api/slow-diff?route=R``: that route's slowest 1% against all of its
samples, as a differential tree. All take the window and the service and host filters of every
page.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from flask import Blueprint, Response, jsonify, request

from collector.request_rows import SKETCHES, RequestFigures
from collector.store import schema
from collector.worst_rows import FLEET_WIDTHS, stall_stacks
from sampler._sketch import SketchError
from sampler.profile import LIMITS, align_down, align_up
from webui import api, db, pages
from webui.api import _describe, _selection
from webui.model import diff_tree, flame_tree, rank_changes
from webui.params import ParamError, Selection, parse_int

__all__ = ["bp"]

bp = Blueprint("worst", __name__)
log = logging.getLogger(__name__)
api.json_errors(bp)
pages.add_view(bp, "/worst", "worst")

QUANTILES = (0.5, 0.9, 0.99, 0.999)
# Rows of request figures one /api/requests reads at most (one per minute, instance and route
# with a host or instance filter; else one per day, hour, ten minutes or minute, service and
# route).
MAX_REQUEST_ROWS = 200_000
# Stalls whose stacks make the stall flamegraph, the longest first.
MAX_FLAME_STALLS = 5_000
MAX_BUCKETS = 1500


@bp.get("/api/stalls")
def stalls() -> Response:
    """The window's worst stalls, their flamegraph and their durations per bucket."""
    selection = _selection()
    limit = parse_int(request.args, "limit", 50, 1, 1000)
    table = schema.stall_events
    where = _where(table, selection, table.c.start)
    with db.read_connection("reading worst cases") as conn:
        worst = conn.execute(
            sa.select(table).where(where).order_by(table.c.duration.desc()).limit(limit)
        ).all()
        durations = conn.execute(sa.select(table.c.start, table.c.duration).where(where)).all()
        # The flamegraph of stall time: the stacks of the window's longest stalls (all of
        # them up to MAX_FLAME_STALLS).
        every = conn.execute(
            sa.select(table.c.stacks)
            .where(where)
            .order_by(table.c.duration.desc())
            .limit(MAX_FLAME_STALLS)
        ).all()
    width = _width(selection)
    per_bucket: dict[int, list[float]] = {}
    for start, duration in durations:
        per_bucket.setdefault(align_down(int(start), width), []).append(duration)
    # A row whose stacks cannot be read (damaged, or written by hand) keeps its place in the
    # table and the durations, with no stacks, and is counted, as /api/requests does.
    readable = [row for row in every if _stall_stacks(row.stacks) is not None]
    unreadable = len(every) - len(readable)
    if unreadable:
        log.warning("/api/stalls: %d stall rows with unreadable stacks left out", unreadable)
    return jsonify(
        selection=_describe(selection),
        count=len(durations),
        seconds=round(sum(d for _, d in durations), 3),
        stalls=[_stall(row) for row in worst],
        flamegraph=flame_tree(_whole(stall_stacks(readable))).to_dict(),
        buckets=[
            {"t": bucket, "count": len(values), **_percentiles(sorted(values))}
            for bucket, values in sorted(per_bucket.items())
        ],
        bucket_seconds=width,
        unreadable_rows=unreadable,
    )


@bp.get("/api/requests")
def routes() -> Response:
    """Per route: requests, errors, latency, queueing and total percentiles, the slowest
    requests, and the flamegraph of the slowest 1%."""
    selection = _selection()
    with db.read_connection("reading worst cases") as conn:
        rows = _request_rows(conn, selection)
    merged, unreadable = _merged(rows, "/api/requests")
    slow_stacks: dict[str, float] = {}
    for figures in merged.values():
        for stack, weight in figures.stacks.items():
            slow_stacks[stack] = slow_stacks.get(stack, 0) + weight
    return jsonify(
        selection=_describe(selection),
        routes=sorted(
            (_route(name, route) for name, route in merged.items()),
            key=lambda r: -(r["latency"]["p99"] or 0),
        ),
        slow_flamegraph=flame_tree(_whole(slow_stacks)).to_dict(),
        unreadable_rows=unreadable,
    )


@bp.get("/api/slow-diff")
def slow_diff() -> Response:
    """A route's slowest 1% of requests (B) against every sample of the route (A, its
    ``route`` label), as the compare page's differential tree and functions: what the slow
    requests do more of than the route's requests in general."""
    selection = _selection()
    route = request.args.get("route") or ""  # a route label's value, exactly
    if not route or len(route) > LIMITS.max_text:
        raise ParamError("route", "name a route, as /api/requests lists it")
    with db.read_connection("reading worst cases") as conn:
        rows = _request_rows(conn, selection, route)
    # Read as /api/requests reads them: the rows it leaves out are left out here too.
    merged, unreadable = _merged(rows, "/api/slow-diff")
    slow = merged[route].stacks if route in merged else {}
    labels = (*selection.labels, ("route", route))
    everything = db.get_db().read(replace(selection, labels=labels)).counts
    slowest = _whole(slow)
    tree = diff_tree(everything, slowest, max_nodes=2000)
    changes = rank_changes(everything, slowest, limit=50) if everything and slowest else []
    return jsonify(
        selection=_describe(selection),
        route=route,
        functions=[change.to_dict() for change in changes],
        unreadable_rows=unreadable,
        **tree.to_dict(),
    )


def _merged(rows: list[Any], endpoint: str) -> tuple[dict[str, RequestFigures], int]:
    """The request rows' figures added up per route, and how many rows could not be read."""
    merged: dict[str, RequestFigures] = {}
    unreadable = 0
    for row in rows:
        figures = merged.get(row.route) or RequestFigures()
        try:
            merged[row.route] = figures.add(row._mapping)
        except (SketchError, ValueError, TypeError, KeyError, AttributeError):
            unreadable += 1  # written by hand, or damaged: left out, and said
    if unreadable:
        log.warning("%s: %d unreadable request rows left out", endpoint, unreadable)
    return merged, unreadable


def _route(name: str, figures: RequestFigures) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "route": name,
        "count": figures.count,
        "errors": figures.errors,
        "slow": figures.slow_count,
        "slowest": figures.slowest,
    }
    for sketch_name in SKETCHES:
        sketch = figures.sketch(sketch_name)
        quantiles = {f"p{_label(q)}": _round(sketch.quantile(q)) for q in QUANTILES}
        summary[sketch_name] = {"count": sketch.count, **quantiles, "max": _round(sketch.max)}
    return summary


def _stall_stacks(text: Any) -> dict[str, dict[str, float]] | None:
    """A stall row's stacks, ``{"wall": {stack: weight}, "cpu": {...}}``, or None where
    they are not that (damaged, or written by hand)."""
    try:
        stacks = json.loads(text)
    except (TypeError, ValueError):
        return None
    if not isinstance(stacks, dict) or set(stacks) != {"wall", "cpu"}:
        return None
    for part in stacks.values():
        if not isinstance(part, dict) or not all(_weight(w) for w in part.values()):
            return None
    return stacks


def _weight(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf


def _stall(row: Any) -> dict[str, Any]:
    stacks = _stall_stacks(row.stacks)
    return {
        "start": row.start,
        "duration": row.duration,
        "service": row.service,
        "host": row.host,
        "instance": row.instance,
        "kind": row.kind,
        "thread": row.thread,
        "what": row.what,
        "stacks": {"wall": {}, "cpu": {}} if stacks is None else stacks,
        "unreadable": stacks is None,
    }


def _request_rows(conn: sa.Connection, selection: Selection, route: str | None = None) -> list[Any]:
    """The request figures of the minutes that start in the window, of one route or all
    (rows of route, count, errors, sketches, slow): from request_fleet, every instance merged,
    in as few rows as fit the window, when no host or instance is asked for; else every
    instance's minutes from request_buckets. Refused past MAX_REQUEST_ROWS."""
    selects = []
    if selection.hosts or selection.instances:
        parts = [(schema.request_buckets, None, selection.start, selection.end)]
    else:
        start, end = align_up(selection.start, 60), align_up(selection.end, 60)
        parts = [(schema.request_fleet, *part) for part in _cover(start, end, FLEET_WIDTHS)]
    for table, width, part_start, part_end in parts:
        where = _where(table, replace(selection, start=part_start, end=part_end), table.c.bucket)
        if width is not None:
            where &= table.c.width == width
        if route is not None:
            where &= table.c.route == route
        columns = [table.c[name] for name in ("route", "count", "errors", "sketches", "slow")]
        selects.append(sa.select(*columns).where(where))
    count = sum(
        conn.execute(sa.select(sa.func.count()).select_from(query.subquery())).scalar() or 0
        for query in selects
    )
    if count > MAX_REQUEST_ROWS:
        raise ParamError(
            "from",
            f"{count:,} rows of route figures in this window, more than the "
            f"{MAX_REQUEST_ROWS:,} read at once: choose a shorter window, or leave out the "
            "host and instance filters (every instance is then read already merged)",
        )
    return [row for query in selects for row in conn.execute(query).all()]


def _cover(start: int, end: int, widths: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """[start, end) (whole minutes) as (width, from, to) parts of buckets of those widths
    (each divides the one before), the coarsest that fit first."""
    if start >= end:
        return []
    width, finer = widths[0], widths[1:]
    first, last = align_up(start, width), align_down(end, width)
    if first >= last:
        return _cover(start, end, finer) if finer else []
    middle = [(width, first, last)]
    if not finer:
        return middle
    return _cover(start, first, finer) + middle + _cover(last, end, finer)


def _where(table: sa.Table, selection: Selection, time: sa.Column) -> Any:
    where = (time >= selection.start) & (time < selection.end)
    if selection.services:
        where &= table.c.service.in_(selection.services)
    if selection.hosts:
        where &= table.c.host.in_(selection.hosts)
    if selection.instances:
        where &= table.c.instance.in_(selection.instances)
    return where


def _width(selection: Selection) -> int:
    """A bucket width for the durations chart: a minute, or wider to keep it under 1,500."""
    span = max(selection.end - selection.start, 60)
    return 60 * max(1, math.ceil(span / 60 / MAX_BUCKETS))


def _percentiles(values: list[float]) -> dict[str, float]:
    def at(q: float) -> float:
        return round(values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))], 4)

    return {"p50": at(0.5), "p99": at(0.99), "p99.9": at(0.999), "max": round(values[-1], 4)}


def _whole(stacks: dict[str, float]) -> dict[str, int]:
    # A weight of a damaged row may be Infinity (JSON as Python reads it), which no count is.
    return {
        stack: max(1, round(weight)) for stack, weight in stacks.items() if 0 < weight < math.inf
    }


def _label(q: float) -> str:
    return f"{q * 100:g}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
