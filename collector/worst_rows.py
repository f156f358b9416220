"""The worst cases' rows in the database: request rows merged in, stall rows' stacks read.

A read's request rows go into request_buckets, merged with a row of the same minute,
instance and route (two reads in one minute), and into request_fleet: per service and route,
every instance and host merged, at each of FLEET_WIDTHS, so that a window is read in as few
rows as fit it (migration 0008 fills it from the minutes kept). A stored row that cannot be
read (written by hand, or damaged) is logged and left out, replaced by what is added to it,
never failing every write of its key from then on. Written by collector.worst, read by the web
UI's worst-cases page (webui.worst).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa

from collector.logs import log_event
from collector.request_rows import RequestFigures
from collector.store import schema
from sampler._sketch import SketchError
from sampler.profile import align_down

__all__ = [
    "FLEET_WIDTHS",
    "MAX_FLEET_STACKS",
    "add_fleet_rows",
    "add_request_rows",
    "merge_bucket_rows",
    "stall_stacks",
]

log = logging.getLogger("collector.worst")
# The widths request_fleet keeps, coarsest first: a window is read in as few rows as fit it.
FLEET_WIDTHS = (86400, 3600, 600, 60)
# Slow stacks a request_fleet row keeps (every instance's merged); the rest under [other].
MAX_FLEET_STACKS = 5000


def add_request_rows(conn: sa.Connection, rows: list[dict]) -> None:
    """Adds rows to request_buckets, merging with a row of the same key (two reads in one
    minute), and each into the rows of request_fleet that hold its time."""
    table = schema.request_buckets
    for row in rows:
        key = (
            (table.c.bucket == row["bucket"])
            & (table.c.instance == row["instance"])
            & (table.c.route == row["route"])
        )
        old = conn.execute(sa.select(table).where(key)).mappings().first()
        if old is None:
            conn.execute(table.insert(), [row])
            continue
        merged = merge_bucket_rows(dict(old), row)
        conn.execute(table.update().where(key).values(**merged))
    add_fleet_rows(conn, rows)


def add_fleet_rows(conn: sa.Connection, rows: Iterable[dict]) -> None:
    """Merges request_buckets rows into request_fleet at every width: one read and one write
    per width, bucket, service and route, however many instances the rows come from."""
    groups: dict[tuple[int, int, str, str], RequestFigures] = {}
    for row in rows:
        # A minute row stored by an older collector may be unreadable (migration 0008 merges
        # them all): left out of the merged rows, not failing the rest.
        if not _add_stored(RequestFigures(), row, bucket=row["bucket"], route=row["route"]):
            continue
        for width in FLEET_WIDTHS:
            key = (width, align_down(int(row["bucket"]), width), row["service"], row["route"])
            groups.setdefault(key, RequestFigures()).add(row)
    table = schema.request_fleet
    for (width, bucket, service, route), figures in groups.items():
        where = (
            (table.c.width == width)
            & (table.c.bucket == bucket)
            & (table.c.service == service)
            & (table.c.route == route)
        )
        old = conn.execute(sa.select(table).where(where)).mappings().first()
        _add_stored(figures, old, width=width, bucket=bucket, service=service, route=route)
        values = figures.row(MAX_FLEET_STACKS)
        if old is None:
            key = {"width": width, "bucket": bucket, "service": service, "route": route}
            conn.execute(table.insert(), [{**key, **values}])
        else:
            conn.execute(table.update().where(where).values(**values))


def merge_bucket_rows(old: dict, new: dict) -> dict:
    """The row of what two request rows of one bucket, instance and route hold together."""
    figures = RequestFigures().add(new)
    _add_stored(figures, old, bucket=old["bucket"], instance=old["instance"], route=old["route"])
    return figures.row()


def _add_stored(figures: RequestFigures, old: Any, **where: Any) -> bool:
    # A stored row that cannot be read (written by hand, or damaged) is logged and left out:
    # replaced by what is added to it, never failing every write of its key from now on.
    try:
        figures.add(old)
        return True
    except (SketchError, ValueError, TypeError, KeyError) as exc:
        log_event(
            log,
            logging.WARNING,
            "worst cases: an unreadable request row left out",
            error=str(exc)[:200],
            **{key: str(value)[:200] for key, value in where.items()},
        )
        return False


def stall_stacks(rows: Iterable[Any]) -> dict[str, float]:
    """The folded stacks of stall rows merged: wall reads, or CPU samples where a stall has none."""
    merged: dict[str, float] = {}
    for row in rows:
        stacks = json.loads(row.stacks)
        for stack, weight in (stacks["wall"] or stacks["cpu"]).items():
            merged[stack] = merged.get(stack, 0) + weight
    return merged
