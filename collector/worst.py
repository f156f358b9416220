"""Worst cases: each target's stalls and slow requests, polled and stored (issue 16).

Every ``worst_interval`` seconds, apart from the sample rounds (a slow target delays nothing
but this job), each target's ``/stalls.json?since=N`` and ``/requests.json`` are read. A stall
is stored once, keyed by its sampler instance and id. Request figures are cumulative per
sampler series (docs/wire-format.md): what each route added since the last read (its count,
errors, the bins of its latency, queueing and total sketches, its slowest 1%'s stacks, its
slowest requests not seen before) is stored in the minute of the read. A worker without the
endpoints (404: an older sampler, no middleware) is skipped quietly; anything malformed is
logged and skipped, never stored.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests
import sqlalchemy as sa

from collector.logs import log_event
from collector.request_rows import SKETCHES, RequestFigures, pack_sketch
from collector.store import schema
from collector.store.engines.base import translate_errors
from collector.store.ids import event_id
from collector.targets import Target
from sampler._sketch import Sketch, SketchError
from sampler.profile import align_down

__all__ = ["FLEET_WIDTHS", "WorstCases", "add_fleet_rows", "add_request_rows", "sketch_delta"]

log = logging.getLogger("collector.worst")
# Bounds on what one read may add: the sampler keeps 500 stalls, 200 routes, 50 stacks a stall.
MAX_STALLS = 500
MAX_ROUTES = 200
MAX_SLOWEST = 20  # slowest requests read from a route (a worker lists 5)
MAX_SLOW_STACKS = 50  # stacks of one slow request (a worker lists 20)
MAX_BYTES = 8_000_000
# The widths request_fleet keeps, coarsest first: a window is read in as few rows as fit it.
FLEET_WIDTHS = (86400, 3600, 600, 60)
# Slow stacks a request_fleet row keeps (every instance's merged); the rest under [other].
MAX_FLEET_STACKS = 5000


class BadDocument(ValueError):
    """A document that is not what the sampler serves."""


class WorstCases:
    """Polls and stores the targets' stalls and request figures."""

    def __init__(
        self,
        store: Any,
        *,
        bucket_seconds: int = 60,
        concurrency: int = 8,
        timeout: tuple[float, float] = (2.0, 5.0),
        token: str = "",
        lock: Any = None,
    ) -> None:
        self.store = store
        self.bucket_seconds = bucket_seconds
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="fleetflame-worst")
        self._local = threading.local()
        self._lock = lock or threading.Lock()  # the store's writer lock (SQLite: one writer)
        # target address -> (instance, the stall id to read after)
        self._stalls_next: dict[str, tuple[str, int]] = {}
        # target address -> (series, route -> its last cumulative document)
        self._requests_seen: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {}

    def poll(self, targets: Sequence[Target], now: float) -> dict[str, int]:
        """Reads every target once and stores what is new; returns what was stored."""
        results = list(self._pool.map(self._read, targets))
        stalls = [row for rows, _ in results for row in rows]
        buckets = [row for _, rows in results for row in rows]
        bucket = align_down(int(now), self.bucket_seconds)
        for row in buckets:
            row["bucket"] = bucket
        with self._lock, translate_errors("writing worst cases"):
            with self.store.engine.write_transaction() as conn:
                self.store.engine.insert_ignore(conn, schema.stall_events, stalls)
                self._add_buckets(conn, buckets)
        return {"stalls": len(stalls), "request_buckets": len(buckets)}

    def apply_retention(self, before: float) -> None:
        """Deletes what is older than ``before`` (epoch seconds)."""
        with self._lock, translate_errors("expiring worst cases"):
            with self.store.engine.write_transaction() as conn:
                conn.execute(
                    schema.stall_events.delete().where(schema.stall_events.c.start < before)
                )
                table = schema.request_buckets
                conn.execute(table.delete().where(table.c.bucket < int(before)))
                fleet = schema.request_fleet  # a row goes once all of its time has
                conn.execute(fleet.delete().where(fleet.c.bucket + fleet.c.width <= int(before)))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # Reading one target ---------------------------------------------------------------------

    def _read(self, target: Target) -> tuple[list[dict], list[dict]]:
        stalls: list[dict] = []
        buckets: list[dict] = []
        for name, read in (("stalls", self._stall_rows), ("requests", self._request_rows)):
            try:
                (stalls if name == "stalls" else buckets).extend(read(target))
            except requests.RequestException as exc:
                log.debug("worst cases: %s of %s: %s", name, target.address, exc)
            except (BadDocument, SketchError, ValueError, TypeError, KeyError) as exc:
                log_event(
                    log,
                    logging.WARNING,
                    f"worst cases: a malformed /{name}.json, skipped",
                    target=target.address,
                    error=str(exc)[:200],
                )
        return stalls, buckets

    def _get(self, target: Target, path: str) -> Any:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        answer = session.get(
            f"http://{target.address}{path}", headers=self._headers, timeout=self.timeout
        )
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        if len(answer.content) > MAX_BYTES:
            raise BadDocument(f"larger than {MAX_BYTES} bytes")
        return answer.json()

    def _stall_rows(self, target: Target) -> list[dict]:
        instance, after = self._stalls_next.get(target.address, ("", 0))
        document = self._get(target, f"/stalls.json?since={after}")
        if document is None:
            return []
        if not isinstance(document, dict) or not isinstance(document.get("stalls"), list):
            raise BadDocument("no stalls list")
        read_instance = _text(document.get("instance"), "instance")
        if read_instance != instance and after:  # a new process: its ids start over
            document = self._get(target, "/stalls.json?since=0") or document
        labels = _labels(document)
        rows = [
            _stall_row(stall, read_instance, labels) for stall in document["stalls"][:MAX_STALLS]
        ]
        self._stalls_next[target.address] = (read_instance, int(document["next"]) - 1)
        return rows

    def _request_rows(self, target: Target) -> list[dict]:
        document = self._get(target, "/requests.json")
        if document is None:
            return []
        if not isinstance(document, dict) or not isinstance(document.get("routes"), dict):
            raise BadDocument("no routes object")
        series = _text(document.get("series"), "series")
        instance = _text(document.get("instance") or series, "instance")
        labels = _labels(document)
        seen_series, seen = self._requests_seen.get(target.address, ("", {}))
        if seen_series != series:
            seen = {}  # a new process or fork: everything it counted is new
        rows, current = [], {}
        for route, part in list(document["routes"].items())[:MAX_ROUTES]:
            if not isinstance(part, dict):
                raise BadDocument(f"route {route[:60]!r} is not an object")
            current[route] = part
            try:
                row = _route_delta(part, seen.get(route), labels.get("host", target.host))
            except (SketchError, KeyError, TypeError, ValueError) as exc:
                # This route only: its sketches stay malformed until the worker restarts,
                # and its other routes are still worth keeping.
                log_event(
                    log,
                    logging.WARNING,
                    "worst cases: a route in /requests.json is malformed, skipped",
                    target=target.address,
                    route=str(route)[:200],
                    error=str(exc)[:200],
                )
                continue
            if row is not None:
                row.update(
                    instance=instance,
                    route=_text(route, "route"),
                    service=labels.get("service", ""),
                    host=labels.get("host", target.host),
                )
                rows.append(row)
        self._requests_seen[target.address] = (series, current)
        return rows

    # Writing -------------------------------------------------------------------------------

    def _add_buckets(self, conn: sa.Connection, rows: list[dict]) -> None:
        add_request_rows(conn, rows)


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


def sketch_delta(current: Sketch, before: Sketch | None) -> Sketch:
    """What was added to ``current`` since ``before`` (an earlier read of the same sketch)."""
    if before is None:
        return current
    delta = Sketch(current.alpha, current.min_value, current.max_bins)
    for index, count in current.bins.items():
        added = count - before.bins.get(index, 0)
        if added > 0:
            delta.bins[index] = added
    delta.zero = max(0, current.zero - before.zero)
    delta.count = max(0, current.count - before.count)
    delta.sum = max(0.0, current.sum - before.sum)
    delta.max = (
        current.max
        if current.max > before.max
        else (delta.value_of(max(delta.bins)) if delta.bins else 0.0)
    )
    return delta


def _route_delta(part: dict, before: dict | None, host: str) -> dict | None:
    count = int(part["count"]) - (int(before["count"]) if before else 0)
    if count <= 0:
        return None
    sketches = {}
    for name in SKETCHES:
        current = Sketch.from_document(part[name])
        previous = Sketch.from_document(before[name]) if before else None
        sketches[name] = pack_sketch(sketch_delta(current, previous))
    slow = part.get("slow") or {"count": 0, "stacks": {}}
    slow_before = (before or {}).get("slow") or {"count": 0, "stacks": {}}
    stacks = {}
    for stack, weight in dict(slow["stacks"]).items():
        added = float(weight) - float(slow_before["stacks"].get(stack, 0))
        if added > 0:
            stacks[_text(stack, "stack")] = round(added, 2)
    seen_ids = {r["id"] for r in _slow_requests((before or {}).get("slowest"), host)}
    slowest = [r for r in _slow_requests(part.get("slowest"), host) if r["id"] not in seen_ids]
    return {
        "count": count,
        "errors": max(0, int(part.get("errors", 0)) - int((before or {}).get("errors", 0))),
        "sketches": json.dumps(sketches),
        "slow": json.dumps(
            {
                "count": max(0, int(slow["count"]) - int(slow_before["count"])),
                "stacks": stacks,
                "slowest": slowest[:5],
            }
        ),
    }


def _slow_requests(listed: Any, host: str) -> list[dict]:
    """The slowest requests of a route as /requests.json lists them, each rebuilt from the
    fields a row keeps, with the ``host`` it ran on; an entry that is not one is left out
    (the worker's document is input: a bad entry must cost itself, not the route's rows)."""
    kept = []
    for r in listed[:MAX_SLOWEST] if isinstance(listed, list) else []:
        if not isinstance(r, dict):
            continue
        ident, duration, start = r.get("id"), r.get("duration"), r.get("start")
        stacks, queue = r.get("stacks"), r.get("queue")
        if not (
            _whole(ident)
            and _seconds(duration)
            and _seconds(start)
            and (queue is None or _seconds(queue))
            and isinstance(stacks, dict)
        ):
            continue
        kept.append(
            {
                "id": ident,
                "start": float(start),
                "duration": float(duration),
                "queue": None if queue is None else float(queue),
                "thread": str(r.get("thread", ""))[:200],
                "status": r.get("status") if _whole(r.get("status")) else 0,
                "path": str(r.get("path", ""))[:2000],
                "host": host,  # where it ran, once merged with other instances' rows
                "stacks": {
                    stack: float(weight)
                    for stack, weight in list(stacks.items())[:MAX_SLOW_STACKS]
                    if isinstance(stack, str) and len(stack) <= 10_000 and _seconds(weight)
                },
            }
        )
    return kept


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _seconds(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _stall_row(stall: Any, instance: str, labels: dict[str, str]) -> dict:
    if not isinstance(stall, dict):
        raise BadDocument("a stall is not an object")
    stacks = stall.get("stacks") or {}
    wall = {_text(s, "stack"): int(c) for s, c in dict(stacks.get("wall") or {}).items()}
    cpu = {_text(s, "stack"): float(c) for s, c in dict(stacks.get("cpu") or {}).items()}
    duration, start = float(stall["duration"]), float(stall["start"])
    if not (0 <= duration < 86400 * 7 and 0 < start < 1e11):
        raise BadDocument(f"a stall of {duration!r} s at {start!r}")
    return {
        "id": event_id(instance, int(stall["id"])),
        "start": start,
        "duration": duration,
        "service": labels.get("service", ""),
        "host": labels.get("host", ""),
        "instance": instance,
        "kind": _text(stall["kind"], "kind")[:16],
        "thread": _text(stall.get("thread", "?"), "thread"),
        "what": _text(stall.get("what", ""), "what"),
        "stacks": json.dumps({"wall": wall, "cpu": cpu}),
    }


def _labels(document: dict) -> dict[str, str]:
    labels = document.get("labels") or {}
    if not isinstance(labels, dict):
        raise BadDocument("labels is not an object")
    return {str(k)[:200]: str(v)[:200] for k, v in labels.items()}


def _text(value: Any, what: str, limit: int = 10_000) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise BadDocument(f"{what} is not a string of at most {limit} characters")
    return value


def stall_stacks(rows: Iterable[Any]) -> dict[str, float]:
    """The folded stacks of stall rows merged: wall reads, or CPU samples where a stall has none."""
    merged: dict[str, float] = {}
    for row in rows:
        stacks = json.loads(row.stacks)
        for stack, weight in (stacks["wall"] or stacks["cpu"]).items():
            merged[stack] = merged.get(stack, 0) + weight
    return merged
